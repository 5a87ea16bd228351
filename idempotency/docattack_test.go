//go:build docattack

// The attack on this package's promises written from the docs alone (issue
// 38's last Done-when item), kept to replay: go test -tags docattack. Not
// in make test: a few of its tests wait on short sleeps to let calls race,
// and those that still fail are breaks left open, each named in the
// closing note of 2026-12-06 (a producer's clock two hours ahead refused
// as too late; a replayed result holding a json.Number or invalid UTF-8).

package idempotency_test

// Attacks on the promises of docs/idempotency.md and the package doc,
// written from the docs alone; each assertion quotes its promise.
// Run: ./localstack/with-emulator.sh go test -tags docattack -count=1 -run TestDocAttack ./idempotency/

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

var daQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func daStore(t *testing.T, e *nexjobtest.Env, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	if o == nil {
		o = &idempotency.Options{}
	}
	if o.Logger == nil {
		o.Logger = daQuiet
	}
	if o.Function == "" {
		o.Function = "docattack"
	}
	s, err := idempotency.New(e.Cfg, e.Table, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func daPolicy(p ledger.DuplicatePolicy) *ledger.DuplicatePolicy { return &p }

// Promise: "Numbers are exact. A JSON integer is kept as its digits,
// however large ... a repeat whose large id changed is a payload mismatch";
// CallOptions.Payload: "The JSON is taken with its objects' keys sorted
// (raw JSON's too ...) and its integers exact: the same fields in another
// order are the same payload."
func TestDocAttackLargeIntegersInDoPayloads(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	b1, _ := new(big.Int).SetString("123456789012345678901234567890", 10)
	b2, _ := new(big.Int).SetString("123456789012345678901234567891", 10)
	type withU struct {
		B  string `json:"b"`
		ID uint64 `json:"id"`
	}
	cases := []struct {
		name        string
		first, same any // same: the first payload in another form/order
		other       any // differs only in a large integer's last digit
	}{
		{"raw JSON", json.RawMessage(`{"id":12345678901234567888,"b":"x"}`), json.RawMessage(`{"b":"x","id":12345678901234567888}`), json.RawMessage(`{"id":12345678901234567889,"b":"x"}`)},
		{"raw JSON nested in an array", json.RawMessage(`[{"z":[12345678901234567888],"a":1}]`), json.RawMessage(`[{"a":1,"z":[12345678901234567888]}]`), json.RawMessage(`[{"z":[12345678901234567889],"a":1}]`)},
		{"uint64 in a struct and a map", withU{"x", 12345678901234567888}, map[string]any{"id": uint64(12345678901234567888), "b": "x"}, withU{"x", 12345678901234567889}},
		{"json.Number", map[string]any{"id": json.Number("12345678901234567888")}, json.RawMessage(`{"id":12345678901234567888}`), map[string]any{"id": json.Number("12345678901234567889")}},
		{"big.Int", map[string]any{"id": b1}, json.RawMessage(`{"id":123456789012345678901234567890}`), map[string]any{"id": b2}},
		{"negative int64", map[string]any{"id": int64(math.MinInt64)}, json.RawMessage(`{"id":-9223372036854775808}`), map[string]any{"id": int64(math.MinInt64 + 1)}},
		{"raw JSON in a struct field", struct {
			P json.RawMessage `json:"p"`
		}{json.RawMessage(`{"b":2,"a":12345678901234567888}`)}, map[string]any{"p": json.RawMessage(`{"a":12345678901234567888,"b":2}`)}, struct {
			P json.RawMessage `json:"p"`
		}{json.RawMessage(`{"b":2,"a":12345678901234567889}`)}},
	}
	for i, c := range cases {
		key := fmt.Sprint("large-", i)
		var runs atomic.Int32
		fn := func(context.Context) (int, error) { return int(runs.Add(1)), nil }
		if _, err := idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: c.first}); err != nil {
			t.Errorf("%s: first call: %v", c.name, err)
			continue
		}
		res, err := idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: c.same})
		if err != nil || !res.Replayed {
			t.Errorf("%s: the same payload in another form or order: %v, replayed %v; want replayed", c.name, err, res.Replayed)
		}
		_, err = idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: c.other})
		if !errors.Is(err, idempotency.ErrPayloadMismatch) {
			t.Errorf("%s: a payload differing in a large integer's last digit: %v; want a *PayloadMismatchError", c.name, err)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("%s: the function ran %d times", c.name, n)
		}
	}
}

// Probe, not a documented promise: raw JSON payloads that are the same
// JSON value written otherwise (white space, an escaped key, 1.0 vs 1).
// Powertools (json.loads, then json.dumps with sort_keys) makes the first
// two the same payload.
func TestDocAttackProbeRawJSONSpellings(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	pairs := [][2]string{
		{`{"a":1,"b":"x"}`, "{ \"b\" : \"x\",\n \"a\" : 1 }"},
		{`{"a":1}`, `{"\u0061":1}`},
		{`{"a":"é"}`, `{"a":"\u00e9"}`},
		{`{"a":1}`, `{"a":1.0}`},
	}
	for i, p := range pairs {
		key := fmt.Sprint("spell-", i)
		fn := func(context.Context) (int, error) { return 1, nil }
		if _, err := idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: json.RawMessage(p[0])}); err != nil {
			t.Fatal(err)
		}
		res, err := idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: json.RawMessage(p[1])})
		t.Logf("%s then %q: replayed %v, err %v", p[0], p[1], res.Replayed, err)
	}
}

type daResp = events.LambdaFunctionURLResponse

// daHeaderCase runs one event type through Handler: the first event sends
// the key header in one case, the second in another, and the expression
// names it in a third. "Header names are case-insensitive. In an HTTP event
// of aws-lambda-go (API Gateway REST v1 and WebSocket, HTTP APIs v2, ALB,
// function URLs, authorizer requests) the header names in headers and
// multiValueHeaders, and the names an expression looks up in them, are
// lowered before the search".
func daHeaderCase[E any](t *testing.T, s *idempotency.Store, name, keyPath string, mk func(hdr, val string) E) {
	t.Helper()
	var runs atomic.Int32
	h, err := idempotency.Handler(s, func(ctx context.Context, ev E) (daResp, error) {
		return daResp{StatusCode: 200 + int(runs.Add(1))}, nil
	}, &idempotency.HandlerOptions[E, daResp]{KeyPath: keyPath})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	ctx := context.Background()
	val := "key-" + name
	for _, hdr := range []string{"idempotency-key", "IDEMPOTENCY-KEY", "Idempotency-Key", "iDeMpOtEnCy-KeY"} {
		r, err := h(ctx, mk(hdr, val))
		if err != nil || r.StatusCode != 201 {
			t.Errorf("%s: header sent as %q, expression %s: status %d, %v; want the first response (201)", name, hdr, keyPath, r.StatusCode, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%s: ran %d times", name, n)
	}
}

func TestDocAttackHeaderNamesAreCaseInsensitive(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	one := func(h, v string) map[string]string { return map[string]string{h: v, "Content-Type": "x"} }
	multi := func(h, v string) map[string][]string { return map[string][]string{h: {v}} }
	kp := `headers."Idempotency-Key"`
	daHeaderCase(t, s, "v1", kp, func(h, v string) events.APIGatewayProxyRequest {
		return events.APIGatewayProxyRequest{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "v1-multi", `multiValueHeaders."IDEMPOTENCY-key"[0]`, func(h, v string) events.APIGatewayProxyRequest {
		return events.APIGatewayProxyRequest{MultiValueHeaders: multi(h, v)}
	})
	daHeaderCase(t, s, "v2", kp, func(h, v string) events.APIGatewayV2HTTPRequest {
		return events.APIGatewayV2HTTPRequest{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "websocket", kp, func(h, v string) events.APIGatewayWebsocketProxyRequest {
		return events.APIGatewayWebsocketProxyRequest{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "websocket-multi", `multiValueHeaders."Idempotency-KEY"[0]`, func(h, v string) events.APIGatewayWebsocketProxyRequest {
		return events.APIGatewayWebsocketProxyRequest{MultiValueHeaders: multi(h, v)}
	})
	daHeaderCase(t, s, "alb", kp, func(h, v string) events.ALBTargetGroupRequest {
		return events.ALBTargetGroupRequest{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "alb-multi", `multiValueHeaders."idempotency-KEY"[0]`, func(h, v string) events.ALBTargetGroupRequest {
		return events.ALBTargetGroupRequest{MultiValueHeaders: multi(h, v)}
	})
	daHeaderCase(t, s, "function-url", kp, func(h, v string) events.LambdaFunctionURLRequest {
		return events.LambdaFunctionURLRequest{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "authorizer-request", kp, func(h, v string) events.APIGatewayCustomAuthorizerRequestTypeRequest {
		return events.APIGatewayCustomAuthorizerRequestTypeRequest{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "authorizer-v2", kp, func(h, v string) events.APIGatewayV2CustomAuthorizerV2Request {
		return events.APIGatewayV2CustomAuthorizerV2Request{Headers: one(h, v)}
	})
	daHeaderCase(t, s, "authorizer-v1", kp, func(h, v string) events.APIGatewayV2CustomAuthorizerV1Request {
		return events.APIGatewayV2CustomAuthorizerV1Request{Headers: one(h, v)}
	})
	// Pointer events (a handler taking *events.X) are HTTP events of aws-lambda-go too.
	daHeaderCase(t, s, "function-url-pointer", kp, func(h, v string) *events.LambdaFunctionURLRequest {
		return &events.LambdaFunctionURLRequest{Headers: one(h, v)}
	})
}

// Promise: "a retry answered with the first response" for an event whose
// key is found by an expression. An event carrying the key header twice,
// in two cases with two values (a proxy that adds its own), is one event:
// its key must not change from one delivery to the next.
func TestDocAttackOneEventOneKeyWithTwoSpellingsOfTheHeader(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	var runs atomic.Int32
	h, err := idempotency.Handler(s, func(ctx context.Context, ev events.LambdaFunctionURLRequest) (daResp, error) {
		return daResp{StatusCode: 200 + int(runs.Add(1))}, nil
	}, &idempotency.HandlerOptions[events.LambdaFunctionURLRequest, daResp]{KeyPath: `headers."idempotency-key"`})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		ev := events.LambdaFunctionURLRequest{Headers: map[string]string{"Idempotency-Key": "a", "idempotency-key": "b"}}
		if _, err := h(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("one event delivered 40 times ran %d times: its key changed between deliveries", n)
	}
}

// Promise: "A string found is the key as it is (the same key Do takes as
// that string); any other value is keyed by its JSON, apart from every
// string: the string "1" and the number 1 are two keys ... Nothing found
// (null, "", [], {}, a list of nulls) is no key: ErrNoKey, nothing runs."
// "order 12345678901234567888 and order 12345678901234567889 (one float64
// for both) are two keys"; "a key found as an object is one key in any order".
func TestDocAttackKeysFromEvents(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	var runs atomic.Int32
	h, err := idempotency.Handler(s, func(ctx context.Context, ev events.LambdaFunctionURLRequest) (daResp, error) {
		return daResp{StatusCode: 200 + int(runs.Add(1)), Body: ev.Body}, nil
	}, &idempotency.HandlerOptions[events.LambdaFunctionURLRequest, daResp]{KeyPath: `powertools_json(body).id`})
	if err != nil {
		t.Fatal(err)
	}
	call := func(body string) (daResp, error) {
		return h(ctx, events.LambdaFunctionURLRequest{Body: body})
	}
	// Distinct keys: each first call runs.
	distinct := []string{
		`{"id":1}`, `{"id":"1"}`,
		`{"id":12345678901234567888}`, `{"id":12345678901234567889}`, `{"id":"12345678901234567888"}`,
		`{"id":-12345678901234567888}`,
		`{"id":0}`, `{"id":false}`, `{"id":[1]}`, `{"id":{"b":1,"a":2}}`, `{"id":"{\"a\":2,\"b\":1}"}`,
	}
	for _, b := range distinct {
		before := runs.Load()
		if _, err := call(b); err != nil || runs.Load() != before+1 {
			t.Errorf("body %s: %v, ran %v; want a new key that runs", b, err, runs.Load() != before)
		}
	}
	// Repeats: none runs.
	repeats := []string{`{"id":1}`, `{"id":12345678901234567889, "x":1}`, `{"x":2,"id":"1"}`, `{"id":{"a":2,"b":1}}`}
	for _, b := range repeats {
		before := runs.Load()
		if _, err := call(b); err != nil || runs.Load() != before {
			t.Errorf("body %s: %v, ran %v; want the recorded response", b, err, runs.Load() != before)
		}
	}
	for _, b := range []string{`{"id":null}`, `{"id":""}`, `{"id":[]}`, `{"id":{}}`, `{"id":[null,null]}`, `{}`} {
		before := runs.Load()
		if _, err := call(b); !errors.Is(err, idempotency.ErrNoKey) || runs.Load() != before {
			t.Errorf("body %s: %v; want ErrNoKey, nothing run", b, err)
		}
	}
	// The string found is the key Do takes as that string.
	if _, err := call(`{"id":"shared-key"}`); err != nil {
		t.Fatal(err)
	}
	res, err := idempotency.Do(ctx, s, "shared-key", func(context.Context) (daResp, error) {
		return daResp{StatusCode: 999}, nil
	}, nil)
	if err != nil || !res.Replayed || res.Value.StatusCode == 999 {
		t.Errorf("Do with the string a KeyPath found: %v, replayed %v, status %d; want the handler's recorded response", err, res.Replayed, res.Value.StatusCode)
	}
}

// Promise: "a repeat whose large id changed is a payload mismatch"
// (PayloadPath over the body, the example's `powertools_json(body).[amount,
// currency, card]`), and key order does not matter.
func TestDocAttackPayloadPathLargeIntegers(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	var runs atomic.Int32
	h, err := idempotency.Handler(s, func(ctx context.Context, ev events.LambdaFunctionURLRequest) (daResp, error) {
		return daResp{StatusCode: 200 + int(runs.Add(1))}, nil
	}, &idempotency.HandlerOptions[events.LambdaFunctionURLRequest, daResp]{
		KeyPath:     `headers."Idempotency-Key"`,
		PayloadPath: `powertools_json(body).[amount, currency, card]`,
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(body string) events.LambdaFunctionURLRequest {
		return events.LambdaFunctionURLRequest{Headers: map[string]string{"idempotency-key": "pay-1"}, Body: body}
	}
	ctx := context.Background()
	if _, err := h(ctx, ev(`{"amount":12345678901234567888,"currency":"EUR","card":{"n":"4242","exp":1}}`)); err != nil {
		t.Fatal(err)
	}
	if r, err := h(ctx, ev(`{"card":{"exp":1,"n":"4242"},"note":"ignored","currency":"EUR","amount":12345678901234567888}`)); err != nil || r.StatusCode != 201 {
		t.Errorf("the same fields reordered: %d, %v; want the first response", r.StatusCode, err)
	}
	for _, b := range []string{
		`{"amount":12345678901234567889,"currency":"EUR","card":{"n":"4242","exp":1}}`,
		`{"amount":-12345678901234567888,"currency":"EUR","card":{"n":"4242","exp":1}}`,
		`{"amount":12345678901234567888,"currency":"EUR","card":{"n":"4242","exp":2}}`,
		`{"amount":"12345678901234567888","currency":"EUR","card":{"n":"4242","exp":1}}`,
	} {
		if _, err := h(ctx, ev(b)); !errors.Is(err, idempotency.ErrPayloadMismatch) {
			t.Errorf("body %s: %v; want a payload mismatch", b, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("ran %d times", n)
	}
}

// Promise: the table of "What a repeat gets" and "an outcome the policy
// lets a new call replace is replaced whatever the new call's payload"; a
// repeat whose payload differs "gets a *PayloadMismatchError while ... its
// outcome answers repeats".
func TestDocAttackPolicyTable(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	boom := errors.New("boom")
	type outcome int
	const (
		result outcome = iota
		failed
		failedRecorded
	)
	want := map[ledger.DuplicatePolicy]map[outcome]string{
		ledger.AllowAfterFailed: {result: "runs", failed: "runs", failedRecorded: "runs"},
		ledger.RejectIfFailed:   {result: "runs", failed: "runs", failedRecorded: "duplicate"},
		ledger.RejectAlways:     {result: "replayed", failed: "runs", failedRecorded: "duplicate"},
	}
	for p, row := range want {
		for o, w := range row {
			s := daStore(t, e, &idempotency.Options{Policy: daPolicy(p), RecordErrors: o == failedRecorded})
			key := fmt.Sprintf("policy-%v-%d", p, o)
			var runs atomic.Int32
			fn := func(context.Context) (int, error) {
				n := int(runs.Add(1))
				if o != result && n == 1 {
					return 0, boom
				}
				return n, nil
			}
			idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: "A"})
			res, err := idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: "A"})
			got := "runs"
			var de *idempotency.DuplicateError
			switch {
			case errors.As(err, &de):
				got = "duplicate"
			case err != nil:
				got = "error " + err.Error()
			case res.Replayed:
				got = "replayed"
			}
			if got != w || (w == "runs" && runs.Load() != 2) {
				t.Errorf("policy %v, first call %d: the repeat %s (ran %d times); want %s", p, o, got, runs.Load(), w)
			}
			// Another payload: refused while the outcome answers repeats,
			// else the outcome is replaced.
			_, err = idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: "B"})
			// After the repeat, the record is a result when it ran (a
			// result) under RejectAlways, it answers repeats.
			if w == "runs" && p != ledger.RejectAlways {
				if err != nil {
					t.Errorf("policy %v, first call %d: a new call with another payload: %v; want it to run", p, o, err)
				}
			} else if !errors.Is(err, idempotency.ErrPayloadMismatch) {
				t.Errorf("policy %v, first call %d: another payload against an outcome that answers repeats: %v; want a *PayloadMismatchError", p, o, err)
			}
		}
	}
}

// Promise: "Store ... is safe for concurrent use"; the soak's "An
// idempotent call's function runs once per key while its recorded result
// lives (RejectAlways), never beside another run of the key ...; every
// repeat returns the value a run of the key recorded"; "with Options.Wait
// [a repeat] waits for the outcome".
func TestDocAttackConcurrentCalls(t *testing.T) {
	e := nexjobtest.New(t, nil)
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprint("wait=", wait), func(t *testing.T) {
			stores := []*idempotency.Store{daStore(t, e, &idempotency.Options{Wait: wait}), daStore(t, e, &idempotency.Options{Wait: wait})}
			key := fmt.Sprint("conc-", wait)
			var runs, inside atomic.Int32
			var overlap atomic.Bool
			gate := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			vals := map[int]int{}
			inProgress := 0
			for i := 0; i < 16; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					<-gate
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					res, err := idempotency.Do(ctx, stores[i%2], key, func(context.Context) (int, error) {
						if inside.Add(1) > 1 {
							overlap.Store(true)
						}
						defer inside.Add(-1)
						time.Sleep(300 * time.Millisecond)
						return 1000 + int(runs.Add(1)), nil
					}, &idempotency.CallOptions{Payload: map[string]any{"n": uint64(12345678901234567888), "a": "x"}})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case errors.Is(err, idempotency.ErrInProgress) && !wait:
						inProgress++
					case err != nil:
						t.Errorf("call %d: %v", i, err)
					default:
						vals[res.Value]++
					}
				}(i)
			}
			close(gate)
			wg.Wait()
			if runs.Load() != 1 || overlap.Load() {
				t.Errorf("the function ran %d times (overlap %v); want once", runs.Load(), overlap.Load())
			}
			for v := range vals {
				if v != 1001 {
					t.Errorf("a call returned %d; want 1001", v)
				}
			}
			if wait && inProgress != 0 {
				t.Errorf("%d calls were told in progress under Wait", inProgress)
			}
		})
	}
}

// Promise: "every write (the hold, the result, the release) under a lost
// reply, a timeout and a throttle": "a first call whose hold was applied
// runs once, a result recorded is not recorded twice, a release is done. A
// hold that DynamoDB refused or throttled past the SDK's retries returns the
// error and the function has not run. A result that cannot be recorded
// (throttled past the retries) is returned with a *NotRecordedError: the
// function ran; its key stays held until the hold ends".
func TestDocAttackWritesUnderFaults(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	cases := []struct {
		op    string
		fault faults.Fault
		fail  bool // the function fails (a release)
	}{
		{"DynamoDB.PutItem", faults.LostReply, false},
		{"DynamoDB.PutItem", faults.Timeout, false},
		{"DynamoDB.PutItem", faults.Throttle, false},
		{"DynamoDB.UpdateItem", faults.LostReply, false},
		{"DynamoDB.UpdateItem", faults.Timeout, false},
		{"DynamoDB.UpdateItem", faults.Throttle, false},
		{"DynamoDB.DeleteItem", faults.LostReply, true},
		{"DynamoDB.DeleteItem", faults.Timeout, true},
	}
	for i, c := range cases {
		name := fmt.Sprintf("%s %v fail=%v", c.op, c.fault, c.fail)
		ft := faults.New(nil)
		s := daStore(t, e, &idempotency.Options{DynamoDB: dynamodb.NewFromConfig(faults.Config(e.Cfg, ft))})
		plain := daStore(t, e, nil)
		times := 0
		if c.fault == faults.Throttle {
			times = faults.Attempts
		}
		rule := ft.Add(faults.Rule{Op: c.op, Fault: c.fault, Times: times})
		key := fmt.Sprint("fault-", i)
		var runs atomic.Int32
		fn := func(context.Context) (int, error) {
			n := int(runs.Add(1))
			if c.fail && n == 1 {
				return 0, errors.New("boom")
			}
			return 7, nil
		}
		res, err := idempotency.Do(ctx, s, key, fn, &idempotency.CallOptions{Payload: uint64(12345678901234567888)})
		if rule.Fired() == 0 {
			t.Errorf("%s: the fault never fired", name)
			continue
		}
		switch {
		case c.op == "DynamoDB.PutItem" && c.fault == faults.Throttle:
			if err == nil || runs.Load() != 0 {
				t.Errorf("%s: %v, ran %d; want the error and no run", name, err, runs.Load())
			}
			continue
		case c.op == "DynamoDB.UpdateItem" && c.fault == faults.Throttle:
			var nr *idempotency.NotRecordedError
			if !errors.As(err, &nr) || res.Value != 7 {
				t.Errorf("%s: %v, value %d; want a *NotRecordedError with the value", name, err, res.Value)
			}
			_, err := idempotency.Do(ctx, plain, key, fn, &idempotency.CallOptions{Payload: uint64(12345678901234567888)})
			if !errors.Is(err, idempotency.ErrInProgress) {
				t.Errorf("%s: a repeat within the hold: %v; want in progress", name, err)
			}
			continue
		case c.fail:
			if err == nil || err.Error() != "boom" {
				t.Errorf("%s: %v; want the function's error alone (the release is done)", name, err)
			}
			res2, err := idempotency.Do(ctx, plain, key, fn, &idempotency.CallOptions{Payload: uint64(12345678901234567888)})
			if err != nil || res2.Replayed || runs.Load() != 2 {
				t.Errorf("%s: the retry after a released error: %v, replayed %v, runs %d; want it to run", name, err, res2.Replayed, runs.Load())
			}
			continue
		}
		if err != nil || res.Value != 7 || runs.Load() != 1 {
			t.Errorf("%s: %v, value %d, runs %d; want 7, once", name, err, res.Value, runs.Load())
		}
		res2, err := idempotency.Do(ctx, plain, key, fn, &idempotency.CallOptions{Payload: uint64(12345678901234567888)})
		if err != nil || !res2.Replayed || res2.Value != 7 {
			t.Errorf("%s: the repeat: %v, replayed %v, value %d; want 7 replayed", name, err, res2.Replayed, res2.Value)
		}
	}
}

// Promise: "A result write whose reply was lost and whose resend meets a
// record that is no longer the call's (later calls the policy let in
// replaced the outcome, or took it and released it) is the success it was
// while the call's hold lasts".
func TestDocAttackResultReplacedBeforeItsResend(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	for _, then := range []string{"replaced", "released"} {
		ft := faults.New(nil)
		p := daPolicy(ledger.AllowAfterFailed)
		a := daStore(t, e, &idempotency.Options{Policy: p, DynamoDB: dynamodb.NewFromConfig(faults.Config(e.Cfg, ft))})
		b := daStore(t, e, &idempotency.Options{Policy: p})
		key := "replaced-" + then
		var bErr error
		ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, After: func() {
			_, bErr = idempotency.Do(ctx, b, key, func(context.Context) (int, error) {
				if then == "released" {
					return 0, errors.New("b fails")
				}
				return 2, nil
			}, nil)
		}})
		res, err := idempotency.Do(ctx, a, key, func(context.Context) (int, error) { return 1, nil }, nil)
		if err != nil || res.Value != 1 {
			t.Errorf("%s: the first call: %v, %d; want its success (b: %v)", then, err, res.Value, bErr)
		}
	}
}

// Promise: "a process whose clock is ahead by less [than MaxClockSkew]
// never takes a key still held"; "A call that timed out is retried right
// after its deadline: the hold has ended (allowing Options.MaxClockSkew
// ...) and the next call takes the key"; "A record lives for
// Options.Retention (7 days by default, a TTL)".
func TestDocAttackSkewedClocks(t *testing.T) {
	e := nexjobtest.New(t, nil)
	base := time.Now()
	var offA, offB atomic.Int64
	clkA := func() time.Time { return base.Add(time.Duration(offA.Load())) }
	clkB := func() time.Time { return base.Add(time.Duration(offB.Load())) }
	a := daStore(t, e, &idempotency.Options{Hold: 10 * time.Second, Ledger: ledger.Options{Now: clkA}})
	b := daStore(t, e, &idempotency.Options{Hold: 10 * time.Second, Ledger: ledger.Options{Now: clkB}})
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := idempotency.Do(ctx, a, "skew", func(context.Context) (int, error) {
			close(started)
			<-release
			return 1, nil
		}, nil)
		done <- err
	}()
	<-started
	// A's clock at 9.5 s: its hold holds for 0.5 s more. B is 0.9 s ahead.
	offA.Store(int64(9500 * time.Millisecond))
	offB.Store(int64(10400 * time.Millisecond))
	var bRuns atomic.Int32
	_, err := idempotency.Do(ctx, b, "skew", func(context.Context) (int, error) { bRuns.Add(1); return 2, nil }, nil)
	if !errors.Is(err, idempotency.ErrInProgress) || bRuns.Load() != 0 {
		t.Errorf("a process 0.9 s ahead, within the hold: %v, ran %d; want in progress", err, bRuns.Load())
	}
	// A's clock at 10.2 s, B's 0.9 s ahead (within the skew): the hold is
	// over by both, and B, at A's deadline + 1.1 s, takes the key.
	offA.Store(int64(10200 * time.Millisecond))
	offB.Store(int64(11100 * time.Millisecond))
	_, err = idempotency.Do(ctx, b, "skew", func(context.Context) (int, error) { bRuns.Add(1); return 2, nil }, nil)
	if err != nil || bRuns.Load() != 1 {
		t.Errorf("after the hold and the skew: %v, ran %d; want it to run", err, bRuns.Load())
	}
	close(release)
	// "after the hold's end it is a *NotRecordedError wrapping
	// ledger.ErrCallTakenOver"
	if err := <-done; !errors.Is(err, idempotency.ErrNotRecorded) || !errors.Is(err, ledger.ErrCallTakenOver) {
		t.Errorf("the first call, which outran its hold and lost the key: %v; want a *NotRecordedError wrapping ledger.ErrCallTakenOver", err)
	}

	// Retention: a record of day 0 answers on day 6, not on day 8.
	offA.Store(0)
	if _, err := idempotency.Do(ctx, a, "retained", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
		t.Fatal(err)
	}
	offB.Store(int64(6 * 24 * time.Hour))
	if res, err := idempotency.Do(ctx, b, "retained", func(context.Context) (int, error) { return 2, nil }, nil); err != nil || !res.Replayed {
		t.Errorf("day 6: %v, replayed %v; want replayed", err, res.Replayed)
	}
	offB.Store(int64(8 * 24 * time.Hour))
	if res, err := idempotency.Do(ctx, b, "retained", func(context.Context) (int, error) { return 3, nil }, nil); err != nil || res.Replayed || res.Value != 3 {
		t.Errorf("day 8, past the retention: %v, replayed %v, value %d; want a new run", err, res.Replayed, res.Value)
	}
}

// Promise: "every repeat returns the value a run of the key recorded" and
// Result.Value: "the first call's recorded one when Replayed".
func TestDocAttackResultsReplayExactly(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	check := func(name string, v any, fresh func() any, run func(any) (any, bool, error)) {
		t.Helper()
		first, _, err := run(v)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		again, replayed, err := run(fresh())
		if err != nil || !replayed || fmt.Sprintf("%#v", again) != fmt.Sprintf("%#v", first) {
			t.Errorf("%s: the repeat returned %#v (replayed %v, %v); the first call returned %#v", name, again, replayed, err, first)
		}
	}
	u := uint64(math.MaxUint64)
	check("uint64 max", u, func() any { return uint64(0) }, func(v any) (any, bool, error) {
		r, err := idempotency.Do(ctx, s, "r-u64", func(context.Context) (uint64, error) { return v.(uint64), nil }, nil)
		return r.Value, r.Replayed, err
	})
	check("int64 min", int64(math.MinInt64), func() any { return int64(0) }, func(v any) (any, bool, error) {
		r, err := idempotency.Do(ctx, s, "r-i64", func(context.Context) (int64, error) { return v.(int64), nil }, nil)
		return r.Value, r.Replayed, err
	})
	check("raw JSON with a large integer", json.RawMessage(`{"b":12345678901234567891,"a":[1,2]}`), func() any { return json.RawMessage(`0`) }, func(v any) (any, bool, error) {
		r, err := idempotency.Do(ctx, s, "r-raw", func(context.Context) (json.RawMessage, error) { return v.(json.RawMessage), nil }, nil)
		return string(r.Value), r.Replayed, err
	})
}

// Arguable promise: Result.Value "the first call's recorded one when
// Replayed" and "Numbers are exact ... as Powertools' Python keeps it"
// (said of events' keys and payloads). A result typed with any: the first
// caller gets json.Number's digits, a repeat a float64.
func TestDocAttackResultReplayLargeIntegerInAny(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	fn := func(context.Context) (map[string]any, error) {
		return map[string]any{"id": json.Number("12345678901234567891")}, nil
	}
	first, err := idempotency.Do(ctx, s, "r-map", fn, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := idempotency.Do(ctx, s, "r-map", fn, nil)
	if err != nil || !again.Replayed || fmt.Sprint(again.Value) != fmt.Sprint(first.Value) {
		t.Errorf("the repeat returned %v (replayed %v, %v); the first call returned %v", again.Value, again.Replayed, err, first.Value)
	}
}

// Arguable promise: "every repeat returns the value a run of the key
// recorded"; a result "with no JSON ... with an *UnencodableResultError"
// (the handler package refuses non-UTF-8 JSON results with a typed error).
// A string result that is not UTF-8: the first caller gets its bytes, a
// repeat U+FFFD in their place, with no error on either side.
func TestDocAttackResultReplayNotUTF8(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	fn := func(context.Context) (string, error) { return "a\xffb", nil }
	first, err := idempotency.Do(ctx, s, "r-utf8", fn, nil)
	if err != nil {
		t.Logf("first call: %v (a typed refusal is what the docs would lead one to expect)", err)
		return
	}
	again, err := idempotency.Do(ctx, s, "r-utf8", fn, nil)
	if err != nil || again.Value != first.Value {
		t.Errorf("the repeat returned %q (replayed %v, %v); the first call returned %q, no error on either", again.Value, again.Replayed, err, first.Value)
	}

}

type daLogBuf struct {
	mu sync.Mutex
	b  []byte
}

func (l *daLogBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *daLogBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return string(l.b) }

// Promise: "One log record per outcome (run, replayed, in progress,
// mismatch) with the key's hash and the function, never the key, the
// payload or the result"; "Logs, spans and metrics carry the key's hash,
// never the key, the payload or the result."
func TestDocAttackNothingOfTheKeyOrPayloadInLogsOrErrors(t *testing.T) {
	e := nexjobtest.New(t, nil)
	var logs daLogBuf
	lg := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ft := faults.New(nil)
	s := daStore(t, e, &idempotency.Options{Logger: lg, DynamoDB: dynamodb.NewFromConfig(faults.Config(e.Cfg, ft))})
	ctx := context.Background()
	key := "KEYSECRET-4111111111111111"
	var errs []error
	fn := func(context.Context) (string, error) { return "RESULTSECRET", nil }
	do := func(k string, payload string, f func(context.Context) (string, error)) {
		_, err := idempotency.Do(ctx, s, k, f, &idempotency.CallOptions{Payload: map[string]string{"card": payload}})
		if err != nil {
			errs = append(errs, err)
		}
	}
	do(key, "PAYLOADSECRET", fn)
	do(key, "PAYLOADSECRET", fn)
	do(key, "PAYLOADOTHER", fn)
	// In progress: a call blocked while another comes.
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		do(key+"-2", "PAYLOADSECRET", func(context.Context) (string, error) { close(started); <-release; return "RESULTSECRET", nil })
	}()
	<-started
	do(key+"-2", "PAYLOADSECRET", fn)
	close(release)
	<-done
	// Not recorded: the result's write throttled past the retries.
	ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts})
	do(key+"-3", "PAYLOADSECRET", fn)
	// Too large.
	big := strings.Repeat("RESULTSECRET", 10000)
	do(key+"-4", "PAYLOADSECRET", func(context.Context) (string, error) { return big, nil })
	do(key+"-4", "PAYLOADSECRET", func(context.Context) (string, error) { return big, nil })
	if len(errs) < 4 {
		t.Errorf("only %d errors: %v", len(errs), errs)
	}
	all := logs.String()
	if strings.Count(all, "\n") < 4 {
		t.Errorf("only these log records: %s", all)
	}
	for _, err := range errs {
		all += "\n" + err.Error()
	}
	for _, secret := range []string{"KEYSECRET", "4111111111111111", "PAYLOAD", "RESULTSECRET"} {
		if strings.Contains(all, secret) {
			i := strings.Index(all, secret)
			t.Errorf("%q leaks: …%s…", secret, all[max(0, i-120):min(len(all), i+60)])
		}
	}
}

// Promise: "Turn the utility off (every call runs its function, nothing is
// read or written) with Options.Disabled or NEXJOB_IDEMPOTENCY_DISABLED=true".
func TestDocAttackDisabledWritesNothing(t *testing.T) {
	e := nexjobtest.New(t, nil)
	t.Setenv(idempotency.EnvDisabled, "true")
	s := daStore(t, e, nil)
	var runs atomic.Int32
	for i := 0; i < 3; i++ {
		res, err := idempotency.Do(context.Background(), s, "k", func(context.Context) (int, error) { return int(runs.Add(1)), nil }, nil)
		if err != nil || res.Replayed {
			t.Errorf("disabled: %v, replayed %v", err, res.Replayed)
		}
	}
	if runs.Load() != 3 {
		t.Errorf("disabled: ran %d times; want 3", runs.Load())
	}
	if recs := e.Scan(t); len(recs) != 0 {
		t.Errorf("disabled: %d items written", len(recs))
	}
}

// Promise: "A store whose Options.Function is not the name its deployment
// gives it is refused with a *FunctionError"; "Must be kinds' rule
// (letters, digits, . _ - : /)"; "two functions using one key hold two
// records, each under its own prefix".
func TestDocAttackFunctionScoping(t *testing.T) {
	e := nexjobtest.New(t, nil)
	for _, bad := range []string{"pay#x", "pay x", "pay\x00", "i#pay", "pay*"} {
		if _, err := idempotency.New(e.Cfg, e.Table, &idempotency.Options{Function: bad}); err == nil {
			t.Errorf("function %q accepted", bad)
		} else {
			var fe *idempotency.FunctionError
			if !errors.As(err, &fe) {
				t.Errorf("function %q: %v; want a *FunctionError", bad, err)
			}
		}
	}
	t.Setenv(idempotency.EnvFunction, "payments")
	var fe *idempotency.FunctionError
	if _, err := idempotency.New(e.Cfg, e.Table, &idempotency.Options{Function: "refunds"}); !errors.As(err, &fe) {
		t.Errorf("another function's name under the deployment's: %v; want a *FunctionError", err)
	}
	pay, err := idempotency.New(e.Cfg, e.Table, &idempotency.Options{Logger: daQuiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(idempotency.EnvFunction, "")
	ref := daStore(t, e, &idempotency.Options{Function: "refunds"})
	payP := daStore(t, e, &idempotency.Options{Function: "payments:v2"})
	var runs atomic.Int32
	for _, s := range []*idempotency.Store{pay, ref, payP} {
		if res, err := idempotency.Do(context.Background(), s, "shared", func(context.Context) (int, error) { return int(runs.Add(1)), nil }, nil); err != nil || res.Replayed {
			t.Errorf("%v, replayed %v", err, res.Replayed)
		}
	}
	if runs.Load() != 3 {
		t.Errorf("three functions, one key: ran %d times; want 3", runs.Load())
	}
}

// Promise (Records): "ordered: the first failure fails the rest of the batch
// unrun (FIFO queues ...)"; "a replayed record is done"; "order
// 12345678901234567888 and order 12345678901234567889 ... are two keys, in
// a single call and in a batch".
func TestDocAttackSQSBatches(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := daStore(t, e, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var ran []string
	fail := map[string]bool{"b": true}
	h, err := idempotency.SQSBatch(s, func(ctx context.Context, m events.SQSMessage) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, m.MessageId)
		if fail[m.MessageId] {
			return errors.New("fails")
		}
		return nil
	}, &idempotency.BatchOptions[events.SQSMessage]{KeyPath: `powertools_json(body).id`})
	if err != nil {
		t.Fatal(err)
	}
	msg := func(id, body, arn string) events.SQSMessage {
		m := events.SQSMessage{MessageId: id, Body: body, EventSourceARN: arn, Attributes: map[string]string{}}
		if strings.HasSuffix(arn, ".fifo") {
			m.Attributes["MessageGroupId"] = "g"
		}
		return m
	}
	std, fifo := "arn:aws:sqs:us-east-1:000000000000:q", "arn:aws:sqs:us-east-1:000000000000:q.fifo"
	failed := func(r events.SQSEventResponse) []string {
		var ids []string
		for _, f := range r.BatchItemFailures {
			ids = append(ids, f.ItemIdentifier)
		}
		return ids
	}
	r, _ := h(ctx, events.SQSEvent{Records: []events.SQSMessage{
		msg("a", `{"id":12345678901234567888}`, std), msg("b", `{"id":2}`, std), msg("c", `{"id":12345678901234567889}`, std)}})
	if got := fmt.Sprint(failed(r)); got != "[b]" || fmt.Sprint(ran) != "[a b c]" {
		t.Errorf("standard queue: failures %s, ran %v; want [b], all three run (two large ids, two keys)", got, ran)
	}
	ran = nil
	r, _ = h(ctx, events.SQSEvent{Records: []events.SQSMessage{
		msg("a", `{"id":12345678901234567888}`, fifo), msg("b", `{"id":3}`, fifo), msg("d", `{"id":4}`, fifo)}})
	if got := fmt.Sprint(failed(r)); got != "[b d]" || fmt.Sprint(ran) != "[b]" {
		t.Errorf("FIFO queue: failures %s, ran %v; want [b d] and only b run (a replayed)", got, ran)
	}
}

// Promise: "One log record per outcome (run, replayed, in progress,
// mismatch) with the key's hash and the function"; Options.Logger:
// "receives one record per outcome (the key's hash, never the key)".
func TestDocAttackARunIsLogged(t *testing.T) {
	e := nexjobtest.New(t, nil)
	var logs daLogBuf
	lg := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := daStore(t, e, &idempotency.Options{Logger: lg})
	res, err := idempotency.Do(context.Background(), s, "logged", func(context.Context) (int, error) { return 1, nil }, nil)
	if err != nil || res.Replayed {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), res.KeyHash); n != 1 {
		t.Errorf("a first call that ran: %d log records with its key hash (at any level); want one. Logs: %q", n, logs.String())
	}
}
