package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// A key's slots: Limit holders at once, a holder again keeps its slot, a
// released slot is free at once, and a holder whose lease ended frees its
// slot by itself; another key has its own.
func TestAcquireHoldsTheLimit(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	s, clock := clockedStore(t, e.DB, e.Table, start)
	key := s.HashKey("tenant-1")
	lease := func(d time.Duration) time.Time { return s.Now().Add(d) }
	for _, h := range []string{"a.1", "b.1"} {
		if ok, _, err := s.Acquire(ctx, key, h, 2, lease(time.Minute)); err != nil || !ok {
			t.Fatalf("%s: ok %v err %v", h, ok, err)
		}
	}
	c, err := s.AcquireQueued(ctx, key, "c.1", 2, lease(time.Minute), ledger.Waiting{Grace: time.Minute})
	if err != nil || c.OK || !c.FreeAt.Equal(start.Add(time.Minute)) || c.Ticket == 0 {
		t.Fatalf("a third holder: %+v err %v, want refused until %v with a ticket", c, err, start.Add(time.Minute))
	}
	if ok, _, err := s.Acquire(ctx, key, "a.1", 2, lease(time.Minute)); err != nil || !ok {
		t.Fatalf("a holder again: ok %v err %v", ok, err)
	}
	if ok, _, err := s.Acquire(ctx, s.HashKey("tenant-2"), "c.1", 2, lease(time.Minute)); err != nil || !ok {
		t.Fatalf("another key: ok %v err %v", ok, err)
	}
	if wake, err := s.ReleaseSlot(ctx, key, "a.1", 2, time.Minute); err != nil || len(wake) != 1 || wake[0] != c.Ticket {
		t.Fatalf("a release with c.1 waiting: wake %v err %v, want c.1's ticket %d", wake, err, c.Ticket)
	}
	if wake, err := s.ReleaseSlot(ctx, key, "a.1", 2, time.Minute); err != nil || len(wake) != 0 {
		t.Fatalf("a second release: wake %v err %v", wake, err)
	}
	if ok, _, _ := s.Acquire(ctx, key, "x.1", 2, lease(time.Minute)); ok {
		t.Fatal("a newcomer took the slot reserved for c.1")
	}
	if a, err := s.AcquireQueued(ctx, key, "c.1", 2, lease(10*time.Minute), ledger.Waiting{Ticket: c.Ticket, Grace: time.Minute}); err != nil || !a.OK {
		t.Fatalf("c.1 after a release: %+v err %v", a, err)
	}
	// b.1's holder crashed: its lease ends and its slot is free.
	d, _ := s.AcquireQueued(ctx, key, "d.1", 2, lease(time.Minute), ledger.Waiting{Grace: time.Minute})
	if d.OK {
		t.Fatal("a third holder while b.1's lease lasts")
	}
	clock.Add(int64(time.Minute))
	// x.1 came first: the slot b.1's lease freed is reserved for it, and
	// d.1 waits on.
	if a, err := s.AcquireQueued(ctx, key, "d.1", 2, lease(time.Minute), ledger.Waiting{Ticket: d.Ticket, Grace: time.Minute}); err != nil || a.OK || len(a.Wake) != 1 || a.Ticket != d.Ticket {
		t.Fatalf("d.1 after b.1's lease ended: %+v err %v, want refused, x.1 woken, its ticket kept", a, err)
	}
	clock.Add(int64(time.Minute)) // x.1 never came: its reservation ends, and d.1 is next
	if a, err := s.AcquireQueued(ctx, key, "d.1", 2, lease(time.Minute), ledger.Waiting{Ticket: d.Ticket, Grace: time.Minute}); err != nil || !a.OK {
		t.Fatalf("d.1 after x.1's reservation ended: %+v err %v", a, err)
	}
	if _, err := s.ReleaseSlot(ctx, s.HashKey("never-used"), "x.1", 2, time.Minute); err != nil {
		t.Fatalf("releasing on a key never used: %v", err)
	}
	if _, _, err := s.Acquire(ctx, key, "e.1", 0, lease(time.Minute)); err == nil {
		t.Fatal("a zero limit was accepted")
	}
}

// The put applied and its reply was lost, or timed out: the resend fails
// its version condition, the read shows the holder: one slot, held. A
// throttle through the SDK's retries is an error and holds nothing; a
// release whose reply was lost is done.
func TestAcquireUnderFaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	ft, cfg := e.Faulty()
	s, err := ledger.New(dynamodb.NewFromConfig(cfg), e.Table, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := s.HashKey("k")
	until := s.Now().Add(time.Hour)
	for _, f := range []faults.Fault{faults.LostReply, faults.Timeout} {
		h := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: f})
		if ok, _, err := s.Acquire(ctx, key, f.String(), 2, until); err != nil || !ok {
			t.Fatalf("%s: ok %v, err %v", f, ok, err)
		}
		if h.Fired() != 1 {
			t.Fatalf("%s: the fault did not fire", f)
		}
	}
	third, err := s.AcquireQueued(ctx, key, "third", 2, until, ledger.Waiting{Grace: time.Minute})
	if err != nil || third.OK {
		t.Fatalf("after two lost replies the key holds more than two: %+v err %v", third, err)
	}
	h := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	if _, err := s.ReleaseSlot(ctx, key, faults.LostReply.String(), 2, time.Minute); err != nil || h.Fired() != 1 {
		t.Fatalf("a release whose reply was lost: %v (fired %d)", err, h.Fired())
	}
	if a, err := s.AcquireQueued(ctx, key, "third", 2, until, ledger.Waiting{Ticket: third.Ticket, Grace: time.Minute}); err != nil || !a.OK {
		t.Fatalf("the lost-reply release did not free the slot: %+v err %v", a, err)
	}
	ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts})
	other := s.HashKey("other")
	if _, _, err := s.Acquire(ctx, other, "a", 1, until); err == nil || errors.Is(err, ledger.ErrContended) {
		t.Fatalf("a throttle past the retries: %v, want the throttle", err)
	}
	if ok, _, err := s.Acquire(ctx, other, "b", 1, until); err != nil || !ok {
		t.Fatalf("the throttled acquire holds a slot: ok %v err %v", ok, err)
	}
}

// A reservation held for its waiter lasts to the time given, never less:
// a waiter not woken has none to hold (nothing written), and a holder
// taking the reserved slot after the reservation's own end finds it.
func TestHoldReservation(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	s, clock := clockedStore(t, e.DB, e.Table, start)
	key := s.HashKey("tenant-1")
	if ok, _, err := s.Acquire(ctx, key, "a.1", 1, s.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("a.1: ok %v err %v", ok, err)
	}
	w, err := s.AcquireQueued(ctx, key, "w.1", 1, s.Now().Add(time.Minute), ledger.Waiting{Grace: time.Minute})
	if err != nil || w.OK {
		t.Fatalf("a waiter: %+v err %v", w, err)
	}
	if held, err := s.HoldReservation(ctx, key, w.Ticket, s.Now().Add(5*time.Minute)); err != nil || held {
		t.Fatalf("holding for a waiter not woken: held %v err %v, want false", held, err)
	}
	if wake, err := s.ReleaseSlot(ctx, key, "a.1", 1, time.Minute); err != nil || len(wake) != 1 {
		t.Fatalf("release: wake %v err %v", wake, err)
	}
	if held, err := s.HoldReservation(ctx, key, w.Ticket, s.Now().Add(5*time.Minute)); err != nil || !held {
		t.Fatalf("holding for the woken waiter: held %v err %v", held, err)
	}
	if held, err := s.HoldReservation(ctx, key, w.Ticket, s.Now().Add(2*time.Minute)); err != nil || !held {
		t.Fatalf("holding it shorter: held %v err %v", held, err)
	}
	clock.Add(int64(4 * time.Minute)) // past the grace of the hand-over and the shorter hold
	if ok, _, _ := s.Acquire(ctx, key, "x.1", 1, s.Now().Add(time.Minute)); ok {
		t.Fatal("a newcomer took the slot held for the waiter")
	}
	if a, err := s.AcquireQueued(ctx, key, "w.1", 1, s.Now().Add(time.Minute), ledger.Waiting{Ticket: w.Ticket, Grace: time.Minute}); err != nil || !a.OK {
		t.Fatalf("the waiter, 4 minutes on: %+v err %v", a, err)
	}
}
