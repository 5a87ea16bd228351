package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
)

// blocked is a first call held inside its function until the test lets
// it go: started is closed once it runs.
type blocked struct {
	started, release chan struct{}
	done             chan error
	res              idempotency.Result[receipt]
}

func startBlocked(ctx context.Context, s *idempotency.Store, key string, c *charger) *blocked {
	b := &blocked{started: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		res, err := idempotency.Do(ctx, s, key, func(ctx context.Context) (receipt, error) {
			close(b.started)
			<-b.release
			return c.charge(100)(ctx)
		}, nil)
		b.res = res
		b.done <- err
	}()
	<-b.started
	return b
}

// A concurrent duplicate gets an *InProgressError naming the hold's end,
// and runs nothing; once the first call ends, a repeat is replayed.
func TestConcurrentDuplicateIsInProgress(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var c charger
	first := startBlocked(context.Background(), r.s, "order-2", &c)
	_, err := idempotency.Do(context.Background(), r.s, "order-2", c.charge(100), nil)
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || !errors.Is(err, idempotency.ErrInProgress) || ip.Until.IsZero() {
		t.Fatalf("a concurrent duplicate: %v, want *InProgressError", err)
	}
	close(first.release)
	if err := <-first.done; err != nil {
		t.Fatal(err)
	}
	again, err := idempotency.Do(context.Background(), r.s, "order-2", c.charge(100), nil)
	if err != nil || !again.Replayed || c.runs.Load() != 1 {
		t.Fatalf("after the first call: %+v %v, %d runs", again, err, c.runs.Load())
	}
	if !strings.Contains(r.emf.String(), `"CallInProgress":1`) {
		t.Errorf("no CallInProgress metric: %s", r.emf.String())
	}
}

// With Options.Wait a concurrent duplicate waits for the first call's
// outcome and returns it, Replayed; it never runs the function.
func TestConcurrentDuplicateWaits(t *testing.T) {
	t.Parallel()
	r := newRig(t, &idempotency.Options{Wait: true})
	var c charger
	first := startBlocked(context.Background(), r.s, "order-3", &c)
	waiter := make(chan idempotency.Result[receipt], 1)
	go func() {
		res, err := idempotency.Do(context.Background(), r.s, "order-3", c.charge(100), nil)
		if err != nil {
			t.Error(err)
		}
		waiter <- res
	}()
	// The waiter has read the hold at least once: its GetItem polls.
	r.waitForOp(t, "DynamoDB.GetItem")
	close(first.release)
	if err := <-first.done; err != nil {
		t.Fatal(err)
	}
	got := <-waiter
	if !got.Replayed || got.Value != first.res.Value || c.runs.Load() != 1 {
		t.Fatalf("the waiter got %+v (first %+v), %d runs; want the first's result, 1 run", got, first.res.Value, c.runs.Load())
	}
}

// waitForOp waits until the Store has made a request of op.
func (r *rig) waitForOp(t *testing.T, op string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		for _, c := range r.counter.Calls() {
			if c == op {
				return
			}
		}
		select {
		case <-deadline:
			t.Fatalf("no %s in a minute: %v", op, r.counter.Calls())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A first call that timed out (its invocation ended with the hold) is
// retried at once after its deadline: the next call takes the key and
// runs. The late first call's result is not recorded over it
// (*NotRecordedError, ErrCallTakenOver).
func TestTimedOutCallIsRetriedAfterItsDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var c charger
	deadline := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	first := startBlocked(ctx, r.s, "order-4", &c)
	if _, err := idempotency.Do(context.Background(), r.s, "order-4", c.charge(100), nil); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("before the deadline: %v, want in progress", err)
	}
	r.e.Advance(t, time.Hour+time.Second) // the invocation's deadline passed
	retry, err := idempotency.Do(context.Background(), r.s, "order-4", c.charge(100), nil)
	if err != nil || retry.Replayed || c.runs.Load() != 1 {
		t.Fatalf("the retry after the deadline: %+v %v, %d runs; want it run", retry, err, c.runs.Load())
	}
	close(first.release)
	err = <-first.done
	var nr *idempotency.NotRecordedError
	if !errors.As(err, &nr) || !errors.Is(err, ledger.ErrCallTakenOver) {
		t.Fatalf("the late first call: %v, want *NotRecordedError (taken over)", err)
	}
	again, err := idempotency.Do(context.Background(), r.s, "order-4", c.charge(100), nil)
	if err != nil || !again.Replayed || again.Value != retry.Value {
		t.Fatalf("a repeat: %+v %v, want the retry's result %+v", again, err, retry.Value)
	}
}

// A function that returns an error releases the key: a retry runs again.
// Requests pinned: PutItem, DeleteItem.
func TestErrorReleasesTheKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	c := charger{err: errors.New("card declined")}
	if _, err := idempotency.Do(context.Background(), r.s, "order-5", c.charge(100), nil); err == nil || err.Error() != "card declined" {
		t.Fatalf("first call: %v, want the function's error as it is", err)
	}
	if got := ops(r.counter); got != "DynamoDB.PutItem DynamoDB.DeleteItem" {
		t.Errorf("a failed call's requests: %s, want PutItem DeleteItem", got)
	}
	c.err = nil
	res, err := idempotency.Do(context.Background(), r.s, "order-5", c.charge(100), nil)
	if err != nil || res.Replayed || c.runs.Load() != 2 {
		t.Fatalf("the retry: %+v %v, %d runs; want it run", res, err, c.runs.Load())
	}
}

// A repeat with a different payload is refused with a
// *PayloadMismatchError, after the first call and while it runs.
func TestPayloadMismatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var c charger
	type req struct{ Amount int }
	if _, err := idempotency.Do(context.Background(), r.s, "order-6", c.charge(100), &idempotency.CallOptions{Payload: req{100}}); err != nil {
		t.Fatal(err)
	}
	if res, err := idempotency.Do(context.Background(), r.s, "order-6", c.charge(100), &idempotency.CallOptions{Payload: req{100}}); err != nil || !res.Replayed {
		t.Fatalf("same payload: %+v %v, want replayed", res, err)
	}
	_, err := idempotency.Do(context.Background(), r.s, "order-6", c.charge(999), &idempotency.CallOptions{Payload: req{999}})
	var pm *idempotency.PayloadMismatchError
	if !errors.As(err, &pm) || !errors.Is(err, idempotency.ErrPayloadMismatch) {
		t.Fatalf("another payload: %v, want *PayloadMismatchError", err)
	}
	first := startBlocked(context.Background(), r.s, "order-7", &c)
	if _, err := idempotency.Do(context.Background(), r.s, "order-7", c.charge(5), &idempotency.CallOptions{Payload: req{5}}); !errors.As(err, &pm) {
		t.Fatalf("another payload while in progress: %v, want *PayloadMismatchError", err)
	}
	close(first.release)
	if err := <-first.done; err != nil {
		t.Fatal(err)
	}
	if c.runs.Load() != 2 {
		t.Fatalf("%d runs, want 2 (no mismatched call ran)", c.runs.Load())
	}
	if !strings.Contains(r.emf.String(), `"CallMismatch":1`) {
		t.Errorf("no CallMismatch metric")
	}
}

// A record lives for its retention: after it, the key is new.
func TestRecordExpires(t *testing.T) {
	t.Parallel()
	r := newRig(t, &idempotency.Options{Retention: 24 * time.Hour})
	var c charger
	if _, err := idempotency.Do(context.Background(), r.s, "order-8", c.charge(100), nil); err != nil {
		t.Fatal(err)
	}
	r.e.Advance(t, 23*time.Hour)
	if res, err := idempotency.Do(context.Background(), r.s, "order-8", c.charge(100), nil); err != nil || !res.Replayed {
		t.Fatalf("within retention: %+v %v", res, err)
	}
	r.e.Advance(t, 2*time.Hour)
	res, err := idempotency.Do(context.Background(), r.s, "order-8", c.charge(100), nil)
	if err != nil || res.Replayed || c.runs.Load() != 2 {
		t.Fatalf("after retention: %+v %v, %d runs; want a new run", res, err, c.runs.Load())
	}
	if ttl := r.item(t, res.KeyHash)["expiresAt"]; ttl == nil {
		t.Fatal("the record has no TTL attribute")
	}
}

// A function that panics releases the key and panics on.
func TestPanicReleasesTheKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		_, _ = idempotency.Do(context.Background(), r.s, "order-9", func(context.Context) (int, error) { panic("boom") }, nil)
	}()
	var c charger
	if res, err := idempotency.Do(context.Background(), r.s, "order-9", c.charge(1), nil); err != nil || res.Replayed || c.runs.Load() != 1 {
		t.Fatalf("after the panic: %+v %v; want a run", res, err)
	}
}

// A result over MaxResultBytes is returned to the first caller with a
// *ResultTooLargeError; the key is used, and a repeat gets the error
// without running.
func TestResultTooLarge(t *testing.T) {
	t.Parallel()
	r := newRig(t, &idempotency.Options{MaxResultBytes: 100})
	runs := 0
	big := func(context.Context) (string, error) { runs++; return strings.Repeat("x", 200), nil }
	res, err := idempotency.Do(context.Background(), r.s, "big", big, nil)
	var tl *idempotency.ResultTooLargeError
	if !errors.As(err, &tl) || tl.Bytes != 202 || len(res.Value) != 200 {
		t.Fatalf("first call: %v (%d bytes returned), want *ResultTooLargeError of 202 bytes and the value", err, len(res.Value))
	}
	res, err = idempotency.Do(context.Background(), r.s, "big", big, nil)
	if !errors.As(err, &tl) || !tl.Replayed || runs != 1 {
		t.Fatalf("repeat: %+v %v, %d runs", res, err, runs)
	}
}

// Bad input: an empty key runs nothing; a payload that cannot be encoded
// is refused before anything is written; bad options are refused by New.
func TestBadInput(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var c charger
	if _, err := idempotency.Do(context.Background(), r.s, "", c.charge(1), nil); !errors.Is(err, idempotency.ErrNoKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := idempotency.Do(context.Background(), r.s, "k", c.charge(1), &idempotency.CallOptions{Payload: func() {}}); err == nil {
		t.Fatal("a payload that is not JSON was accepted")
	}
	if c.runs.Load() != 0 || len(r.counter.Calls()) != 0 {
		t.Fatalf("%d runs, requests %v; want none", c.runs.Load(), r.counter.Calls())
	}
	bad := ledger.DuplicatePolicy(7)
	for name, o := range map[string]idempotency.Options{
		"function": {Function: "no spaces"}, "policy": {Policy: &bad}, "negative": {Hold: -1}, "result": {MaxResultBytes: ledger.MaxCallResultBytes + 1},
	} {
		if _, err := idempotency.New(r.e.Cfg, r.e.Table, &o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// One key under two functions is two records.
func TestKeysAreScopedToTheFunction(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	other := r.store(t, &idempotency.Options{Function: "refund"})
	var c charger
	a, err := idempotency.Do(context.Background(), r.s, "order-10", c.charge(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := idempotency.Do(context.Background(), other, "order-10", c.charge(1), nil)
	if err != nil || b.Replayed || a.KeyHash == b.KeyHash || c.runs.Load() != 2 {
		t.Fatalf("the other function: %+v %v, %d runs; want its own run", b, err, c.runs.Load())
	}
}

// With a cache, a repeat in the same process makes no request.
func TestCacheHit(t *testing.T) {
	t.Parallel()
	r := newRig(t, &idempotency.Options{CacheSize: 10})
	var c charger
	first, err := idempotency.Do(context.Background(), r.s, "order-11", c.charge(7), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.counter.Reset()
	res, err := idempotency.Do(context.Background(), r.s, "order-11", c.charge(7), nil)
	if err != nil || !res.Replayed || res.Value != first.Value || c.runs.Load() != 1 {
		t.Fatalf("cached repeat: %+v %v", res, err)
	}
	if calls := r.counter.Calls(); len(calls) != 0 {
		t.Fatalf("a cached repeat made requests: %v", calls)
	}
	// The cache ends with the record's retention.
	r.e.Advance(t, idempotency.DefaultRetention+time.Second)
	if res, err := idempotency.Do(context.Background(), r.s, "order-11", c.charge(7), nil); err != nil || res.Replayed {
		t.Fatalf("after retention: %+v %v; want a new run", res, err)
	}
}

// Disabled: every call runs, nothing is read or written.
func TestDisabled(t *testing.T) {
	t.Setenv(idempotency.EnvDisabled, "true")
	r := newRig(t, nil)
	var c charger
	for range 2 {
		if res, err := idempotency.Do(context.Background(), r.s, "order-12", c.charge(1), nil); err != nil || res.Replayed {
			t.Fatalf("%+v %v", res, err)
		}
	}
	if c.runs.Load() != 2 || len(r.counter.Calls()) != 0 {
		t.Fatalf("%d runs, requests %v; want 2 runs, none", c.runs.Load(), r.counter.Calls())
	}
}

// Logs and metrics carry the key's hash, never the key or the payload.
func TestNothingOfTheKeyOrPayloadLeaks(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var c charger
	key, secret := "customer-4242-4242-secret", "card-4111111111111111"
	p := &idempotency.CallOptions{Payload: secret}
	for range 2 {
		if _, err := idempotency.Do(context.Background(), r.s, key, c.charge(1), p); err != nil {
			t.Fatal(err)
		}
	}
	_, err := idempotency.Do(context.Background(), r.s, key, c.charge(1), &idempotency.CallOptions{Payload: "other"})
	if err == nil {
		t.Fatal("want a mismatch")
	}
	for what, text := range map[string]string{"logs": r.logs.String(), "metrics": r.emf.String(), "error": err.Error()} {
		if strings.Contains(text, key) || strings.Contains(text, secret) {
			t.Errorf("%s leak the key or payload: %s", what, text)
		}
	}
	kh := r.s.KeyHash(key)
	if !strings.Contains(r.logs.String(), kh) || !strings.Contains(r.emf.String(), `"KeyHash":"`+kh+`"`) || !strings.Contains(r.emf.String(), `"Function":"charge"`) {
		t.Errorf("logs or metrics lack the key's hash or function: %s %s", r.logs.String(), r.emf.String())
	}
	for _, m := range []string{`"CallRun":1`, `"CallReplayed":1`, `"CallMismatch":1`} {
		if !strings.Contains(r.emf.String(), m) {
			t.Errorf("no %s metric", m)
		}
	}
}
