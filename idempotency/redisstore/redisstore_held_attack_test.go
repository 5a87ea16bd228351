package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
	"github.com/nexjob/nexjob-aws/idempotency/redisstore"
	"github.com/nexjob/nexjob-aws/ledger"
)

func TestAttackRedisACLUserAsDocumented(t *testing.T) {
	t.Parallel()
	admin := client(t)
	ctx := context.Background()
	fn := "acl" + ledger.NewNonce()[:8]
	pw := ledger.NewNonce()
	if err := admin.Do(ctx, "ACL", "SETUSER", fn, "on", ">"+pw, "~nexjob:idempotency:"+fn+"#*", "+@read", "+@write", "+@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", fn).Err() })
	f := &faults{lose: map[string]int{}}
	user := redis.NewClient(&redis.Options{Addr: addr, Username: fn, Password: pw})
	user.AddHook(f)
	t.Cleanup(func() { _ = user.Close() })
	s := storeOn(t, user, fn, time.Now, nil)
	var ch idemtest.Charger
	first, err := idempotency.Do(ctx, s, "order-acl", ch.Charge(1), nil)
	if err != nil {
		t.Fatalf("PROMISE BROKEN (ACL user per function as documented): the function's own first call failed: %v", err)
	}
	again, err := idempotency.Do(ctx, s, "order-acl", ch.Charge(1), nil)
	if err != nil || !again.Replayed || again.Value != first.Value {
		t.Fatalf("PROMISE BROKEN (ACL user as documented): its own repeat: %+v %v", again, err)
	}
	bad := idemtest.Charger{Err: errors.New("declined")}
	if _, err := idempotency.Do(ctx, s, "order-acl-bad", bad.Charge(1), nil); err == nil || err.Error() != "declined" {
		t.Fatalf("PROMISE BROKEN (ACL user as documented): its own error release: %v", err)
	}
	f.mu.Lock()
	f.lose["begin"], f.lose["record"] = 1, 1
	f.mu.Unlock()
	var lost idemtest.Charger
	if res, err := idempotency.Do(ctx, s, "order-acl-lost", lost.Charge(1), nil); err != nil || lost.Runs.Load() != 1 {
		t.Fatalf("PROMISE BROKEN (ACL user as documented): lost replies read back: %+v %v", res, err)
	}
	// Another function's records are out of its reach.
	other := storeOn(t, user, fn+"x", time.Now, nil)
	var och idemtest.Charger
	if _, err := idempotency.Do(ctx, other, "order-acl", och.Charge(1), nil); err == nil || och.Runs.Load() != 0 {
		t.Fatalf("PROMISE BROKEN (ACL scoping): the user of %s wrote %sx's records: %v, %d runs", fn, fn, err, och.Runs.Load())
	}
}

func TestAttackRedisLostResultReplyThenReplaced(t *testing.T) {
	t.Parallel()
	for _, after := range []string{"held", "recorded", "released"} {
		t.Run(after, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			fn := "repl-" + ledger.NewNonce()[:8]
			p := ledger.AllowAfterFailed
			b := storeOn(t, client(t), fn, time.Now, &idempotency.Options{Policy: &p})
			var bch idemtest.Charger
			if after == "released" {
				bch.Err = errors.New("declined")
			}
			var bErr error
			release, bDone := make(chan struct{}), make(chan struct{})
			hook := &between{op: "record", fn: func() {
				if after == "held" {
					started := make(chan struct{})
					go func() {
						defer close(bDone)
						_, bErr = idempotency.Do(ctx, b, "order-repl", func(ctx context.Context) (idemtest.Receipt, error) {
							close(started)
							<-release
							return bch.Charge(2)(ctx)
						}, nil)
					}()
					<-started
					return
				}
				_, bErr = idempotency.Do(ctx, b, "order-repl", bch.Charge(2), nil)
				close(bDone)
			}}
			a := storeOn(t, client(t, hook), fn, time.Now, &idempotency.Options{Policy: &p})
			var ach idemtest.Charger
			res, err := idempotency.Do(ctx, a, "order-repl", ach.Charge(1), nil)
			close(release)
			<-bDone
			if bch.Runs.Load() != 1 {
				t.Fatalf("setup: B did not run between A's write and its read-back: %v", bErr)
			}
			if err != nil || res.Value.ChargeID != "ch_1" {
				t.Fatalf("PROMISE BROKEN (a lost result reply whose resend meets a record the policy replaced (%s) is the success it was while the hold lasts): A got %+v %v", after, res, err)
			}
		})
	}
}

type between struct {
	op   string
	fn   func()
	once sync.Once
}

func (h *between) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *between) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *between) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name(cmd) != h.op || (err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")) {
			return err
		}
		fired := false
		h.once.Do(func() { fired = true; h.fn() })
		if fired {
			err = errors.New("injected: i/o timeout, reply lost")
			cmd.SetErr(err)
		}
		return err
	}
}

func TestAttackRedisUnsentHoldWhileAnotherTakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fn := "unsent-" + ledger.NewNonce()[:8]
	b := storeOn(t, client(t), fn, time.Now, nil)
	var bch idemtest.Charger
	release, bDone := make(chan struct{}), make(chan error, 1)
	hook := &unsent{op: "begin", fn: func() {
		started := make(chan struct{})
		go func() {
			_, err := idempotency.Do(ctx, b, "order-unsent", func(ctx context.Context) (idemtest.Receipt, error) {
				close(started)
				<-release
				return bch.Charge(2)(ctx)
			}, nil)
			bDone <- err
		}()
		<-started
	}}
	a := storeOn(t, client(t, hook), fn, time.Now, nil)
	var ach idemtest.Charger
	_, err := idempotency.Do(ctx, a, "order-unsent", ach.Charge(1), nil)
	close(release)
	if berr := <-bDone; berr != nil {
		t.Fatal(berr)
	}
	if ach.Runs.Load() != 0 || err == nil {
		t.Fatalf("PROMISE BROKEN (never runs a function whose hold it did not see written): A ran %d times while B held the key: %v", ach.Runs.Load(), err)
	}
}

type unsent struct {
	op   string
	fn   func()
	once sync.Once
}

func (h *unsent) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *unsent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *unsent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name(cmd) == h.op {
			fired := false
			h.once.Do(func() { fired = true; h.fn() })
			if fired {
				err := errors.New("injected: connection reset, not sent")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func TestAttackRedisExpiryBoundary(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	skew := time.Second
	clk := newFrozen(time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC))
	b := redisstore.New(c, &redisstore.Options{Now: clk.now})
	kh2 := ledger.CallKey("bound-"+ledger.NewNonce()[:8], "h2")
	clk.set(time.Date(2031, 5, 6, 7, 8, 9, 300_000_000, time.UTC))
	h2, began, err := b.BeginCall(ctx, kh2, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour)
	if err != nil || !began {
		t.Fatal(began, err)
	}
	exp := time.Date(2031, 5, 6, 8, 0, 0, 0, time.UTC)
	if _, err := b.RecordCall(ctx, h2, ledger.Succeeded, []byte(`1`), "", exp); err != nil {
		t.Fatal(err)
	}
	clk.set(exp.Add(-time.Nanosecond))
	if _, ok, err := b.GetCall(ctx, kh2); err != nil || !ok {
		t.Fatalf("PROMISE BROKEN (live until ExpiresAt): GetCall 1ns before ExpiresAt: ok=%v %v", ok, err)
	}
	clk.set(exp)
	if got, ok, err := b.GetCall(ctx, kh2); err != nil || ok {
		t.Fatalf("PROMISE BROKEN (GetCall ok=false when expired; ExpiresAt not after the clock): at ExpiresAt: ok=%v %+v %v", ok, got, err)
	}
	if _, began, err := b.BeginCall(ctx, kh2, "", ledger.RejectAlways, clk.now().Add(time.Minute), skew, time.Hour); err != nil || !began {
		t.Fatalf("PROMISE BROKEN (BeginCall takes an expired record): at ExpiresAt: began=%v %v", began, err)
	}
}

func TestAttackRedisSkewedClocks(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	fn := "skew-" + ledger.NewNonce()[:8]
	t0 := time.Date(2032, 1, 1, 0, 0, 0, 0, time.UTC)
	aClk := newFrozen(t0)
	bClk := newFrozen(t0)
	hold := time.Minute
	a := storeOn(t, c, fn, aClk.now, &idempotency.Options{Hold: hold})
	b := storeOn(t, c, fn, bClk.now, &idempotency.Options{Hold: hold})
	var ach, bch idemtest.Charger
	release, done := make(chan struct{}), make(chan error, 1)
	started := make(chan struct{})
	go func() {
		_, err := idempotency.Do(ctx, a, "order-skew", func(ctx context.Context) (idemtest.Receipt, error) {
			close(started)
			<-release
			return ach.Charge(1)(ctx)
		}, nil)
		done <- err
	}()
	<-started
	// A's clock still inside its hold (by 1ms); B ahead by 999ms: in skew.
	aClk.set(t0.Add(hold - time.Millisecond))
	bClk.set(aClk.now().Add(999 * time.Millisecond))
	if _, err := idempotency.Do(ctx, b, "order-skew", bch.Charge(2), nil); !errors.Is(err, idempotency.ErrInProgress) || bch.Runs.Load() != 0 {
		t.Fatalf("PROMISE BROKEN (a process whose clock is ahead by less than MaxClockSkew never takes a key still held): B ran %d: %v", bch.Runs.Load(), err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("A's call after B was refused: %v", err)
	}
	res, err := idempotency.Do(ctx, b, "order-skew", bch.Charge(2), nil)
	if err != nil || !res.Replayed || res.Value.ChargeID != "ch_1" {
		t.Fatalf("B after A recorded: %+v %v", res, err)
	}
}

func TestAttackRedisHostileKeys(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	var printable strings.Builder
	for r := rune(0x20); r < 0x7f; r++ {
		printable.WriteRune(r)
	}
	keys := []string{
		printable.String(),
		"*", "?", "[a-z]", "\\", "nexjob:idempotency:*", "]] end redis.call('FLUSHALL') --",
		"a\x00b", "a\x00c", "\r\n*1\r\n$8\r\nFLUSHALL\r\n",
		"ünïcödé 😀 \u2028", "\xff\xfe not utf-8",
		strings.Repeat("k", 1<<20),
	}
	fn := "hostile-" + ledger.NewNonce()[:8]
	s := storeOn(t, c, fn, time.Now, nil)
	var ch idemtest.Charger
	seen := map[string]string{}
	for i, k := range keys {
		res, err := idempotency.Do(ctx, s, k, ch.Charge(i), nil)
		if err != nil || res.Replayed {
			t.Fatalf("key %d (%.40q): %+v %v", i, k, res, err)
		}
		if prev, dup := seen[res.KeyHash]; dup {
			t.Fatalf("keys %.40q and %.40q share a record", prev, k)
		}
		seen[res.KeyHash] = k
	}
	for i, k := range keys {
		res, err := idempotency.Do(ctx, s, k, ch.Charge(i), nil)
		if err != nil || !res.Replayed || res.Value.Amount != i {
			t.Fatalf("PROMISE BROKEN (each key its own record, replayed): key %d (%.40q) repeat: %+v %v", i, k, res, err)
		}
	}
	all, err := c.Keys(ctx, redisstore.DefaultPrefix+fn+"#*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(keys) {
		t.Fatalf("records under %s: %d, want %d", fn, len(all), len(keys))
	}
	for _, k := range all {
		if len(k) > 200 || strings.ContainsAny(k, "*?[\x00\r\n ") {
			t.Fatalf("PROMISE BROKEN (no user string is ever a key): Redis key %.60q", k)
		}
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n == 0 {
		t.Fatalf("the server lost its keys: %d %v", n, err)
	}
}

func TestAttackRedisRaceTwoStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fn := "race-" + ledger.NewNonce()[:8]
	stores := []*idempotency.Store{storeOn(t, client(t), fn, time.Now, nil), storeOn(t, client(t), fn, time.Now, nil)}
	for round := 0; round < 20; round++ {
		var ch idemtest.Charger
		key := fmt.Sprintf("order-race-%d", round)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(s *idempotency.Store) {
				defer wg.Done()
				<-gate
				_, _ = idempotency.Do(ctx, s, key, ch.Charge(1), nil)
			}(stores[i%2])
		}
		close(gate)
		wg.Wait()
		if n := ch.Runs.Load(); n != 1 {
			t.Fatalf("PROMISE BROKEN (of racing calls one runs): %s ran %d times", key, n)
		}
	}
}
