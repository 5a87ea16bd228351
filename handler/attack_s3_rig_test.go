package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
	"github.com/nexjob/nexjob-aws/replay"
)

// The rig of the attack_s3 tests: an Env with a blob bucket, every AWS
// request (DynamoDB, SQS through faults.Transport; S3 through s3Faults,
// which picks S3 requests by method and object key prefix, where
// faults.Rule picks by operation and body) under the test's control, a handler and a client both
// over it.

// s3Rule fails S3 requests of one method whose object key starts with
// prefix ("args/", "results/").
type s3Rule struct {
	method, prefix string
	fault          faults.Fault // LostReply, Throttle, Timeout, Pass (with after)
	times          int          // faults.Forever or a count (0: once)
	after          func()       // once the fault was injected

	fired int
}

// s3Faults is an http.RoundTripper over faults.Transport that injects
// faults into S3 object requests and counts them by method and key
// prefix.
type s3Faults struct {
	base http.RoundTripper

	mu    sync.Mutex
	rules []*s3Rule
	count map[string]int // "PUT args/" -> n
}

// s3Key is the object key of a path-style S3 request, or "".
func s3Key(req *http.Request) string {
	if req.Header.Get("X-Amz-Target") != "" {
		return ""
	}
	p := strings.TrimPrefix(req.URL.Path, "/")
	if !strings.HasPrefix(p, "nj-blobs-") {
		return ""
	}
	_, key, _ := strings.Cut(p, "/")
	return key
}

func (f *s3Faults) add(r *s3Rule) *s3Rule {
	if r.times == 0 {
		r.times = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
	return r
}

func (f *s3Faults) fired(r *s3Rule) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.fired
}

// n counts the requests of method on keys under prefix so far.
func (f *s3Faults) n(method, prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[method+" "+prefix]
}

func (f *s3Faults) RoundTrip(req *http.Request) (*http.Response, error) {
	key := s3Key(req)
	if key == "" {
		return f.base.RoundTrip(req)
	}
	prefix, _, _ := strings.Cut(key, "/")
	prefix += "/"
	f.mu.Lock()
	if f.count == nil {
		f.count = map[string]int{}
	}
	f.count[req.Method+" "+prefix]++
	var hit *s3Rule
	for _, r := range f.rules {
		if r.method == req.Method && strings.HasPrefix(key, r.prefix) && (r.times == faults.Forever || r.fired < r.times) {
			r.fired++
			hit = r
			break
		}
	}
	f.mu.Unlock()
	if hit == nil {
		return f.base.RoundTrip(req)
	}
	if hit.after != nil {
		defer hit.after()
	}
	if hit.fault == faults.Throttle {
		if req.Body != nil {
			_, _ = io.Copy(io.Discard, req.Body)
			_ = req.Body.Close()
		}
		return faults.S3Reply(req, http.StatusServiceUnavailable, "SlowDown", "injected: slow down"), nil
	}
	resp, err := f.base.RoundTrip(req)
	if err != nil || hit.fault == faults.Pass {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if hit.fault == faults.Timeout {
		return nil, &s3Timeout{}
	}
	return faults.S3Reply(req, http.StatusInternalServerError, "InternalError", "injected: the request was applied and its reply lost"), nil
}

type s3Timeout struct{}

func (*s3Timeout) Error() string   { return "injected: S3 request timed out after it was sent" }
func (*s3Timeout) Timeout() bool   { return true }
func (*s3Timeout) Temporary() bool { return true }

// s3Rig is one test's Env with a blob bucket, its fault transports, and
// a Client over them (e.Client is replaced by it).
type s3Rig struct {
	e  *nexjobtest.Env
	ft *faults.Transport
	sf *s3Faults
	s3 *s3.Client // the bucket, without faults
}

func newS3Rig(t *testing.T, bucket bool) *s3Rig {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: bucket})
	r := &s3Rig{e: e, ft: faults.New(nil), s3: provision.S3(e.Cfg)}
	r.sf = &s3Faults{base: r.ft}
	cfg := faults.Config(e.Cfg, r.ft)
	cfg.HTTPClient = &http.Client{Transport: r.sf}
	e.Cfg = cfg
	c, err := r.client(bucket)
	if err != nil {
		t.Fatal(err)
	}
	e.Client = c
	return r
}

// client is a Client over the rig's faults, with or without the bucket.
func (r *s3Rig) client(bucket bool) (*enqueue.Client, error) {
	lo := ledger.Options{StepsTable: r.e.StepsTable, Now: r.e.Now}
	if bucket {
		lo.BlobBucket = r.e.BlobBucket
	}
	return enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Ledger: lo, MaxDelay: nexjobtest.DefaultMaxDelay})
}

// handlerFor builds a handler over the rig's faults; bucket=false makes
// one as a deployment with no NEXJOB_BLOB_BUCKET would.
func (r *s3Rig) handlerFor(t *testing.T, reg *handler.Registry, bucket bool, o *handler.Options) *handler.Handler {
	t.Helper()
	var opts handler.Options
	if o != nil {
		opts = *o
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if bucket {
		return r.e.Handler(t, reg, &opts)
	}
	opts.Ledger = ledger.Options{StepsTable: r.e.StepsTable, Now: r.e.Now}
	if opts.Backoff == nil {
		opts.Backoff = handler.FloorBackoff
	}
	opts.DLQURL, opts.MaxDelay = r.e.DLQURL, nexjobtest.DefaultMaxDelay
	h, err := handler.New(r.e.Cfg, r.e.Table, r.e.QueueURL, reg, &opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// put writes body as the object key, past the rig's faults.
func (r *s3Rig) put(t *testing.T, key, body string) {
	t.Helper()
	if _, err := r.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(r.e.BlobBucket), Key: aws.String(key), Body: strings.NewReader(body)}); err != nil {
		t.Fatal(err)
	}
}

// del removes the object key, past the rig's faults.
func (r *s3Rig) del(t *testing.T, key string) {
	t.Helper()
	if _, err := r.s3.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(r.e.BlobBucket), Key: aws.String(key)}); err != nil {
		t.Fatal(err)
	}
}

// objects lists the bucket's keys under prefix.
func (r *s3Rig) objects(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := r.s3.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(r.e.BlobBucket), Prefix: aws.String(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

// Job kinds of the attack_s3 tests.

// s3aRes returns a result of Size bytes of JSON: a string of Fill
// repeated, its quotes included (Fill one ASCII letter, "r" by default).
type s3aRes struct {
	Size int    `json:"size"`
	Fill string `json:"fill,omitempty"`
	Pad  string `json:"pad,omitempty"` // args padding (large args)
}

func (s3aRes) Kind() string { return "s3a-res" }

// s3aArgs is a job with args of any size; its worker reports them.
type s3aArgs struct {
	Tag  string `json:"tag"`
	Text string `json:"text"`
}

func (s3aArgs) Kind() string { return "s3a-args" }

// s3aCaller invokes a child s3aRes with large args and awaits its
// large result.
type s3aCaller struct {
	Size int    `json:"size"`
	Pad  int    `json:"pad"`
	Fill string `json:"fill,omitempty"`
}

func (s3aCaller) Kind() string { return "s3a-caller" }

// s3aResultOf is what an s3aRes job returns: Size bytes of JSON.
func s3aResultOf(a s3aRes) string {
	f := a.Fill
	if f == "" {
		f = "r"
	}
	return strings.Repeat(f, a.Size-2)
}

// s3aArgsOfSize is s3aArgs whose JSON is exactly n bytes.
func s3aArgsOfSize(tag string, n int) s3aArgs {
	base := len(fmt.Sprintf(`{"tag":%q,"text":""}`, tag))
	return s3aArgs{Tag: tag, Text: strings.Repeat("a", n-base)}
}

// s3aSeen records what the s3aArgs worker got, by tag.
type s3aSeen struct {
	mu   sync.Mutex
	runs map[string][]int // tag -> len(Text) of each run
}

func (s *s3aSeen) add(tag string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[string][]int{}
	}
	s.runs[tag] = append(s.runs[tag], n)
}

func (s *s3aSeen) of(tag string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.runs[tag]...)
}

// s3aRegistry registers the three kinds: s3aRes returns s3aResultOf (or
// what res returns when set), s3aArgs records its args in sn, s3aCaller
// invokes an s3aRes child and stores what it got in got.
func s3aRegistry(sn *s3aSeen, res func(j *handler.Job[s3aRes]) (string, error), got *sync.Map, o *handler.KindOptions) *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[s3aRes, string](func(_ context.Context, j *handler.Job[s3aRes]) (string, error) {
		if res != nil {
			return res(j)
		}
		return s3aResultOf(j.Args), nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[s3aArgs](func(_ context.Context, j *handler.Job[s3aArgs]) error {
		if sn != nil {
			sn.add(j.Args.Tag, len(j.Args.Text))
		}
		return nil
	}), o)
	handler.AddWorker(reg, handler.WorkFunc[s3aCaller](func(ctx context.Context, j *handler.Job[s3aCaller]) error {
		v, err := handler.Invoke[string](ctx, "child", s3aRes{Size: j.Args.Size, Fill: j.Args.Fill, Pad: strings.Repeat("p", j.Args.Pad)}, nil)
		if err != nil {
			return err
		}
		if got != nil {
			got.Store(j.ID, v)
		}
		return nil
	}), nil)
	return reg
}

var _ = time.Second

// mustJSON is v's JSON, as enqueue encodes args.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readExport is replay.Read over the rig's client (Env.Export, without
// failing the test).
func readExport(ctx context.Context, r *s3Rig, kind string) (replay.Export, error) {
	return replay.Read(ctx, r.e.Client.Store(), kind, nil)
}
