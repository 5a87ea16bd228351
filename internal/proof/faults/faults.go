// Package faults injects AWS failures under a real SDK client. Transport is
// an http.RoundTripper that a test puts under an aws.Config, so the SDK's
// own serialisation, signing and retryer run exactly as in production, and
// every request that is let through reaches the real backend (the default
// emulator, LocalStack or AWS).
//
// Three faults model what real AWS does and emulators never do:
//
//   - LostReply: the request is forwarded and applied, then the reply is
//     replaced by 500 InternalServerError. The SDK's retryer resends it,
//     so a conditional write meets its own earlier write.
//   - Throttle: 400 ProvisionedThroughputExceededException (SQS:
//     RequestThrottled; S3: 503 SlowDown) without forwarding. Injected more
//     times than the retryer's attempts, it outlasts the SDK's retries.
//   - Timeout: the request is forwarded and applied, then the client sees a
//     network timeout instead of the reply.
//
// A Pass rule with Before forwards the request untouched after its hook:
// a request held in flight until the test lets it go lands after
// whatever the test did meanwhile (a slow DeleteSchedule).
//
// Rules pick requests by operation ("DynamoDB.PutItem", "SQS.SendMessage",
// "S3.PutObject") and optionally by their body, skip the first N matches and fire a given
// number of times. Tests synchronise on Fired, never on time.
package faults

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

// Fault is what a rule does to a request it matches.
type Fault int

const (
	// LostReply forwards the request, then answers 500 InternalServerError.
	LostReply Fault = iota + 1
	// Throttle answers 400 with the service's throttling error; the request
	// is not forwarded.
	Throttle
	// Timeout forwards the request, then fails with a network timeout.
	Timeout
	// Reject answers 400 with Rule.Reply as the error body, not forwarded:
	// for errors the other faults do not model (a TransactionConflict).
	Reject
	// Pass forwards the request and returns the backend's reply: no fault,
	// only Rule.After, to act between two calls (e.g. end the caller's
	// context once its write was applied).
	Pass
)

func (f Fault) String() string {
	switch f {
	case LostReply:
		return "lost reply"
	case Throttle:
		return "throttle"
	case Timeout:
		return "timeout"
	case Reject:
		return "reject"
	case Pass:
		return "pass"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// Forever as Rule.Times: the rule never runs out.
const Forever = -1

// Rule says which requests fail and how.
type Rule struct {
	// Op is the operation as "Service.Operation" (DynamoDB.UpdateItem,
	// SQS.SendMessage). Required.
	Op string
	// Match, if set, narrows the rule to requests whose JSON body it
	// accepts (e.g. bytes.Contains for an attribute value).
	Match func(body []byte) bool
	// Skip lets this many matching requests through before the rule fires.
	Skip int
	// Times is how often the rule fires: 0 means once; Forever, always.
	Times int
	// Fault is what happens to a matched request. Required.
	Fault Fault
	// Reply is the JSON error body of a Reject.
	Reply string
	// After runs once the fault has been injected on a request (the
	// request, if forwarded, has been applied), before the SDK sees the
	// reply: e.g. cancel the caller's context.
	After func()
	// Before runs when a request matches, before it is forwarded (or
	// answered by the fault), with the request and its body: a test
	// records what was asked (a Scheduler name is in the path), or holds
	// a request in flight until something else happened (a slow request,
	// applied late), by blocking on a channel.
	Before func(req *http.Request, body []byte)
}

type rule struct {
	Rule
	seen, fired int
	done        chan struct{} // closed when fired reaches Times
}

// Transport is the fault-injecting http.RoundTripper.
type Transport struct {
	// Nemesis, when set (before the first request), is asked about every
	// request no rule matched, one request at a time in the order they
	// come: the fault to inject, or 0 for none. A seeded random nemesis
	// makes the same choices for the same sequence of requests.
	Nemesis func(op string) Fault

	base  http.RoundTripper
	mu    sync.Mutex
	rules []*rule
	ops   []string
}

// New returns a Transport forwarding to base (nil: a clone of
// http.DefaultTransport).
func New(base http.RoundTripper) *Transport {
	if base == nil {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &Transport{base: base}
}

// Handle identifies an added rule.
type Handle struct {
	t *Transport
	r *rule
}

// Add installs a rule; rules are tried in the order added, the first that
// matches a request decides.
func (t *Transport) Add(r Rule) Handle {
	if r.Op == "" || r.Fault == 0 {
		panic("faults: a Rule needs Op and Fault")
	}
	if r.Times == 0 {
		r.Times = 1
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rr := &rule{Rule: r, done: make(chan struct{})}
	t.rules = append(t.rules, rr)
	return Handle{t: t, r: rr}
}

// Fired returns how often the rule has fired.
func (h Handle) Fired() int {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	return h.r.fired
}

// Done is closed once the rule has fired Times times (never for Forever).
func (h Handle) Done() <-chan struct{} { return h.r.done }

// Remove stops the rule from firing again.
func (h Handle) Remove() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	for i, r := range h.t.rules {
		if r == h.r {
			h.t.rules = append(h.t.rules[:i], h.t.rules[i+1:]...)
			return
		}
	}
}

// Ops returns every operation sent through the transport, in order, one per
// HTTP attempt (retries included), as "Service.Operation".
func (t *Transport) Ops() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.ops...)
}

// Operation names the request as "Service.Operation" from its X-Amz-Target
// header (the JSON protocols of DynamoDB, SQS, SSM and EventBridge), or for EventBridge
// Scheduler's REST protocol from its method and path
// ("Scheduler.CreateSchedule"), or for S3's, signed for the service "s3",
// from its method, path and query (path-style, as the emulators are
// addressed: "S3.PutObject", "S3.GetObject", "S3.ListObjectsV2").
func Operation(req *http.Request) string {
	target := req.Header.Get("X-Amz-Target")
	svc, op, ok := strings.Cut(target, ".")
	if !ok && isS3(req) {
		return "S3." + s3Operation(req)
	}
	if !ok {
		p := strings.Trim(req.URL.Path, "/")
		if p == "schedules" && req.Method == http.MethodGet {
			return "Scheduler.ListSchedules"
		}
		if strings.HasPrefix(p, "schedules/") {
			if a, ok := map[string]string{http.MethodGet: "GetSchedule", http.MethodPost: "CreateSchedule", http.MethodPut: "UpdateSchedule", http.MethodDelete: "DeleteSchedule"}[req.Method]; ok {
				return "Scheduler." + a
			}
		}
		return target
	}
	switch {
	case strings.HasPrefix(svc, "DynamoDBStreams"):
		svc = "DynamoDBStreams"
	case strings.HasPrefix(svc, "DynamoDB"):
		svc = "DynamoDB"
	case svc == "AmazonSQS":
		svc = "SQS"
	case svc == "AmazonSSM":
		svc = "SSM"
	case svc == "AWSEvents":
		svc = "EventBridge"
	}
	return svc + "." + op
}

// isS3 reports whether req is signed for S3 (SigV4's credential scope
// ".../s3/aws4_request").
func isS3(req *http.Request) bool {
	return strings.Contains(req.Header.Get("Authorization"), "/s3/aws4_request")
}

// s3Operation names a path-style S3 request: an object's by its method,
// a bucket's by its method and sub-resource.
func s3Operation(req *http.Request) string {
	_, key, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
	q := req.URL.Query()
	if key != "" {
		if req.Method == http.MethodPut && req.Header.Get("X-Amz-Copy-Source") != "" {
			return "CopyObject"
		}
		if a, ok := map[string]string{http.MethodPut: "PutObject", http.MethodGet: "GetObject", http.MethodHead: "HeadObject", http.MethodDelete: "DeleteObject"}[req.Method]; ok {
			return a
		}
		return req.Method + "Object"
	}
	switch {
	case q.Has("list-type") && req.Method == http.MethodGet:
		return "ListObjectsV2"
	case q.Has("delete") && req.Method == http.MethodPost:
		return "DeleteObjects"
	case q.Has("lifecycle"):
		return map[string]string{http.MethodPut: "PutBucketLifecycleConfiguration", http.MethodGet: "GetBucketLifecycleConfiguration", http.MethodDelete: "DeleteBucketLifecycle"}[req.Method]
	case len(q) == 0:
		if a, ok := map[string]string{http.MethodPut: "CreateBucket", http.MethodHead: "HeadBucket", http.MethodDelete: "DeleteBucket", http.MethodGet: "ListObjects"}[req.Method]; ok {
			return a
		}
	}
	return req.Method + "Bucket"
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	op := Operation(req)
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	r := t.pick(op, body)
	if r == nil {
		return t.base.RoundTrip(req)
	}
	if r.Before != nil {
		r.Before(req, body)
	}
	defer func() {
		if r.After != nil {
			r.After()
		}
	}()
	switch {
	case r.Fault == Throttle && strings.HasPrefix(op, "S3."):
		return S3Reply(req, http.StatusServiceUnavailable, "SlowDown", "injected: slow down"), nil
	case r.Fault == Throttle:
		return reply(req, 400, errorBody(throttleCode(op), "injected: throttled")), nil
	case r.Fault == Reject:
		return reply(req, 400, []byte(r.Reply)), nil
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil || r.Fault == Pass {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if r.Fault == Timeout {
		return nil, &timeoutError{op: op}
	}
	if strings.HasPrefix(op, "S3.") {
		return S3Reply(req, http.StatusInternalServerError, "InternalError", "injected: the request was applied and its reply lost"), nil
	}
	return reply(req, 500, errorBody(internalCode(op), "injected: the request was applied and its reply lost")), nil
}

func (t *Transport) pick(op string, body []byte) *rule {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ops = append(t.ops, op)
	for _, r := range t.rules {
		if r.Op != op || (r.Match != nil && !r.Match(body)) {
			continue
		}
		if r.Times != Forever && r.fired >= r.Times {
			continue
		}
		r.seen++
		if r.seen <= r.Skip {
			return nil
		}
		r.fired++
		if r.fired == r.Times {
			close(r.done)
		}
		return r
	}
	if t.Nemesis != nil {
		if f := t.Nemesis(op); f != 0 {
			return &rule{Rule: Rule{Op: op, Fault: f}}
		}
	}
	return nil
}

func throttleCode(op string) string {
	if strings.HasPrefix(op, "SQS.") {
		return "com.amazonaws.sqs#RequestThrottled"
	}
	if strings.HasPrefix(op, "Scheduler.") || strings.HasPrefix(op, "SSM.") || strings.HasPrefix(op, "EventBridge.") {
		return "ThrottlingException"
	}
	return "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
}

func internalCode(op string) string {
	if strings.HasPrefix(op, "SQS.") {
		return "com.amazonaws.sqs#InternalError"
	}
	if strings.HasPrefix(op, "Scheduler.") {
		return "InternalServerException"
	}
	if strings.HasPrefix(op, "SSM.") {
		return "InternalServerError"
	}
	return "com.amazonaws.dynamodb.v20120810#InternalServerError"
}

func errorBody(code, msg string) []byte {
	return fmt.Appendf(nil, `{"__type":%q,"message":%q}`, code, msg)
}

// TransactionConflict is the body DynamoDB answers when a transaction's
// item is in another transaction: a Reject's Reply.
const TransactionConflict = `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException",` +
	`"message":"Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict]",` +
	`"CancellationReasons":[{"Code":"None"},{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"}]}`

func reply(req *http.Request, status int, b []byte) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/x-amz-json-1.0")
	if req.Header.Get("X-Amz-Target") == "" { // a REST protocol (Scheduler) reads the code from a header
		var e struct {
			Type string `json:"__type"`
		}
		if json.Unmarshal(b, &e) == nil && e.Type != "" {
			h.Set("X-Amzn-Errortype", e.Type)
		}
		h.Set("Content-Type", "application/json")
	}
	h.Set("X-Amzn-Requestid", "injected")
	return response(req, status, h, b)
}

// S3Reply is an S3 error reply (REST-XML: the code in the body's
// <Error>), as S3 answers a throttle (503 SlowDown) or its own failure
// (500 InternalError).
func S3Reply(req *http.Request, status int, code, msg string) *http.Response {
	b := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message><RequestId>injected</RequestId></Error>`, code, msg)
	h := http.Header{}
	h.Set("Content-Type", "application/xml")
	h.Set("X-Amz-Request-Id", "injected")
	return response(req, status, h, b)
}

// response is an injected reply to req: status, header h, body b.
func response(req *http.Request, status int, h http.Header, b []byte) *http.Response {
	return &http.Response{
		Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)), Request: req,
	}
}

type timeoutError struct{ op string }

func (e *timeoutError) Error() string   { return "injected: " + e.op + " timed out after it was sent" }
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }

// Attempts is the SDK retryer's budget in Config: DynamoDB's own default
// (the SDK gives DynamoDB 4 attempts). A rule that fires Attempts times in
// a row outlasts the SDK's retries for one call.
const Attempts = 4

// Config returns cfg with its HTTP client replaced by one over t, and the
// SDK's standard retryer with Attempts attempts, a millisecond backoff
// (throttles otherwise wait a second each) and no retry quota (tests
// inject far more failures than a real client would see). Clients built
// from it afterwards go through t.
func Config(cfg aws.Config, t *Transport) aws.Config {
	cfg = cfg.Copy()
	cfg.HTTPClient = &http.Client{Transport: t}
	cfg.Retryer = func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = Attempts
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Millisecond, nil })
			o.RateLimiter = ratelimit.None
		})
	}
	cfg.RetryMaxAttempts = Attempts
	return cfg
}
