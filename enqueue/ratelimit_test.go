package enqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
)

// jobs counts the table's job records (not rate or concurrency items).
func jobs(t *testing.T, e *awstest.Env) int {
	t.Helper()
	n := 0
	for _, r := range e.Records(t) {
		if r.ID != "" {
			n++
		}
	}
	return n
}

// Limit enqueues per Period per key: the one over is refused with a
// *RateLimitedError naming when a slot frees, and writes no job and
// sends nothing; another key has its own limit; a keyed enqueue retried
// counts once; a bad RateLimit is an *InputError.
func TestRateLimitRefusesOverTheLimit(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	c := e.Client
	rl := &enqueue.RateLimit{Key: "tenant-1", Limit: 3, Period: time.Hour}
	first := c.Store().Now()
	for i := range 3 {
		if _, err := c.Enqueue(ctx, payment{OrderID: "a", Cents: i}, &enqueue.Opts{RateLimit: rl}); err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
	}
	_, err := c.Enqueue(ctx, payment{OrderID: "a", Cents: 4}, &enqueue.Opts{RateLimit: rl})
	var limited *enqueue.RateLimitedError
	if !errors.As(err, &limited) || limited.RetryAt.Before(first.Add(time.Hour)) || limited.RetryAt.After(c.Store().Now().Add(time.Hour)) {
		t.Fatalf("the fourth in the hour: %v, want a *RateLimitedError retrying in an hour", err)
	}
	if n := jobs(t, e); n != 3 {
		t.Fatalf("%d jobs written, want 3: the refused one wrote", n)
	}
	checkMessages(t, e, 3)
	if _, err := c.Enqueue(ctx, payment{OrderID: "b"}, &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: "tenant-2", Limit: 1, Period: time.Hour}}); err != nil {
		t.Fatalf("another key: %v", err)
	}
	keyed := &enqueue.Opts{IdempotencyKey: "order-9", RateLimit: &enqueue.RateLimit{Key: "tenant-3", Limit: 1, Period: time.Hour}}
	a, err := c.Enqueue(ctx, payment{OrderID: "9"}, keyed)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.Enqueue(ctx, payment{OrderID: "9"}, keyed); err != nil || !b.Duplicate || b.ID != a.ID {
		t.Fatalf("the same keyed enqueue again: %+v %v, want the duplicate", b, err)
	}
	for _, bad := range []*enqueue.RateLimit{{Key: "", Limit: 1, Period: time.Hour}, {Key: "k", Limit: 0, Period: time.Hour}, {Key: "k", Limit: 1, Period: time.Millisecond}} {
		if _, err := c.Enqueue(ctx, payment{OrderID: "x"}, &enqueue.Opts{RateLimit: bad}); !errors.Is(err, enqueue.ErrInvalidInput) {
			t.Errorf("RateLimit %+v: %v, want an *InputError", bad, err)
		}
	}
}

// The slot's put applied and its reply was lost: the enqueue is accepted
// and took one slot, not two. A throttle past the SDK's retries is the
// enqueue's error, writes no job and takes no slot.
func TestRateLimitUnderFaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	c, ft := faultyClient(t, e)
	rl := &enqueue.RateLimit{Key: "lost", Limit: 2, Period: time.Hour}
	h := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Skip: 0, Fault: faults.LostReply})
	if _, err := c.Enqueue(ctx, payment{OrderID: "1"}, &enqueue.Opts{RateLimit: rl}); err != nil || h.Fired() != 1 {
		t.Fatalf("after a lost reply: %v (fired %d)", err, h.Fired())
	}
	if _, err := c.Enqueue(ctx, payment{OrderID: "2"}, &enqueue.Opts{RateLimit: rl}); err != nil {
		t.Fatalf("the second of two: %v (the lost reply took two slots)", err)
	}
	var limited *enqueue.RateLimitedError
	if _, err := c.Enqueue(ctx, payment{OrderID: "3"}, &enqueue.Opts{RateLimit: rl}); !errors.As(err, &limited) {
		t.Fatalf("the third of two: %v", err)
	}
	one := &enqueue.RateLimit{Key: "throttled", Limit: 1, Period: time.Hour}
	ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts})
	if _, err := c.Enqueue(ctx, payment{OrderID: "4"}, &enqueue.Opts{RateLimit: one}); err == nil || errors.As(err, &limited) {
		t.Fatalf("a throttle past the retries: %v, want the throttle", err)
	}
	if n := jobs(t, e); n != 2 {
		t.Fatalf("%d jobs, want 2", n)
	}
	if _, err := c.Enqueue(ctx, payment{OrderID: "5"}, &enqueue.Opts{RateLimit: one}); err != nil {
		t.Fatalf("after the throttle: %v (the throttled enqueue took the slot)", err)
	}
}
