package redisstore_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/redis/go-redis/v9"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
	"github.com/nexjob/nexjob-aws/idempotency/redisstore"
	"github.com/nexjob/nexjob-aws/ledger"
)

// frozen is a clock a test sets by hand.
type frozen struct{ t atomic.Int64 }

func newFrozen(t time.Time) *frozen { f := &frozen{}; f.set(t); return f }
func (f *frozen) set(t time.Time)   { f.t.Store(t.UnixNano()) }
func (f *frozen) now() time.Time    { return time.Unix(0, f.t.Load()) }

// storeOn is a Store on its own redisstore.Backend (on c) reading now,
// under function fn.
func storeOn(t *testing.T, c redis.UniversalClient, fn string, now func() time.Time, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	opts.Backend = redisstore.New(c, &redisstore.Options{Now: now})
	opts.Function = fn
	opts.Ledger.KeySecret = []byte("test")
	opts.Ledger.Now = now
	opts.Logger = slog.New(slog.DiscardHandler)
	s, err := idempotency.New(aws.Config{}, "", &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Promise (package doc): "a hold, an expiry and a DuplicatePolicy are
// decided by the caller's clock as on DynamoDB (Options.Now; the
// server's clock only removes the record, at its retention's
// end)", and Options.Now: "give it the Store's ... in tests". A test
// clock fixed at a date (as tests' clocks are) must keep the record for
// its retention by that clock: a repeat is replayed.
func TestAttackRedisFixedTestClockKeepsRecords(t *testing.T) {
	t.Parallel()
	c := client(t)
	clk := newFrozen(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))
	s := storeOn(t, c, "fixed-"+ledger.NewNonce()[:8], clk.now, nil)
	var ch idemtest.Charger
	ctx := context.Background()
	first, err := idempotency.Do(ctx, s, "order-fixed-clock", ch.Charge(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := idempotency.Do(ctx, s, "order-fixed-clock", ch.Charge(1), nil)
	if err != nil || !again.Replayed || ch.Runs.Load() != 1 {
		n, _ := c.Exists(ctx, redisstore.DefaultPrefix+first.KeyHash).Result()
		t.Fatalf("PROMISE BROKEN (expiry decided by the caller's clock; the server's only removes the record at its retention's end): a repeat 0s later by a fixed test clock (2024-01-02) ran again: %+v %v, %d runs, record exists=%d", again, err, ch.Runs.Load(), n)
	}
}

// Promise (package doc, Scoping): "a Redis ACL user per function limited
// to that key pattern (ACL SETUSER charge on >… ~nexjob:idempotency:charge#*
// +@read +@write +@scripting) keeps one function from another's records".
// The user as documented must be able to do every path of its own
// function (first call, repeat, an error released, a lost reply read
// back) and none of another's.
// Promise (Backend doc, store.go): "RecordCall ... a resend of its own
// applied write reads as done (the outcome's token, kept as Token or
// Prev)" and docs/idempotency.md: "A result write whose reply was lost
// and whose resend meets a record that is no longer the call's (later
// calls the policy let in replaced the outcome, or took it and released
// it) is the success it was while the call's hold lasts". A's result
// write applies, its reply is lost; before A reads back, B (AllowAfterFailed:
// a result runs again) takes the key, and then records or releases it.
// between is a hook that, on the first command named op, forwards it,
// runs fn, then answers a lost reply.
// Promise (Backend doc): the Store "never runs a function whose hold it
// did not see written". A hold refused unsent while another process takes
// the key, then read back (the read succeeds): the read shows another's
// hold; ours must not run.
// Promise (idemtest/Backend doc): "a hold refuses repeats until its
// deadline plus MaxClockSkew by the Backend's clock", taken only when
// "Until is more than skew behind that clock"; a record expired when
// "ExpiresAt not after the Backend's clock". Exact boundaries, with a
// hold whose deadline is not on a whole millisecond.
func TestAttackRedisHoldBoundarySubMillisecond(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	clk := newFrozen(time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC))
	b := redisstore.New(c, &redisstore.Options{Now: clk.now})
	skew := time.Second
	until := clk.now().Add(time.Minute + 700*time.Microsecond)
	kh := ledger.CallKey("bound-"+ledger.NewNonce()[:8], "h1")
	held, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, until, skew, time.Hour)
	if err != nil || !began {
		t.Fatal(began, err)
	}
	clk.set(until.Add(skew - time.Millisecond)) // a millisecond inside
	if got, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour); err != nil || began {
		t.Fatalf("PROMISE BROKEN (a hold refuses repeats until its deadline plus MaxClockSkew): at until+skew-1ms the key was taken: %+v %v", got, err)
	}
	clk.set(until.Add(skew - time.Nanosecond)) // less than skew behind
	if got, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour); err != nil || began {
		t.Fatalf("PROMISE BROKEN (a hold refuses repeats until its deadline plus MaxClockSkew): at until+skew-1ns the key was taken: %+v %v", got, err)
	}
	clk.set(until.Add(skew)) // exactly skew behind: not more
	if got, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour); err != nil || began {
		t.Fatalf("PROMISE BROKEN (a hold refuses repeats until its deadline plus MaxClockSkew): at until+skew exactly the key was taken: %+v %v (held until %s)", got, err, held.Until.Format(time.RFC3339Nano))
	}
	clk.set(until.Add(skew + 2*time.Millisecond)) // whole ms: taken at most 2 ms late (the Backend doc)
	if _, began, err := b.BeginCall(ctx, kh, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour); err != nil || !began {
		t.Fatalf("PROMISE BROKEN (taken when Until is more than skew behind, in whole ms): at until+skew+2ms: began=%v %v", began, err)
	}
}

// Promise (Backend doc): a record is expired when "ExpiresAt not after
// the Backend's clock": GetCall ok=false, BeginCall takes it. A recorded
// outcome with ExpiresAt E (whole seconds) is live at E-1ns and gone at E.
// Promise (MaxClockSkew): "a process whose clock is ahead by less never
// takes a key still held"; (package doc) holds "decided by the caller's
// clock". Two Backends on one server, B's clock ahead of A's by less than
// MaxClockSkew, then by more.
// Promise (package doc): "Keys are hashed before they reach Redis: no
// user string is ever a key, a pattern or a script." Keys with every
// printable ASCII character, glob and Lua metacharacters, NUL, unicode,
// and a 1 MiB key: each its own record, replayed, and no Redis key holds
// the raw key.
// Promise (Backend doc): "of racing calls one runs", with many
// goroutines on two Stores (two Backends, two clients) on one server.
