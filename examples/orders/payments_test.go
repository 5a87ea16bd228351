package orders_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// provider counts the charges it makes; block, when set, holds a charge
// until the test lets it go; fail fails the next charge.
type provider struct {
	charges atomic.Int32
	block   chan struct{}
	started chan struct{}
	fail    atomic.Bool
	mu      sync.Mutex
	keys    []string
}

func (p *provider) Charge(_ context.Context, _ string, _ int, key string) (string, error) {
	if p.started != nil {
		close(p.started)
		<-p.block
	}
	if p.fail.Swap(false) {
		return "", errors.New("provider: 503")
	}
	p.mu.Lock()
	p.keys = append(p.keys, key)
	p.mu.Unlock()
	return "ch_" + strconv.Itoa(int(p.charges.Add(1))), nil
}

func paymentsAPI(t *testing.T, p *provider) func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	t.Helper()
	e := nexjobtest.New(t, nil)
	store, err := idempotency.New(e.Cfg, e.Table, &idempotency.Options{Function: "payments", Ledger: ledger.Options{Now: e.Now}})
	if err != nil {
		t.Fatal(err)
	}
	api, err := orders.PaymentsAPI(store, p, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return api
}

func post(key, body string) events.LambdaFunctionURLRequest {
	h := map[string]string{"content-type": "application/json"}
	if key != "" {
		h["idempotency-key"] = key
	}
	return events.LambdaFunctionURLRequest{Headers: h, Body: body}
}

func payment(t *testing.T, r events.LambdaFunctionURLResponse) orders.Payment {
	t.Helper()
	var p orders.Payment
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	return p
}

// The card is charged once per Idempotency-Key: a retry gets the first
// response, marked replayed; another request under the key is 422; no
// key is 400.
func TestPaymentsChargeOncePerKey(t *testing.T) {
	t.Parallel()
	p := &provider{}
	api := paymentsAPI(t, p)
	ctx := context.Background()
	body := `{"cents":4200,"currency":"EUR","card":"tok_visa"}`
	first, err := api(ctx, post("pay-1", body))
	if err != nil || first.StatusCode != 201 || payment(t, first).ChargeID != "ch_1" {
		t.Fatalf("first: %+v %v", first, err)
	}
	retry, err := api(ctx, post("pay-1", body))
	if err != nil || retry.StatusCode != 201 || retry.Body != first.Body || retry.Headers["Idempotent-Replayed"] != "true" {
		t.Fatalf("retry: %+v %v; want the first response, replayed", retry, err)
	}
	if n := p.charges.Load(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if other, err := api(ctx, post("pay-1", `{"cents":9900,"currency":"EUR","card":"tok_visa"}`)); err != nil || other.StatusCode != 422 {
		t.Fatalf("another amount under the key: %+v %v, want 422", other, err)
	}
	if none, err := api(ctx, post("", body)); err != nil || none.StatusCode != 400 {
		t.Fatalf("no key: %+v %v, want 400", none, err)
	}
	if declined, err := api(ctx, post("pay-2", `{"cents":1,"currency":"EUR","card":"declined_x"}`)); err != nil || declined.StatusCode != 402 {
		t.Fatalf("declined: %+v %v, want 402", declined, err)
	}
	if n := p.charges.Load(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// A retry sent while the first request is still charging is 409 with
// Retry-After, and charges nothing.
func TestPaymentsRetryWhileCharging(t *testing.T) {
	t.Parallel()
	p := &provider{block: make(chan struct{}), started: make(chan struct{})}
	api := paymentsAPI(t, p)
	ctx := context.Background()
	body := `{"cents":100,"currency":"USD","card":"tok_visa"}`
	done := make(chan events.LambdaFunctionURLResponse, 1)
	go func() {
		r, err := api(ctx, post("pay-3", body))
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	<-p.started
	busy, err := api(ctx, post("pay-3", body))
	if err != nil || busy.StatusCode != 409 || busy.Headers["Retry-After"] == "" {
		t.Fatalf("while charging: %+v %v, want 409 with Retry-After", busy, err)
	}
	close(p.block)
	if r := <-done; r.StatusCode != 201 {
		t.Fatalf("the first: %+v", r)
	}
	if n := p.charges.Load(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// A provider error is 502 and releases the key: the client's retry with
// the same key charges (once), under the same provider key.
func TestPaymentsProviderErrorThenRetry(t *testing.T) {
	t.Parallel()
	p := &provider{}
	p.fail.Store(true)
	api := paymentsAPI(t, p)
	ctx := context.Background()
	body := `{"cents":100,"currency":"USD","card":"tok_visa"}`
	if r, err := api(ctx, post("pay-4", body)); err != nil || r.StatusCode != 502 {
		t.Fatalf("provider down: %+v %v, want 502", r, err)
	}
	r, err := api(ctx, post("pay-4", body))
	if err != nil || r.StatusCode != 201 || r.Headers["Idempotent-Replayed"] != "" {
		t.Fatalf("retry: %+v %v, want a new charge", r, err)
	}
	if n := p.charges.Load(); n != 1 || p.keys[0] != "pay-4" {
		t.Fatalf("%d charges under %v, want 1 under the request's key", n, p.keys)
	}
}
