// idem/charge_run_test.go: written beside docs/idempotency.md's own
// idem/charge.go, as the doc says it, by TestIdempotencyBlocksRun
// (internal/proof/docs): each function of the block runs its happy path
// and its repeat against the emulator.
package idem

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// ChargeOnce: the first request charges (201), a repeat of its key gets
// the first response back, marked Idempotent-Replayed, without charging;
// a response with headers of its own keeps them on the replay; another
// body under the key is refused.
func TestChargeOnceRunsOnceThenReplays(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	charges := 0
	h, err := ChargeOnce(e.Cfg, e.Table, func(_ context.Context, r Req) (Resp, error) {
		charges++
		resp := Resp{StatusCode: 201, Body: fmt.Sprintf(`{"charge":"ch_%d"}`, charges)}
		if r.Headers["idempotency-key"] == "k-2" {
			resp.Headers = map[string]string{"Location": "/charges/ch_2"}
		}
		return resp, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	req := Req{Headers: map[string]string{"idempotency-key": "k-1"}, Body: `{"amount":100,"currency":"EUR","card":"tok_4242"}`}
	first, err := h(ctx, req)
	if err != nil || first.StatusCode != 201 || first.Headers["Idempotent-Replayed"] != "" {
		t.Fatalf("the first request: %+v %v", first, err)
	}
	again, err := h(ctx, req)
	if err != nil || again.StatusCode != 201 || again.Body != first.Body || again.Headers["Idempotent-Replayed"] != "true" || charges != 1 {
		t.Fatalf("its repeat: %+v %v, %d charges; want the first response marked replayed, 1 charge", again, err, charges)
	}
	req.Headers["idempotency-key"] = "k-2"
	if _, err := h(ctx, req); err != nil {
		t.Fatal(err)
	}
	again, err = h(ctx, req)
	if err != nil || again.Headers["Location"] != "/charges/ch_2" || again.Headers["Idempotent-Replayed"] != "true" || charges != 2 {
		t.Fatalf("a repeat of a response with headers: %+v %v, %d charges", again, err, charges)
	}
	req.Body = `{"amount":999,"currency":"EUR","card":"tok_4242"}`
	if _, err := h(ctx, req); !errors.Is(err, idempotency.ErrPayloadMismatch) || charges != 2 {
		t.Fatalf("another amount under the key: %v, %d charges; want a payload mismatch", err, charges)
	}
}

// Refund: the first call runs, a repeat of its id returns its value,
// replayed, without running.
func TestRefundRunsOnceThenReplays(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	store, err := idempotency.New(e.Cfg, e.Table, nil)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	do := func(context.Context) (string, error) { runs++; return fmt.Sprintf("re_%d", runs), nil }
	v, replayed, err := Refund(ctx, store, "refund-1", do)
	if err != nil || v != "re_1" || replayed {
		t.Fatalf("the first refund: %q %v %v", v, replayed, err)
	}
	v, replayed, err = Refund(ctx, store, "refund-1", do)
	if err != nil || v != "re_1" || !replayed || runs != 1 {
		t.Fatalf("its repeat: %q %v %v, %d runs; want re_1 replayed, 1 run", v, replayed, err, runs)
	}
}
