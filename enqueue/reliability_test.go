package enqueue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// faultyClient is a producer whose AWS requests go through a fault
// transport to the test's own table and queue.
func faultyClient(t *testing.T, e *awstest.Env) (*enqueue.Client, *faults.Transport) {
	t.Helper()
	ft, cfg := e.Faulty()
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	return c, ft
}

// TestEnqueueWhenRepliesAreLost (issue 9, scenarios 1 and 2): the write is
// applied, its reply is lost (500 or a timeout), the SDK resends it and the
// condition fails against our own record. That is a new job, not a
// duplicate and not an error: one record, one message.
func TestEnqueueWhenRepliesAreLost(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Timeout} {
		for _, key := range []string{"payment-1001", ""} {
			t.Run(fmt.Sprintf("%s/key=%q", f, key), func(t *testing.T) {
				t.Parallel()
				e := awstest.New(t, nil)
				c, ft := faultyClient(t, e)
				h := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: f})
				res, err := c.Enqueue(context.Background(), payment{OrderID: "1001", Cents: 500}, &enqueue.Opts{IdempotencyKey: key})
				if err != nil {
					t.Fatalf("enqueue after a %s: %v", f, err)
				}
				if h.Fired() != 1 {
					t.Fatalf("fault fired %d times", h.Fired())
				}
				if res.Duplicate {
					t.Fatalf("our own new job %s reported as a duplicate", res.ID)
				}
				recs := e.Records(t)
				if len(recs) != 1 || recs[0].ID != res.ID || recs[0].State != ledger.Enqueued {
					t.Fatalf("records %+v, want one Enqueued %s", recs, res.ID)
				}
				checkMessages(t, e, 1)
			})
		}
	}
}

// TestEnqueueThrottledPastTheRetries: a PutItem throttled through the SDK's
// whole budget is an error with nothing written; the caller's retry makes
// the one job. A SendMessage throttled so is a *DispatchError, and the
// caller's retry of the key sends it at once.
func TestEnqueueThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("PutItem", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c, ft := faultyClient(t, e)
		ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts})
		opts := &enqueue.Opts{IdempotencyKey: "payment-1002"}
		if _, err := c.Enqueue(ctx, payment{OrderID: "1002"}, opts); err == nil {
			t.Fatal("throttled past the retries, yet no error")
		}
		if n := len(e.Records(t)); n != 0 {
			t.Fatalf("%d records after a refused write", n)
		}
		res, err := c.Enqueue(ctx, payment{OrderID: "1002"}, opts)
		if err != nil || res.Duplicate {
			t.Fatalf("retry: %+v, %v", res, err)
		}
		checkMessages(t, e, 1)
	})
	t.Run("SendMessage", func(t *testing.T) {
		t.Parallel()
		e := awstest.New(t, nil)
		c, ft := faultyClient(t, e)
		ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
		opts := &enqueue.Opts{IdempotencyKey: "payment-1003"}
		_, err := c.Enqueue(ctx, payment{OrderID: "1003"}, opts)
		var de *enqueue.DispatchError
		if !errors.As(err, &de) {
			t.Fatalf("got %v, want a *DispatchError", err)
		}
		res, err := c.Enqueue(ctx, payment{OrderID: "1003"}, opts)
		if err != nil || !res.Duplicate || !res.Redispatched || res.ID != de.JobID {
			t.Fatalf("retry: %+v, %v; want the same job re-sent", res, err)
		}
		checkMessages(t, e, 1)
	})
}

// TestCallerContextEndsBetweenWriteAndSend (scenario 18): the caller's
// context ends once the ledger write is applied, so the send fails. The
// unsent mark must still be written, and the caller's retry of the key
// re-sends at once.
func TestCallerContextEndsBetweenWriteAndSend(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Pass, After: cancel})
	opts := &enqueue.Opts{IdempotencyKey: "receipt-77"}
	_, err := c.Enqueue(ctx, payment{OrderID: "77"}, opts)
	var de *enqueue.DispatchError
	if !errors.As(err, &de) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want a *DispatchError for the cancelled send", err)
	}
	rec, err := c.Store().Get(context.Background(), de.JobID)
	if err != nil || !rec.Undispatched {
		t.Fatalf("record %+v (%v): the unsent mark was not written", rec, err)
	}
	res, err := c.Enqueue(context.Background(), payment{OrderID: "77"}, opts)
	if err != nil || !res.Redispatched {
		t.Fatalf("caller's retry: %+v, %v; want an immediate re-send", res, err)
	}
	checkMessages(t, e, 1)
}

// TestRequeueWhenReplyIsLost (scenario 8): the requeue is applied, its
// reply lost; the SDK's resend finds the job Enqueued. That is our own
// requeue: it succeeds and sends.
func TestRequeueWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	staged := stage(t, newClient(t, e, &enqueue.ClientOptions{Logger: quietLog}), "report-9", ledger.Failed, time.Time{})
	e.Purge(t, e.QueueURL)
	ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	res, err := c.Requeue(context.Background(), staged.ID)
	if err != nil || res.State != ledger.Enqueued {
		t.Fatalf("requeue after a lost reply: %+v, %v", res, err)
	}
	checkMessages(t, e, 1)
}

// TestReuseRetriesTransactionConflict: a TransactionConflict on the re-use
// path is a lost race, decided again, never an error to the enqueuer.
func TestReuseRetriesTransactionConflict(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	stage(t, newClient(t, e, &enqueue.ClientOptions{Logger: quietLog}), "invoice-5", ledger.Succeeded, time.Time{})
	e.Purge(t, e.QueueURL)
	h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Reject, Reply: faults.TransactionConflict})
	res, err := c.Enqueue(context.Background(), payment{OrderID: "5"}, &enqueue.Opts{IdempotencyKey: "invoice-5"})
	if err != nil || res.Duplicate {
		t.Fatalf("re-use with a throttled transaction: %+v, %v", res, err)
	}
	if h.Fired() != 1 {
		t.Fatalf("conflict injected %d times", h.Fired())
	}
	checkMessages(t, e, 1)
}

// TestReuseWhenTheTransactionFails: the re-use path's transaction (archive
// the terminal holder, put the new job) is applied and its reply lost: the
// enqueue finds its own job and sends it. Throttled past the SDK's
// retries, it is an error, the old job still holds the key and nothing is
// sent; the caller's retry creates the job.
func TestReuseWhenTheTransactionFails(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c, ft := faultyClient(t, e)
			old := stage(t, newClient(t, e, &enqueue.ClientOptions{Logger: quietLog}), "invoice-6", ledger.Succeeded, time.Time{})
			e.Purge(t, e.QueueURL)
			rule := faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: f}
			if f == faults.Throttle {
				rule.Times = faults.Attempts
			}
			h := ft.Add(rule)
			ctx := context.Background()
			res, err := c.Enqueue(ctx, payment{OrderID: "6"}, &enqueue.Opts{IdempotencyKey: "invoice-6"})
			if f == faults.LostReply {
				if err != nil || res.Duplicate || res.ID == old.ID || h.Fired() != 1 {
					t.Fatalf("re-use with its reply lost: %+v, %v (fault fired %d times)", res, err, h.Fired())
				}
				e.RequireState(t, res.ID, ledger.Enqueued)
				checkMessages(t, e, 1)
				return
			}
			if err == nil || h.Fired() != faults.Attempts {
				t.Fatalf("re-use throttled: %+v, %v (fault fired %d times)", res, err, h.Fired())
			}
			if holder, err := c.Holder(ctx, "invoice-6"); err != nil || holder.ID != old.ID || holder.State != ledger.Succeeded {
				t.Fatalf("the key after a throttled re-use: %+v %v", holder, err)
			}
			checkMessages(t, e, 0)
			if res, err = c.Enqueue(ctx, payment{OrderID: "6"}, &enqueue.Opts{IdempotencyKey: "invoice-6"}); err != nil || res.Duplicate || res.ID == old.ID {
				t.Fatalf("the caller's retry: %+v, %v", res, err)
			}
			checkMessages(t, e, 1)
		})
	}
}

// TestCancelWhenReplyIsLost: the operator's cancel is applied, its reply
// is lost and the SDK resends it: the failed condition finds our own
// write, so the cancel reads as done. Throttled past the SDK's retries,
// it is an error and the job is untouched.
func TestCancelWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c, ft := faultyClient(t, e)
			ctx := context.Background()
			res, err := c.Enqueue(ctx, payment{OrderID: "c-1", Cents: 1}, nil)
			if err != nil {
				t.Fatal(err)
			}
			times := 1
			if f == faults.Throttle {
				times = faults.Attempts
			}
			h := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: f, Times: times})
			rec, err := c.Cancel(ctx, res.ID, "", time.Hour)
			if h.Fired() != times {
				t.Fatalf("fault fired %d times", h.Fired())
			}
			got := e.Get(t, res.ID)
			if f == faults.Throttle {
				if err == nil || got.State != ledger.Enqueued {
					t.Fatalf("throttled cancel: %v, record %s; want an error and Enqueued", err, got.State)
				}
				return
			}
			if err != nil || rec.State != ledger.Failed || !got.Cancelled || got.State != ledger.Failed {
				t.Fatalf("cancel after a lost reply: %v, %+v; want Failed and cancelled", err, got)
			}
		})
	}
}
