package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type memClock struct{ t atomic.Int64 }

func newMemClock(t time.Time) *memClock { c := &memClock{}; c.set(t); return c }
func (c *memClock) set(t time.Time)     { c.t.Store(t.UnixNano()) }
func (c *memClock) now() time.Time      { return time.Unix(0, c.t.Load()) }

func memStore(t *testing.T, b idempotency.Backend, fn string, now func() time.Time, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	opts.Backend, opts.Function, opts.Logger = b, fn, slog.New(slog.DiscardHandler)
	opts.Ledger.KeySecret, opts.Ledger.Now = []byte("k"), now
	s, err := idempotency.New(aws.Config{}, "", &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Promise (Backend doc): a hold is taken when "its Until is more than
// skew behind that clock"; a record expired when "ExpiresAt not after the
// Backend's clock"; GetCall "ok=false when there is none or it has
// expired". Exact boundaries on a MemoryBackend.
func TestAttackMemoryBoundaries(t *testing.T) {
	t.Parallel()
	clk := newMemClock(time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC))
	boundaries(t, idempotency.NewMemoryBackend(clk.now), clk)
}

// The same on the DynamoDB table (the reference the others keep).
func TestAttackDynamoDBBoundaries(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	clk := newMemClock(time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC))
	st, err := ledger.New(dynamodb.NewFromConfig(e.Cfg), e.Table, &ledger.Options{Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	boundaries(t, st, clk)
}

func boundaries(t *testing.T, b idempotency.Backend, clk *memClock) {
	ctx := context.Background()
	skew := time.Second
	until := clk.now().Add(time.Minute)
	kh := ledger.CallKey("fn"+ledger.NewNonce()[:6], "h1")
	if _, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, until, skew, time.Hour); err != nil || !began {
		t.Fatal(began, err)
	}
	for _, tc := range []struct {
		at   time.Duration
		take bool
	}{{skew - time.Nanosecond, false}, {skew, false}, {skew + time.Nanosecond, false}, {skew + 2*time.Millisecond, true}} { // whole ms: never early, at most 2 ms late (the Backend doc)
		clk.set(until.Add(tc.at))
		_, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour)
		if err != nil || began != tc.take {
			t.Fatalf("PROMISE BROKEN (taken only when Until is more than skew behind the clock): at until+%s began=%v %v", tc.at, began, err)
		}
	}
	kh2 := ledger.CallKey("fn"+ledger.NewNonce()[:6], "h2")
	h2, _, err := b.BeginCall(ctx, kh2, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	exp := clk.now().Add(2 * time.Hour).Truncate(time.Second)
	if _, err := b.RecordCall(ctx, h2, ledger.Succeeded, []byte(`1`), "", exp); err != nil {
		t.Fatal(err)
	}
	clk.set(exp.Add(-time.Nanosecond))
	if _, ok, err := b.GetCall(ctx, kh2); err != nil || !ok {
		t.Fatalf("PROMISE BROKEN (live until ExpiresAt): 1ns before: ok=%v %v", ok, err)
	}
	clk.set(exp)
	if _, ok, err := b.GetCall(ctx, kh2); err != nil || ok {
		t.Fatalf("PROMISE BROKEN (GetCall ok=false once expired): at ExpiresAt ok=%v %v", ok, err)
	}
}

// Promise (Backend doc: "of racing calls one runs"; MemoryBackend: "safe
// for concurrent use"): 32 goroutines on two Stores sharing one
// MemoryBackend, 50 keys.
// Promise (docs, How it compares: "a result that could not be recorded
// comes back with a *NotRecordedError (the function ran; ...)"; only "a
// result write whose reply was lost" and whose resend meets another's
// record is the success it was within the hold). A's clock is inside its
// hold; B's, further ahead than MaxClockSkew (documented: both run), takes
// the key and records. A's result write, its first send, meets B's
// record: A was not recorded and must be told so.
func TestAttackMemoryTakenOverWithinOwnHoldIsNotRecorded(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2033, 1, 1, 0, 0, 0, 0, time.UTC)
	aClk, bClk := newMemClock(t0), newMemClock(t0.Add(time.Minute+2*time.Second))
	takenOverWithinOwnHold(t, idempotency.NewMemoryBackend(bClk.now), t0, aClk, bClk) // the shared records, decided by the taker's clock
}

// The same on the DynamoDB table (the reference the others keep).
func TestAttackDynamoDBTakenOverWithinOwnHoldIsNotRecorded(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	t0 := time.Date(2033, 1, 1, 0, 0, 0, 0, time.UTC)
	aClk, bClk := newMemClock(t0), newMemClock(t0.Add(time.Minute+2*time.Second))
	st, err := ledger.New(dynamodb.NewFromConfig(e.Cfg), e.Table, &ledger.Options{Now: bClk.now})
	if err != nil {
		t.Fatal(err)
	}
	takenOverWithinOwnHold(t, st, t0, aClk, bClk)
}

func takenOverWithinOwnHold(t *testing.T, b idempotency.Backend, t0 time.Time, aClk, bClk *memClock) {
	a := memStore(t, b, "skewed", aClk.now, &idempotency.Options{Hold: time.Minute})
	bs := memStore(t, b, "skewed", bClk.now, &idempotency.Options{Hold: time.Minute})
	var ach, bch idemtest.Charger
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var res idempotency.Result[idemtest.Receipt]
	var err error
	bClk.set(t0) // the hold is written by A's time
	go func() {
		defer close(done)
		res, err = idempotency.Do(context.Background(), a, "order", func(ctx context.Context) (idemtest.Receipt, error) {
			close(started)
			<-release
			return ach.Charge(1)(ctx)
		}, nil)
	}()
	<-started
	bClk.set(t0.Add(time.Minute + 2*time.Second))
	if _, berr := idempotency.Do(context.Background(), bs, "order", bch.Charge(2), nil); berr != nil || bch.Runs.Load() != 1 {
		t.Fatalf("setup: B (clock beyond MaxClockSkew) did not take the key: %v", berr)
	}
	close(release)
	<-done
	if !errors.Is(err, idempotency.ErrNotRecorded) {
		rep, rerr := idempotency.Do(context.Background(), bs, "order", bch.Charge(3), nil)
		t.Fatalf("PROMISE BROKEN (a result that could not be recorded comes back with a *NotRecordedError): A's result met B's record on its first send and A got %+v err=%v; the key replays %+v (%v)", res, err, rep.Value, rerr)
	}
}

// Promise (MemoryBackend: "the same promises as the DynamoDB table's"):
// a recorded result is what was written, whatever the writer does with
// its buffer after, and whatever a reader does with what it read.
func TestAttackMemoryRecordIsACopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := idempotency.NewMemoryBackend(nil)
	kh := ledger.CallKey("fn", "copy")
	h, _, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, time.Now().Add(time.Minute), time.Second, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	buf := []byte(`{"a":1}`)
	if _, err := b.RecordCall(ctx, h, ledger.Succeeded, buf, "", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	buf[5] = '9'
	c, ok, err := b.GetCall(ctx, kh)
	if err != nil || !ok || string(c.Result) != `{"a":1}` {
		t.Fatalf("PROMISE BROKEN (a record is what was written): after the writer reused its buffer, GetCall reads %s", c.Result)
	}
	c.Result[5] = '8'
	c2, _, _ := b.GetCall(ctx, kh)
	if string(c2.Result) != `{"a":1}` {
		t.Fatalf("PROMISE BROKEN (a record is what was written): after a reader changed what it read, GetCall reads %s", c2.Result)
	}
}
