package enqueue_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
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

// TestEnqueueManyCosts: EnqueueMany of 100 keyed jobs makes 100 PutItems
// (100 write units) and 10 SendMessageBatch requests, where 100 Enqueue
// calls make 100 PutItems and 100 SendMessages (docs/costs.md, make
// bench's (d)).
func TestEnqueueManyCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	count := func(calls []string) map[string]int {
		n := map[string]int{}
		for _, c := range calls {
			n[c]++
		}
		return n
	}
	items := make([]enqueue.Item, 100)
	for i := range items {
		items[i] = enqueue.Item{Args: payment{OrderID: fmt.Sprint(i)}, Opts: &enqueue.Opts{IdempotencyKey: fmt.Sprintf("many-%d", i)}}
	}
	if _, err := c.EnqueueMany(ctx, items); err != nil {
		t.Fatal(err)
	}
	many, manyUnits := count(meter.Calls()), meter.Units()
	meter.Reset()
	for i := range 100 {
		if _, err := c.Enqueue(ctx, payment{OrderID: fmt.Sprint(i)}, &enqueue.Opts{IdempotencyKey: fmt.Sprintf("one-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	single, singleUnits := count(meter.Calls()), meter.Units()
	t.Logf("EnqueueMany of 100: %v; %v", many, manyUnits)
	t.Logf("100 Enqueue calls: %v; %v", single, singleUnits)
	if want := map[string]int{"DynamoDB.PutItem": 100, "SQS.SendMessageBatch": 10}; !maps.Equal(many, want) || manyUnits != (awstest.Units{Write: 100, Sends: 10}) {
		t.Errorf("EnqueueMany of 100: %v, %v; want %v, 100 write units, 10 sends", many, manyUnits, want)
	}
	if want := map[string]int{"DynamoDB.PutItem": 100, "SQS.SendMessage": 100}; !maps.Equal(single, want) || singleUnits != (awstest.Units{Write: 100, Sends: 100}) {
		t.Errorf("100 Enqueue calls: %v, %v; want %v, 100 write units, 100 sends", single, singleUnits, want)
	}
}
