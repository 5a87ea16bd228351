package powertools_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/powertools"
	"github.com/nexjob/nexjob-aws/ledger"
)

// attackPeer runs one command on testdata/attack_peer.py or
// ts/attack_peer.mjs (real Powertools, installed by the package's tests),
// its answer decoded with its numbers exact.
func attackPeer(t *testing.T, side string, cmd map[string]any) map[string]any {
	t.Helper()
	return runPeer(t, side, "attack_peer", cmd)
}

type frozen struct{ t atomic.Int64 }

func newFrozen(t time.Time) *frozen { f := &frozen{}; f.set(t); return f }
func (f *frozen) set(t time.Time)   { f.t.Store(t.UnixNano()) }
func (f *frozen) now() time.Time    { return time.Unix(0, f.t.Load()) }

// pstore is a Store on a powertools.Backend (prefix "payments") reading
// now (nil: time.Now), on cfg's client.
func pstore(t *testing.T, cfg aws.Config, tbl string, d powertools.Dialect, now func() time.Time, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	b, err := powertools.New(cfg, &powertools.Options{Table: tbl, KeyPrefix: "payments", Dialect: d, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	opts.Backend, opts.Function, opts.Logger = b, "payments", slog.New(slog.DiscardHandler)
	if now != nil {
		opts.Ledger.Now = now
	}
	s, err := idempotency.New(cfg, "", &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var sides = []struct {
	name    string
	dialect powertools.Dialect
}{{"py", powertools.Python}, {"ts", powertools.TypeScript}}

// Promise (docs, One table): "a key one holds is in progress for the
// other". A Powertools in-progress record written without
// in_progress_expiration (Python's idempotent_function without
// register_lambda_context; TypeScript without a remaining time) is, for
// Powertools, held until its expiration: the Go side must not run.
// Promise (MaxClockSkew; Backend: "a hold lasts until its deadline plus
// MaxClockSkew"; One table: "a key one holds is in progress for the
// other"): Powertools' in-progress hold with in_progress_expiration E is
// refused by the Go side until E+MaxClockSkew by its clock, taken after.
// Promise (MaxClockSkew: "a process whose clock is ahead by less never
// takes a key still held"; One table: "a key one holds is in progress
// for the other"; Backend: "a hold lasts until its deadline plus
// MaxClockSkew"). Go holds (its clock frozen inside its hold); a Python
// Powertools host whose clock is 500ms ahead of Go's (< MaxClockSkew,
// 1s), past the hold's deadline by 300ms, calls the key.
func TestAttackPowertoolsPeerAheadWithinSkewTakesGoHold(t *testing.T) {
	t.Parallel()
	for _, side := range sides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			g := time.Now().Truncate(time.Millisecond)
			clk := newFrozen(g)
			s := pstore(t, cfg, tbl, side.dialect, clk.now, &idempotency.Options{Hold: 200 * time.Millisecond})
			key := "order-skew-" + ledger.NewNonce()[:6]
			started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			go func() {
				_, err := idempotency.Do(context.Background(), s, key, func(context.Context) (charge, error) {
					close(started)
					<-release
					return charge{Charge: "go_held"}, nil
				}, nil)
				done <- err
			}()
			<-started
			got := attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id",
				"event": map[string]any{"id": key}, "result": map[string]any{"charge": "pt"}, "now_ms": g.Add(500 * time.Millisecond).UnixMilli()})
			close(release)
			goErr := <-done
			if got["error"] != "IdempotencyAlreadyInProgressError" {
				after := attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id",
					"event": map[string]any{"id": key}, "result": map[string]any{"charge": "pt_again"}})
				t.Fatalf("PROMISE BROKEN (a process whose clock is ahead by less than MaxClockSkew never takes a key still held): Powertools (%s), 500ms ahead of Go's clock, took the key Go holds (Go's clock inside its 200ms hold): %v; Go's call then returned err=%v; the key now replays %v", side.name, got, goErr, after)
			}
		})
	}
}

// Promise (One table: "a key one ran is replayed to the other"): what
// Powertools recorded, replayed to Go as it was: null, a string, false,
// 0, [], nested numbers (beyond 2^53 from Python, whose ints are exact).
// Promise (One table: "a key one ran is replayed to the other"): what Go
// recorded, replayed to Powertools as it was.
// normal makes numbers comparable by value (1.5 and 1.50, 0 and 0.0).
// Promise (Key order does not matter; One table: "a payload one
// validated is refused to the other under another value" — and so
// accepted under the same): a payload object with its keys in another
// order on each side is the same payload.
// Promise (Numbers are exact; powertools doc: "an event's KeyPath value
// is hashed as its JSON"): Python keyed an event by an integer beyond
// 2^53; a Go Handler with the same KeyPath on the same event replays it,
// and on the neighbouring integer runs.
// Promise (docs: "every write (the hold, the result, the release) under
// a lost reply, a timeout and a throttle"): the Timeout fault (forwarded,
// applied, the client sees a network timeout) on each write of a
// powertools Store: a hold is the caller's and runs once, a result is
// recorded and replayed, a release frees the key.
