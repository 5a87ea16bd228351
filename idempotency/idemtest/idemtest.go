// Package idemtest is the behaviour suite every idempotency.Backend
// passes: the DynamoDB table's (run against the emulator), the in-memory
// one and package redisstore's (run against a real Redis server) run it
// as it is, and so can a team's own Backend:
//
//	func TestMyBackend(t *testing.T) {
//		idemtest.Run(t, func(t *testing.T, now func() time.Time) idempotency.Backend {
//			return mybackend.New(client, now)
//		})
//	}
//
// It checks, through idempotency.Do: a first call runs and a repeat is
// replayed; of many racing calls one runs; a hold refuses repeats until
// its deadline plus MaxClockSkew by the Backend's clock, and a late first
// call is then not recorded over its taker; an error or a panic releases
// the key; the three DuplicatePolicy cases after a recorded outcome; a
// different payload is refused; a record ends with its retention; a result
// too large is recorded as used. And the Backend's own contract: a write
// with another's token changes nothing. The suite moves its own clock (no
// sleep): the Backend must read now from the function it is given.
package idemtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
)

// NewBackend makes a Backend for one test, reading now as its clock.
// Backends made for one Run may share their storage (one table, one
// Redis database): each test uses its own function name.
type NewBackend func(t *testing.T, now func() time.Time) idempotency.Backend

// Clock is the suite's clock: real time moved forward by Advance.
type Clock struct{ off atomic.Int64 }

// Now is the clock's reading.
func (c *Clock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// Rig is one test's Backend and clock; Store makes Stores on them.
type Rig struct {
	Clock   *Clock
	Backend idempotency.Backend
	fn      string
}

// NewRig makes a Backend with a fresh clock and a function name of its own.
func NewRig(t *testing.T, nb NewBackend) *Rig {
	t.Helper()
	c := &Clock{}
	return &Rig{Clock: c, Backend: nb(t, c.Now), fn: "suite-" + ledger.NewNonce()[:12]}
}

// Store is a Store on the rig's Backend and clock (o may be nil); its
// Function is the rig's unless o names one.
func (r *Rig) Store(t *testing.T, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	opts.Backend, opts.Ledger.Now = r.Backend, r.Clock.Now
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Ledger.KeySecret == nil {
		opts.Ledger.KeySecret = []byte("idemtest")
	}
	if opts.Function == "" {
		opts.Function = r.fn
	} else {
		opts.Function = r.fn + "-" + opts.Function
	}
	s, err := idempotency.New(aws.Config{}, "", &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Receipt is what the suite's function returns.
type Receipt struct {
	ChargeID string
	Amount   int
}

// Charger is the suite's function: it counts its runs.
type Charger struct {
	Runs atomic.Int32
	Err  error
}

// Charge returns the function charging amount.
func (c *Charger) Charge(amount int) func(context.Context) (Receipt, error) {
	return func(context.Context) (Receipt, error) {
		n := c.Runs.Add(1)
		if c.Err != nil {
			return Receipt{}, c.Err
		}
		return Receipt{ChargeID: fmt.Sprintf("ch_%d", n), Amount: amount}, nil
	}
}

// Run runs every test of the suite against the Backends nb makes, each a
// parallel subtest.
func Run(t *testing.T, nb NewBackend) { RunExcept(t, nb) }

// RunExcept is Run but for the tests named (a Backend whose layout cannot
// keep what they need: Powertools' keeps no policy but RejectAlways, so
// "Policies" is not its).
func RunExcept(t *testing.T, nb NewBackend, except ...string) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, NewBackend)
	}{
		{"FirstCallThenRepeat", firstCallThenRepeat},
		{"RaceRunsOnce", raceRunsOnce},
		{"RaceWaitersGetTheOutcome", raceWaitersGetTheOutcome},
		{"HoldEndsWithItsDeadlineAndSkew", holdEndsWithItsDeadlineAndSkew},
		{"ErrorReleases", errorReleases},
		{"PanicReleases", panicReleases},
		{"Policies", policies},
		{"PayloadMismatch", payloadMismatch},
		{"RecordExpires", recordExpires},
		{"ResultTooLarge", resultTooLarge},
		{"ForeignTokenChangesNothing", foreignTokenChangesNothing},
	} {
		if slices.Contains(except, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, nb)
		})
	}
}

func firstCallThenRepeat(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, nil)
	var c Charger
	first, err := idempotency.Do(context.Background(), s, "order-1", c.Charge(100), nil)
	if err != nil || first.Replayed || first.Value.ChargeID != "ch_1" {
		t.Fatalf("first call: %+v %v", first, err)
	}
	again, err := idempotency.Do(context.Background(), r.Store(t, nil), "order-1", c.Charge(100), nil)
	if err != nil || !again.Replayed || again.Value != first.Value || c.Runs.Load() != 1 {
		t.Fatalf("a repeat from another Store: %+v %v, %d runs; want the first's %+v replayed, 1 run", again, err, c.Runs.Load(), first.Value)
	}
	if other, err := idempotency.Do(context.Background(), s, "order-2", c.Charge(5), nil); err != nil || other.Replayed || c.Runs.Load() != 2 {
		t.Fatalf("another key: %+v %v, %d runs; want it run", other, err, c.Runs.Load())
	}
}

// race runs n calls of key at once; each call's result and error.
func race(s *idempotency.Store, key string, c *Charger, n int, block <-chan struct{}) ([]idempotency.Result[Receipt], []error) {
	res, errs := make([]idempotency.Result[Receipt], n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res[i], errs[i] = idempotency.Do(context.Background(), s, key, func(ctx context.Context) (Receipt, error) {
				<-block
				return c.Charge(7)(ctx)
			}, nil)
		})
	}
	wg.Wait()
	return res, errs
}

func raceRunsOnce(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	var c Charger
	open := make(chan struct{})
	close(open)
	res, errs := race(r.Store(t, nil), "order-race", &c, 16, open)
	runs := 0
	for i, err := range errs {
		switch {
		case err == nil && !res[i].Replayed:
			runs++
		case err == nil && res[i].Value.ChargeID != "ch_1":
			t.Errorf("call %d replayed %+v, want ch_1", i, res[i].Value)
		case err != nil && !errors.Is(err, idempotency.ErrInProgress):
			t.Errorf("call %d: %v, want a result or *InProgressError", i, err)
		}
	}
	if runs != 1 || c.Runs.Load() != 1 {
		t.Fatalf("16 racing calls: %d ran (the function %d times); want 1", runs, c.Runs.Load())
	}
}

func raceWaitersGetTheOutcome(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, &idempotency.Options{Wait: true})
	var c Charger
	block := make(chan struct{})
	done := make(chan struct{})
	var res []idempotency.Result[Receipt]
	var errs []error
	go func() {
		defer close(done)
		res, errs = race(s, "order-wait", &c, 8, block)
	}()
	// Let the first call finish once it holds the key.
	for {
		if cur, ok, err := r.Backend.GetCall(context.Background(), s.KeyHash("order-wait")); err != nil {
			t.Fatal(err)
		} else if ok && cur.State == ledger.Processing {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the Backend for the hold: an event, not a guess
	}
	close(block)
	<-done
	for i, err := range errs {
		if err != nil || res[i].Value.ChargeID != "ch_1" {
			t.Errorf("waiter %d: %+v %v, want ch_1", i, res[i], err)
		}
	}
	if c.Runs.Load() != 1 {
		t.Fatalf("the function ran %d times, want 1", c.Runs.Load())
	}
}

// blocked starts a first call of key held in its function until release.
func blocked(ctx context.Context, s *idempotency.Store, key string, c *Charger) (release chan struct{}, done chan error) {
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, s, key, func(ctx context.Context) (Receipt, error) {
			close(started)
			<-release
			return c.Charge(1)(ctx)
		}, nil)
		done <- err
	}()
	<-started
	return release, done
}

func holdEndsWithItsDeadlineAndSkew(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, &idempotency.Options{MaxClockSkew: time.Minute})
	var c Charger
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // the clock is not yet moved: its deadline is an hour on it
	defer cancel()
	release, done := blocked(ctx, s, "order-hold", &c)
	if _, err := idempotency.Do(context.Background(), s, "order-hold", c.Charge(1), nil); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("while held: %v, want *InProgressError", err)
	}
	r.Clock.Advance(time.Hour + 30*time.Second) // past the deadline, within the skew
	if _, err := idempotency.Do(context.Background(), s, "order-hold", c.Charge(1), nil); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("past the deadline by less than MaxClockSkew: %v, want *InProgressError", err)
	}
	r.Clock.Advance(time.Minute)
	taker, err := idempotency.Do(context.Background(), s, "order-hold", c.Charge(1), nil)
	if err != nil || taker.Replayed || c.Runs.Load() != 1 {
		t.Fatalf("past the deadline and the skew: %+v %v, %d runs; want the key taken over and run", taker, err, c.Runs.Load())
	}
	close(release)
	var nr *idempotency.NotRecordedError
	if err := <-done; !errors.As(err, &nr) || !errors.Is(err, ledger.ErrCallTakenOver) {
		t.Fatalf("the late first call: %v, want *NotRecordedError (taken over)", err)
	}
	again, err := idempotency.Do(context.Background(), s, "order-hold", c.Charge(1), nil)
	if err != nil || !again.Replayed || again.Value != taker.Value {
		t.Fatalf("a repeat: %+v %v, want the taker's %+v", again, err, taker.Value)
	}
}

func errorReleases(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, nil)
	c := Charger{Err: errors.New("card declined")}
	if _, err := idempotency.Do(context.Background(), s, "order-err", c.Charge(1), nil); err == nil || err.Error() != "card declined" {
		t.Fatalf("first call: %v, want the function's error as it is", err)
	}
	if _, ok, err := r.Backend.GetCall(context.Background(), s.KeyHash("order-err")); ok || err != nil {
		t.Fatalf("after an error: a record (%v, %v); want the key released", ok, err)
	}
	c.Err = nil
	if res, err := idempotency.Do(context.Background(), s, "order-err", c.Charge(1), nil); err != nil || res.Replayed || c.Runs.Load() != 2 {
		t.Fatalf("the retry: %+v %v, %d runs; want it run", res, err, c.Runs.Load())
	}
}

func panicReleases(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		_, _ = idempotency.Do(context.Background(), s, "order-panic", func(context.Context) (Receipt, error) { panic("boom") }, nil)
	}()
	var c Charger
	if res, err := idempotency.Do(context.Background(), s, "order-panic", c.Charge(1), nil); err != nil || res.Replayed {
		t.Fatalf("after a panic: %+v %v; want the key free and the call run", res, err)
	}
}

func policies(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	for _, p := range []ledger.DuplicatePolicy{ledger.AllowAfterFailed, ledger.RejectIfFailed, ledger.RejectAlways} {
		s := r.Store(t, &idempotency.Options{Policy: &p, RecordErrors: true, Function: p.String()})
		var ok Charger
		if _, err := idempotency.Do(context.Background(), s, "succeeded", ok.Charge(1), nil); err != nil {
			t.Fatal(err)
		}
		res, err := idempotency.Do(context.Background(), s, "succeeded", ok.Charge(1), nil)
		wantReplay := p == ledger.RejectAlways
		if err != nil || res.Replayed != wantReplay || (ok.Runs.Load() == 1) != wantReplay {
			t.Errorf("%s after a success: %+v %v, %d runs; want replayed=%v", p, res, err, ok.Runs.Load(), wantReplay)
		}
		bad := Charger{Err: errors.New("declined")}
		if _, err := idempotency.Do(context.Background(), s, "failed", bad.Charge(1), nil); err == nil {
			t.Fatal("want the function's error")
		}
		_, err = idempotency.Do(context.Background(), s, "failed", bad.Charge(1), nil)
		var dup *idempotency.DuplicateError
		switch wantReject := p != ledger.AllowAfterFailed; {
		case wantReject && (!errors.As(err, &dup) || dup.State != ledger.Failed || dup.Message != "declined" || bad.Runs.Load() != 1):
			t.Errorf("%s after a recorded error: %v, %d runs; want *DuplicateError with the message, 1 run", p, err, bad.Runs.Load())
		case !wantReject && (err == nil || errors.As(err, &dup) || bad.Runs.Load() != 2):
			t.Errorf("%s after a recorded error: %v, %d runs; want it run again", p, err, bad.Runs.Load())
		}
	}
}

func payloadMismatch(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, nil)
	var c Charger
	type req struct{ Amount int }
	if _, err := idempotency.Do(context.Background(), s, "order-pay", c.Charge(100), &idempotency.CallOptions{Payload: req{100}}); err != nil {
		t.Fatal(err)
	}
	if res, err := idempotency.Do(context.Background(), s, "order-pay", c.Charge(100), &idempotency.CallOptions{Payload: req{100}}); err != nil || !res.Replayed {
		t.Fatalf("same payload: %+v %v, want replayed", res, err)
	}
	if _, err := idempotency.Do(context.Background(), s, "order-pay", c.Charge(999), &idempotency.CallOptions{Payload: req{999}}); !errors.Is(err, idempotency.ErrPayloadMismatch) {
		t.Fatalf("another payload: %v, want *PayloadMismatchError", err)
	}
	release, done := blocked(context.Background(), s, "order-pay-2", &c)
	if _, err := idempotency.Do(context.Background(), s, "order-pay-2", c.Charge(5), &idempotency.CallOptions{Payload: req{5}}); !errors.Is(err, idempotency.ErrPayloadMismatch) {
		t.Fatalf("another payload while in progress: %v, want *PayloadMismatchError", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c.Runs.Load() != 2 {
		t.Fatalf("%d runs, want 2 (no mismatched call ran)", c.Runs.Load())
	}
}

func recordExpires(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, &idempotency.Options{Retention: 24 * time.Hour})
	var c Charger
	if _, err := idempotency.Do(context.Background(), s, "order-ttl", c.Charge(1), nil); err != nil {
		t.Fatal(err)
	}
	r.Clock.Advance(23 * time.Hour)
	if res, err := idempotency.Do(context.Background(), s, "order-ttl", c.Charge(1), nil); err != nil || !res.Replayed {
		t.Fatalf("within retention: %+v %v", res, err)
	}
	r.Clock.Advance(2 * time.Hour)
	if res, err := idempotency.Do(context.Background(), s, "order-ttl", c.Charge(1), nil); err != nil || res.Replayed || c.Runs.Load() != 2 {
		t.Fatalf("after retention: %+v %v, %d runs; want a new run", res, err, c.Runs.Load())
	}
}

func resultTooLarge(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	s := r.Store(t, &idempotency.Options{MaxResultBytes: 64})
	var runs atomic.Int32
	big := func(context.Context) (string, error) {
		runs.Add(1)
		return fmt.Sprintf("%0100d", 1), nil
	}
	if _, err := idempotency.Do(context.Background(), s, "order-big", big, nil); !errors.Is(err, idempotency.ErrResultTooLarge) {
		t.Fatalf("first call: %v, want *ResultTooLargeError", err)
	}
	res, err := idempotency.Do(context.Background(), s, "order-big", big, nil)
	if !errors.Is(err, idempotency.ErrResultTooLarge) || !res.Replayed || runs.Load() != 1 {
		t.Fatalf("a repeat: %+v %v, %d runs; want *ResultTooLargeError replayed, 1 run", res, err, runs.Load())
	}
}

// The Backend's own contract: a write with another call's token changes
// nothing; an unscoped key is refused.
func foreignTokenChangesNothing(t *testing.T, nb NewBackend) {
	r := NewRig(t, nb)
	ctx := context.Background()
	kh := ledger.CallKey(r.fn, "h1")
	until := r.Clock.Now().Add(time.Minute)
	held, began, err := r.Backend.BeginCall(ctx, kh, "", ledger.RejectAlways, until, time.Second, time.Hour)
	if err != nil || !began || held.Token == "" {
		t.Fatalf("begin: %+v %v %v", held, began, err)
	}
	forged := held
	forged.Token = ledger.NewNonce()
	if _, err := r.Backend.RecordCall(ctx, forged, ledger.Succeeded, []byte(`"forged"`), "", until.Add(time.Hour)); !errors.Is(err, ledger.ErrCallTakenOver) {
		t.Fatalf("a record with another token: %v, want ErrCallTakenOver", err)
	}
	if err := r.Backend.ReleaseCall(ctx, forged); err != nil {
		t.Fatalf("a release with another token: %v, want nil", err)
	}
	cur, ok, err := r.Backend.GetCall(ctx, kh)
	if err != nil || !ok || cur.Token != held.Token || cur.State != ledger.Processing {
		t.Fatalf("after the forged writes: %+v %v %v; want the hold unchanged", cur, ok, err)
	}
	if _, again, err := r.Backend.BeginCall(ctx, kh, "", ledger.RejectAlways, until, time.Second, time.Hour); again || err != nil {
		t.Fatalf("a second begin while held: began %v, %v", again, err)
	}
	done, err := r.Backend.RecordCall(ctx, held, ledger.Succeeded, []byte(`"ok"`), "", until.Add(time.Hour))
	if err != nil || done.State != ledger.Succeeded {
		t.Fatalf("the holder's record: %+v %v", done, err)
	}
	if cur, ok, err := r.Backend.GetCall(ctx, kh); err != nil || !ok || string(cur.Result) != `"ok"` || cur.Token != done.Token {
		t.Fatalf("read back: %+v %v %v", cur, ok, err)
	}
	if _, _, err := r.Backend.BeginCall(ctx, "nohash", "", ledger.RejectAlways, until, time.Second, time.Hour); !errors.Is(err, ledger.ErrCallKeyUnscoped) {
		t.Fatalf("an unscoped key: %v, want ErrCallKeyUnscoped", err)
	}
}
