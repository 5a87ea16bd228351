package enqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestSettleWhenItsReadFails: the commit's reply is lost (it applied),
// and Settle's read of the job is throttled past the SDK's retries. That
// is an unknown outcome (*TxUnknownError), never ErrTxNotCommitted: the
// caller re-preparing on that made two jobs of one intent. Settle again
// finds the job and sends it.
func TestSettleWhenItsReadFails(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	orders := ordersTable(t, e)
	ctx := context.Background()
	tx, err := c.EnqueueTx(ctx, payment{OrderID: "7"}, &enqueue.Opts{IdempotencyKey: "receipt-7"})
	if err != nil {
		t.Fatal(err)
	}
	// The commit went through (its own clean client); its error is what a
	// lost reply through the SDK's retries would say.
	if err := commit(ctx, dynamodb.NewFromConfig(e.Cfg), orders, "7", tx); err != nil {
		t.Fatal(err)
	}
	lost := errors.New("commit: https response error StatusCode: 500, InternalServerError (reply lost)")
	h := ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Throttle, Times: faults.Attempts})
	_, err = c.Settle(ctx, tx, lost)
	var unknown *enqueue.TxUnknownError
	if !errors.As(err, &unknown) || errors.Is(err, enqueue.ErrTxNotCommitted) || unknown.JobID != tx.Result.ID {
		t.Fatalf("settle with its read throttled: %v; want a *TxUnknownError naming the job, not ErrTxNotCommitted", err)
	}
	fired(t, h, faults.Attempts)
	res, err := c.Settle(ctx, tx, lost)
	if err != nil || res.ID != tx.Result.ID {
		t.Fatalf("settle again: %+v %v", res, err)
	}
	checkMessages(t, e, 1)
}

// TestSettleOfADuplicate: a duplicate's transaction holds nothing of
// nexjob, so a commit error says nothing about the job: Settle returns the
// duplicate. It returned ErrTxNotCommitted without looking, telling a
// caller whose own writes had committed to redo them.
func TestSettleOfADuplicate(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	first, err := c.Enqueue(ctx, payment{OrderID: "6"}, &enqueue.Opts{IdempotencyKey: "receipt-6"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := c.EnqueueTx(ctx, payment{OrderID: "6"}, &enqueue.Opts{IdempotencyKey: "receipt-6"})
	if err != nil || !tx.Result.Duplicate || len(tx.Items) != 0 {
		t.Fatalf("prepare: %+v %v", tx, err)
	}
	res, err := c.Settle(ctx, tx, errors.New("commit: reply lost"))
	if err != nil || !res.Duplicate || res.ID != first.ID {
		t.Fatalf("settle of a duplicate after a commit error: %+v %v", res, err)
	}
}

// TestBatchAndTxTakeNoKindDefaults: EnqueueMany and EnqueueTx honour
// Opts.NoKindDefaults as Enqueue does (they applied the kind's stricter
// policy and MaxAttempts anyway).
func TestBatchAndTxTakeNoKindDefaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	plain := &enqueue.Opts{IdempotencyKey: "inv-many", NoKindDefaults: true}
	out, err := c.EnqueueMany(ctx, []enqueue.Item{{Args: invoiceRun{Month: "2027-03"}, Opts: plain}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := c.EnqueueTx(ctx, invoiceRun{Month: "2027-04"}, &enqueue.Opts{IdempotencyKey: "inv-tx", NoKindDefaults: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: tx.Items}); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]string{"EnqueueMany": out[0].ID, "EnqueueTx": tx.Result.ID} {
		if rec := e.Get(t, id); rec.MaxAttempts != enqueue.DefaultMaxAttempts || rec.Policy != "AllowAfterFailed" {
			t.Errorf("%s with NoKindDefaults: maxAttempts %d, policy %s; want %d, AllowAfterFailed", name, rec.MaxAttempts, rec.Policy, enqueue.DefaultMaxAttempts)
		}
	}
}

// TestEnqueueManyDuplicateOfAnUnsentJob: two items of one key, the
// creator's send throttled past the retries. Neither item is sent: the
// duplicate said Sent: true, Err: nil though no message named the job.
func TestEnqueueManyDuplicateOfAnUnsentJob(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	ctx := context.Background()
	item := enqueue.Item{Args: payment{OrderID: "5"}, Opts: &enqueue.Opts{IdempotencyKey: "receipt-5"}}
	h := ft.Add(faults.Rule{Op: "SQS.SendMessageBatch", Fault: faults.Throttle, Times: faults.Attempts})
	res, err := c.EnqueueMany(ctx, []enqueue.Item{item, item})
	fired(t, h, faults.Attempts)
	var be *enqueue.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 2 {
		t.Fatalf("batch error %v; want both items", err)
	}
	for i, r := range res {
		var de *enqueue.DispatchError
		if r.Sent || !errors.As(r.Err, &de) || de.JobID != res[0].ID || r.ID != res[0].ID {
			t.Fatalf("item %d: %+v; want not sent, a DispatchError naming the one job", i, r)
		}
	}
	checkMessages(t, e, 0)
}

// fired fails the test unless the rule fired n times.
func fired(t *testing.T, h faults.Handle, n int) {
	t.Helper()
	if got := h.Fired(); got != n {
		t.Fatalf("fault fired %d times, want %d", got, n)
	}
}

// TestRequeueAppliedThenThrottled: the requeue's update is applied, its
// reply lost, the SDK's resends throttled past its retries. Read back
// and recognised, the requeue succeeds and sends the job; it answered an
// error, the operator's retry said NotTerminal, and nothing was sent.
func TestRequeueAppliedThenThrottled(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	res := stage(t, newClient(t, e, &enqueue.ClientOptions{Logger: quietLog}), "requeue-throttled", ledger.Failed, time.Time{})
	e.Purge(t, e.QueueURL)
	lost := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	throttled := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts - 1})
	if _, err := c.Requeue(context.Background(), res.ID); err != nil {
		t.Fatalf("requeue applied, then throttled: %v", err)
	}
	fired(t, lost, 1)
	fired(t, throttled, faults.Attempts-1)
	e.RequireState(t, res.ID, ledger.Enqueued)
	checkMessages(t, e, 1)
}
