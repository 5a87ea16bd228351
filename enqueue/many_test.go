package enqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestEnqueueMany (issue 12, item 2): per-item results in order, each
// keyed item one conditional write under the policy matrix, one message
// per new job in batches of ten; the errors name their items.
func TestEnqueueMany(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	failed := stage(t, c, "order-failed", ledger.Failed, time.Time{})
	var items []enqueue.Item
	for i := range 22 {
		items = append(items, enqueue.Item{Args: payment{OrderID: fmt.Sprint(i), Cents: i}, Opts: &enqueue.Opts{IdempotencyKey: fmt.Sprintf("order-%d", i)}})
	}
	items = append(items,
		enqueue.Item{Args: payment{OrderID: "3", Cents: 3}, Opts: &enqueue.Opts{IdempotencyKey: "order-3"}},                                     // 22: same key as item 3
		enqueue.Item{Args: payment{OrderID: "x"}, Opts: &enqueue.Opts{IdempotencyKey: "   "}},                                                   // 23: bad input
		enqueue.Item{Args: payment{OrderID: "f"}, Opts: &enqueue.Opts{IdempotencyKey: "order-failed", DuplicatePolicy: enqueue.RejectIfFailed}}, // 24: rejected
		enqueue.Item{Args: payment{OrderID: "u"}}, // 25: no key
	)
	res, err := c.EnqueueMany(ctx, items)
	var be *enqueue.BatchError
	if !errors.As(err, &be) || !slices.Equal(be.Failed, []int{23, 24}) {
		t.Fatalf("batch error %v; want items 23 and 24", err)
	}
	var input *enqueue.InputError
	var dup *enqueue.DuplicateJobError
	if !errors.As(res[23].Err, &input) || !errors.As(res[24].Err, &dup) || dup.ExistingJobID != failed.ID || res[23].Recorded || res[24].Recorded {
		t.Fatalf("items 23, 24: %+v / %+v", res[23], res[24])
	}
	// Items 3 and 22 raced for one key: one job, one of them the duplicate.
	if res[3].ID != res[22].ID || res[3].Duplicate == res[22].Duplicate {
		t.Fatalf("items 3 and 22: %+v / %+v", res[3].Result, res[22].Result)
	}
	ids := map[string]bool{}
	for i, r := range res {
		if i == 23 || i == 24 {
			continue
		}
		if r.Err != nil || !r.Recorded || !r.Sent || r.Kind != "payment" {
			t.Fatalf("item %d: %+v", i, r)
		}
		ids[r.ID] = true
	}
	if len(ids) != 23 {
		t.Fatalf("%d distinct jobs, want 23", len(ids))
	}
	// One message per new job (the duplicate sends none).
	checkMessages(t, e, 23+1) // and the staged Failed job's own, from its enqueue
}

// TestEnqueueManyThrottledBatch: the second SendMessageBatch is throttled
// past the SDK's retries. Its ten jobs are recorded, not sent, and say so;
// the others are sent; retrying the failed items' keys sends them.
func TestEnqueueManyThrottledBatch(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	ctx := context.Background()
	var items []enqueue.Item
	for i := range 25 {
		items = append(items, enqueue.Item{Args: payment{OrderID: fmt.Sprint(i)}, Opts: &enqueue.Opts{IdempotencyKey: fmt.Sprintf("bulk-%d", i)}})
	}
	h := ft.Add(faults.Rule{Op: "SQS.SendMessageBatch", Skip: 1, Times: faults.Attempts, Fault: faults.Throttle})
	res, err := c.EnqueueMany(ctx, items)
	if h.Fired() != faults.Attempts {
		t.Fatalf("fault fired %d times", h.Fired())
	}
	var be *enqueue.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 10 {
		t.Fatalf("batch error %v; want the ten items of one batch", err)
	}
	var retry []enqueue.Item
	for _, i := range be.Failed {
		var de *enqueue.DispatchError
		if !errors.As(res[i].Err, &de) || !res[i].Recorded || res[i].Sent {
			t.Fatalf("item %d: %+v", i, res[i])
		}
		if rec := e.Get(t, res[i].ID); !rec.Undispatched {
			t.Fatalf("item %d's job is not marked unsent", i)
		}
		retry = append(retry, items[i])
	}
	checkMessages(t, e, 15)
	again, err := c.EnqueueMany(ctx, retry)
	if err != nil {
		t.Fatal(err)
	}
	for k, r := range again {
		if !r.Duplicate || !r.Redispatched || !r.Sent || r.ID != res[be.Failed[k]].ID {
			t.Fatalf("retried item %d: %+v", be.Failed[k], r)
		}
	}
	checkMessages(t, e, 25)
}
