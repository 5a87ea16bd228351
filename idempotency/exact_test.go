package idempotency_test

import (
	"context"
	"errors"
	"sync"
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
