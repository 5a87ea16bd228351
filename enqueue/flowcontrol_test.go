package enqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// refused checks that err is an *InputError naming field.
func refused(t *testing.T, what string, err error, field string) {
	t.Helper()
	var in *enqueue.InputError
	if !errors.As(err, &in) || in.Field != field {
		t.Fatalf("%s: %v, want an *InputError on %s", what, err, field)
	}
}

// limited checks that err is a *RateLimitedError.
func limited(t *testing.T, what string, err error) {
	t.Helper()
	var rl *enqueue.RateLimitedError
	if !errors.As(err, &rl) {
		t.Fatalf("%s over its RateLimit: %v, want a *RateLimitedError", what, err)
	}
}

// TestFlowControlAtEveryEntryPoint: Opts.RateLimit and Opts.Debounce do
// at every entry point what they do at Enqueue, or are refused there
// with an *InputError naming the field and nothing written. EnqueueMany
// debounces its items (a burst in one call is one job, with the last
// item's args) and rate-limits them; EnqueueTx, ContinueWith and
// ContinueWhenAll take a rate-limit slot (one over the limit is a
// *RateLimitedError, no job written) and refuse Debounce (a transaction
// commits a new job, a continuation runs when its parents are done).
func TestFlowControlAtEveryEntryPoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	one := func(key string) *enqueue.RateLimit { return &enqueue.RateLimit{Key: key, Limit: 1, Period: time.Hour} }
	debounce := &enqueue.Debounce{Key: "burst", Period: time.Hour}

	t.Run("EnqueueMany", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
		var items []enqueue.Item
		for i := range 3 {
			items = append(items, enqueue.Item{Args: payment{OrderID: "d", Cents: i}, Opts: &enqueue.Opts{Debounce: debounce}})
		}
		out, err := c.EnqueueMany(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		if n := jobs(t, e); n != 1 {
			t.Fatalf("EnqueueMany of 3 items with one Debounce key: %d jobs, want 1", n)
		}
		for i, r := range out {
			if r.ID != out[0].ID || !r.Recorded || !r.Sent || r.Folded != (i > 0) {
				t.Fatalf("item %d: %+v, want the window's job %s (folded after the first)", i, r, out[0].ID)
			}
		}
		if rec := e.Get(t, out[0].ID); rec.Args != `{"orderId":"d","cents":2}` {
			t.Fatalf("the job's args %s, want the last item's", rec.Args)
		}
		checkMessages(t, e, 1)
		out, err = c.EnqueueMany(ctx, []enqueue.Item{
			{Args: payment{OrderID: "r1"}, Opts: &enqueue.Opts{RateLimit: one("many")}},
			{Args: payment{OrderID: "r2"}, Opts: &enqueue.Opts{RateLimit: one("many")}},
		})
		var be *enqueue.BatchError
		if !errors.As(err, &be) || len(be.Failed) != 1 {
			t.Fatalf("two items under a limit of one: %v", err)
		}
		limited(t, "an EnqueueMany item", out[be.Failed[0]].Err)
		if n := jobs(t, e); n != 2 {
			t.Fatalf("%d jobs, want 2", n)
		}
	})

	// A fold is an accepted enqueue: it takes its slot too.
	t.Run("a debounced fold", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
		opts := &enqueue.Opts{Debounce: debounce, RateLimit: one("fold")}
		first, err := c.Enqueue(ctx, payment{OrderID: "1"}, opts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Enqueue(ctx, payment{OrderID: "2"}, opts)
		limited(t, "a fold", err)
		if rec := e.Get(t, first.ID); rec.Args != `{"orderId":"1","cents":0}` {
			t.Fatalf("a refused fold wrote its args: %s", rec.Args)
		}
	})

	t.Run("EnqueueTx", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
		orders := ordersTable(t, e)
		tx, err := c.EnqueueTx(ctx, payment{OrderID: "1"}, &enqueue.Opts{RateLimit: one("tx")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Settle(ctx, tx, commit(ctx, e.DB, orders, "1", tx)); err != nil {
			t.Fatal(err)
		}
		_, err = c.EnqueueTx(ctx, payment{OrderID: "2"}, &enqueue.Opts{RateLimit: one("tx")})
		limited(t, "EnqueueTx", err)
		_, err = c.EnqueueTx(ctx, payment{OrderID: "3"}, &enqueue.Opts{Debounce: debounce})
		refused(t, "EnqueueTx with Debounce", err, "Debounce")
		if n := jobs(t, e); n != 1 {
			t.Fatalf("%d jobs, want 1", n)
		}
	})

	t.Run("continuations", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
		a, _ := c.Enqueue(ctx, payment{OrderID: "a"}, nil)
		b, _ := c.Enqueue(ctx, payment{OrderID: "b"}, nil)
		if _, err := c.ContinueWith(ctx, a.ID, payment{OrderID: "c1"}, &enqueue.Opts{RateLimit: one("with")}); err != nil {
			t.Fatal(err)
		}
		_, err := c.ContinueWith(ctx, a.ID, payment{OrderID: "c2"}, &enqueue.Opts{RateLimit: one("with")})
		limited(t, "ContinueWith", err)
		if _, err := c.ContinueWhenAll(ctx, []string{a.ID, b.ID}, payment{OrderID: "f1"}, &enqueue.Opts{RateLimit: one("all")}); err != nil {
			t.Fatal(err)
		}
		_, err = c.ContinueWhenAll(ctx, []string{a.ID, b.ID}, payment{OrderID: "f2"}, &enqueue.Opts{RateLimit: one("all")})
		limited(t, "ContinueWhenAll", err)
		_, err = c.ContinueWith(ctx, a.ID, payment{OrderID: "d1"}, &enqueue.Opts{Debounce: debounce})
		refused(t, "ContinueWith with Debounce", err, "Debounce")
		_, err = c.ContinueWhenAll(ctx, []string{a.ID, b.ID}, payment{OrderID: "d2"}, &enqueue.Opts{Debounce: debounce})
		refused(t, "ContinueWhenAll with Debounce", err, "Debounce")
		if n := jobs(t, e); n != 4 {
			t.Fatalf("%d jobs, want the 2 parents and 2 children", n)
		}
		if rec := e.Get(t, a.ID); len(rec.Children) != 2 {
			t.Fatalf("parent a has %d children, want 2", len(rec.Children))
		}
	})

	// A continuation's slot, applied with its reply lost, is taken once;
	// throttled past the retries it is the call's error, no child is
	// written, no slot taken.
	t.Run("continuation's slot under faults", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c, ft := faultyClient(t, e)
		parent, err := c.Enqueue(ctx, payment{OrderID: "p"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		two := &enqueue.RateLimit{Key: "lost", Limit: 2, Period: time.Hour}
		h := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.LostReply})
		if _, err := c.ContinueWith(ctx, parent.ID, payment{OrderID: "1"}, &enqueue.Opts{RateLimit: two}); err != nil || h.Fired() != 1 {
			t.Fatalf("the slot's reply lost: %v (fired %d)", err, h.Fired())
		}
		if _, err := c.ContinueWith(ctx, parent.ID, payment{OrderID: "2"}, &enqueue.Opts{RateLimit: two}); err != nil {
			t.Fatalf("the second of two: %v (the lost reply took two slots)", err)
		}
		_, err = c.ContinueWith(ctx, parent.ID, payment{OrderID: "3"}, &enqueue.Opts{RateLimit: two})
		limited(t, "the third ContinueWith", err)
		h = ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts})
		var rl *enqueue.RateLimitedError
		if _, err := c.ContinueWith(ctx, parent.ID, payment{OrderID: "4"}, &enqueue.Opts{RateLimit: one("throttled")}); err == nil || errors.As(err, &rl) || h.Fired() != faults.Attempts {
			t.Fatalf("the slot throttled past the retries: %v (fired %d), want the throttle", err, h.Fired())
		}
		if n := jobs(t, e); n != 3 {
			t.Fatalf("%d jobs, want the parent and 2 children", n)
		}
		if _, err := c.ContinueWith(ctx, parent.ID, payment{OrderID: "5"}, &enqueue.Opts{RateLimit: one("throttled")}); err != nil {
			t.Fatalf("after the throttle: %v (the throttled call took the slot)", err)
		}
		if rec := e.Get(t, parent.ID); len(rec.Children) != 3 || rec.State != ledger.Enqueued {
			t.Fatalf("parent: %d children, %s", len(rec.Children), rec.State)
		}
	})
}
