package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/idempotency"
)

// Two order ids past 2^53 that one float64 holds alike.
const (
	bigID  = "12345678901234567888"
	bigID2 = "12345678901234567889"
)

// Integers beyond 2^53 are kept exact wherever a key or a payload's hash
// is taken (as Powertools' Python keeps them): two orders whose ids one
// float64 rounds alike are two keys in a single call, in an SQS batch and
// in a struct's uint64 field, and a changed large id is a payload
// mismatch.
func TestLargeIntegersAreExact(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	order := func(id string) string { return `{"order_id":` + id + `,"amount":5}` }
	t.Run("single call", func(t *testing.T) {
		s := r.store(t, &idempotency.Options{Function: "exact-single-call"})
		runs := 0
		h, err := idempotency.Handler(s, func(_ context.Context, req httpReq) (string, error) {
			runs++
			return req.Body, nil
		}, &idempotency.HandlerOptions[httpReq, string]{KeyPath: `powertools_json(body).order_id`})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{bigID, bigID2} {
			got, err := h(context.Background(), httpReq{Body: order(id)})
			if err != nil || got != order(id) {
				t.Fatalf("order %s: answered %q %v; want its own run", id, got, err)
			}
		}
		if runs != 2 {
			t.Fatalf("two orders ran %d times, want 2", runs)
		}
	})
	t.Run("SQS batch", func(t *testing.T) {
		s := r.store(t, &idempotency.Options{Function: "exact-sqs-batch"})
		var mu sync.Mutex
		ran := map[string]bool{}
		batch, err := idempotency.SQSBatch(s, func(_ context.Context, m events.SQSMessage) error {
			mu.Lock()
			defer mu.Unlock()
			ran[m.MessageId] = true
			return nil
		}, &idempotency.BatchOptions[events.SQSMessage]{KeyPath: `powertools_json(body).order_id`})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := batch(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
			{MessageId: "m-888", Body: order(bigID)}, {MessageId: "m-889", Body: order(bigID2)},
		}})
		if err != nil || len(resp.BatchItemFailures) != 0 || !ran["m-888"] || !ran["m-889"] {
			t.Fatalf("a batch of two orders: failures %v %v, ran %v; want both run", resp.BatchItemFailures, err, ran)
		}
	})
	t.Run("struct field", func(t *testing.T) {
		s := r.store(t, &idempotency.Options{Function: "exact-struct-field"})
		type event struct {
			ID uint64 `json:"id"`
		}
		runs := 0
		h, err := idempotency.Handler(s, func(_ context.Context, ev event) (uint64, error) { runs++; return ev.ID, nil },
			&idempotency.HandlerOptions[event, uint64]{KeyPath: `id`})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []uint64{12345678901234567888, 12345678901234567889} {
			if got, err := h(context.Background(), event{ID: id}); err != nil || got != id {
				t.Fatalf("event %d: answered %d %v", id, got, err)
			}
		}
		if runs != 2 {
			t.Fatalf("two events ran %d times, want 2", runs)
		}
	})
	t.Run("payload validation", func(t *testing.T) {
		s := r.store(t, &idempotency.Options{Function: "exact-payload-validation"})
		runs := 0
		h, err := idempotency.Handler(s, func(_ context.Context, req httpReq) (string, error) { runs++; return "ok", nil },
			&idempotency.HandlerOptions[httpReq, string]{KeyPath: `headers."idempotency-key"`, PayloadPath: `powertools_json(body).order_id`})
		if err != nil {
			t.Fatal(err)
		}
		req := httpReq{Headers: map[string]string{"idempotency-key": "k-big"}, Body: order(bigID)}
		if _, err := h(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		req.Body = order(bigID2)
		got, err := h(context.Background(), req)
		if !errors.Is(err, idempotency.ErrPayloadMismatch) || runs != 1 {
			t.Fatalf("the key with another large id: %q %v, %d runs; want a *PayloadMismatchError", got, err, runs)
		}
	})
	t.Run("Do", func(t *testing.T) {
		s := r.store(t, &idempotency.Options{Function: "exact-do"})
		var c charger
		for _, id := range []uint64{12345678901234567888, 12345678901234567889} {
			_, err := idempotency.Do(context.Background(), s, "k-do", c.charge(1), &idempotency.CallOptions{Payload: map[string]any{"id": id}})
			if id == 12345678901234567889 && !errors.Is(err, idempotency.ErrPayloadMismatch) {
				t.Fatalf("Do with another large id in its payload: %v; want a mismatch", err)
			}
		}
		if n := c.runs.Load(); n != 1 {
			t.Fatalf("%d runs, want 1", n)
		}
	})
}

// A result replays as it was recorded, and the first caller gets that
// too: a number in an any is an exact json.Number on every call (before,
// the first caller got the json.Number and a repeat a float64 that
// rounded the id: "the repeat returned map[id:1.2345678901234567e+19]";
// the doc attack), and a string that is not UTF-8 is refused with an
// *UnencodableResultError on both (before, the first caller got its bytes
// and a repeat U+FFFD in their place, no error on either).
func TestResultsReplayAsRecorded(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := context.Background()
	t.Run("numbers in an any", func(t *testing.T) {
		fn := func(context.Context) (map[string]any, error) {
			return map[string]any{"id": json.Number(bigID), "ratio": 1.5, "n": 7}, nil
		}
		first, err := idempotency.Do(ctx, r.s, "r-any", fn, nil)
		if err != nil {
			t.Fatal(err)
		}
		again, err := idempotency.Do(ctx, r.s, "r-any", fn, nil)
		if err != nil || !again.Replayed {
			t.Fatalf("the repeat: %v (replayed %v)", err, again.Replayed)
		}
		want := map[string]any{"id": json.Number(bigID), "ratio": json.Number("1.5"), "n": json.Number("7")}
		if !reflect.DeepEqual(first.Value, want) || !reflect.DeepEqual(again.Value, want) {
			t.Fatalf("the first call returned %#v, the repeat %#v; want both %#v", first.Value, again.Value, want)
		}
	})
	t.Run("a string that is not UTF-8", func(t *testing.T) {
		var runs atomic.Int32
		fn := func(context.Context) (string, error) { runs.Add(1); return "a\xffb", nil }
		var ue *idempotency.UnencodableResultError
		if _, err := idempotency.Do(ctx, r.s, "r-utf8", fn, nil); !errors.As(err, &ue) || ue.Replayed {
			t.Fatalf("the first call: %v; want an *UnencodableResultError", err)
		}
		if _, err := idempotency.Do(ctx, r.s, "r-utf8", fn, nil); !errors.As(err, &ue) || !ue.Replayed || runs.Load() != 1 {
			t.Fatalf("the repeat: %v, the function ran %d times; want the error replayed and one run", err, runs.Load())
		}
	})
	t.Run("U+FFFD itself and an escaped backslash", func(t *testing.T) {
		fn := func(context.Context) ([]string, error) { return []string{"a\uFFFDb", `\ufffd`}, nil }
		first, err := idempotency.Do(ctx, r.s, "r-fffd", fn, nil)
		if err != nil || !reflect.DeepEqual(first.Value, []string{"a\uFFFDb", `\ufffd`}) {
			t.Fatalf("a valid U+FFFD and the text \\ufffd: %q, %v", first.Value, err)
		}
	})
}
