package enqueue_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestReplaceEnded: with Opts.ReplaceEnded a key held by an ended job the
// policy lets go is taken in the one PutItem (the ended job's record is
// gone); a holder the policy protects, an active one, or one made by the
// same request still decides as without it.
func TestReplaceEnded(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	staging := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})

	old := stage(t, staging, "sync-1", ledger.Succeeded, time.Time{})
	counter.Reset()
	res, err := c.Enqueue(ctx, payment{OrderID: "a"}, &enqueue.Opts{IdempotencyKey: "sync-1", ReplaceEnded: true})
	if err != nil || res.Duplicate || res.ID == old.ID {
		t.Fatalf("re-use of a Succeeded key with ReplaceEnded: %+v %v", res, err)
	}
	if calls := counter.Calls(); !slices.Equal(calls, []string{"DynamoDB.PutItem", "SQS.SendMessage"}) {
		t.Fatalf("requests %v, want one PutItem and its send", calls)
	}
	if _, err := c.Store().Get(ctx, old.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the replaced job: %v, want ErrNotFound", err)
	}

	// Active: a duplicate, whatever ReplaceEnded says.
	again, err := c.Enqueue(ctx, payment{OrderID: "a"}, &enqueue.Opts{IdempotencyKey: "sync-1", ReplaceEnded: true})
	if err != nil || !again.Duplicate || again.ID != res.ID {
		t.Fatalf("a key held by an Enqueued job: %+v %v; want it as a duplicate", again, err)
	}

	// Protected: Failed under RejectIfFailed.
	failed := stage(t, staging, "sync-2", ledger.Failed, time.Time{})
	_, err = c.Enqueue(ctx, payment{OrderID: "b"}, &enqueue.Opts{IdempotencyKey: "sync-2", DuplicatePolicy: enqueue.RejectIfFailed, ReplaceEnded: true})
	var dup *enqueue.DuplicateJobError
	if !errors.As(err, &dup) || dup.ExistingJobID != failed.ID {
		t.Fatalf("a Failed holder under RejectIfFailed: %v; want a DuplicateJobError naming it", err)
	}
	e.RequireState(t, failed.ID, ledger.Failed)

	// The same request, retried after its job ended: that job back.
	first, err := c.Enqueue(ctx, payment{OrderID: "c"}, &enqueue.Opts{IdempotencyKey: "sync-3", RequestID: "delivery-1", ReplaceEnded: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, first.ID, "test", time.Hour); err != nil {
		t.Fatal(err)
	}
	retried, err := c.Enqueue(ctx, payment{OrderID: "c"}, &enqueue.Opts{IdempotencyKey: "sync-3", RequestID: "delivery-1", ReplaceEnded: true})
	if err != nil || !retried.Duplicate || retried.ID != first.ID {
		t.Fatalf("the same request after its job ended: %+v %v; want its job", retried, err)
	}
}
