package recurring_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
)

// TestLaterFiringCostsTheFirst: every SkipIfRunning firing after the first
// makes the same requests as the first, a PutItem and its send, and its run
// the two UpdateItems: 3 write units for records under 1 KB (sized here).
// Before, the ended run still held the key and each later firing took the
// re-use path: a failed PutItem and a 2-item transaction, 7 units with its
// run. A firing while the last run is active stays a duplicate (1 unit, no
// send), and the firing delivered again after its run gets its own job.
func TestLaterFiringCostsTheFirst(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	var runs atomic.Int32
	reg := counting(&runs)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := h.Producer()
	firing := func(at string) recurring.Firing {
		return recurring.Firing{V: 1, ID: "nightly", Kind: "report", Args: []byte(`{"name":"daily"}`), Concurrency: recurring.SkipIfRunning, ScheduledTime: at}
	}
	put, upd, send := "DynamoDB.PutItem", "DynamoDB.UpdateItem", "SQS.SendMessage"
	dynamoWrites := func(calls []string) int {
		return len(slices.DeleteFunc(slices.Clone(calls), func(c string) bool { return c != put && c != upd && c != "DynamoDB.TransactWriteItems" }))
	}

	var ids []string
	for i, at := range []string{"2026-12-04T02:00:00Z", "2026-12-05T02:00:00Z", "2026-12-06T02:00:00Z"} {
		counter.Reset()
		res, err := recurring.Fire(ctx, c, firing(at))
		if err != nil || res.Duplicate {
			t.Fatalf("firing %d: %+v %v", i+1, res, err)
		}
		size := itemSize(t, e, res.ID) // before the run; its writes keep it under 1 KB too
		e.Drain(t, h)
		e.RequireState(t, res.ID, ledger.Succeeded)
		calls := counter.Calls()
		if want := []string{put, send, upd, upd}; !slices.Equal(calls, want) {
			t.Fatalf("firing %d and its run: requests\n got %v\nwant %v", i+1, calls, want)
		}
		units := dynamoWrites(calls) * ((size + 1023) / 1024)
		t.Logf("firing %d: %v, item %d bytes: %d write units", i+1, calls, size, units)
		if units != 3 {
			t.Fatalf("firing %d and its run cost %d write units, want 3", i+1, units)
		}
		ids = append(ids, res.ID)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d runs for three firings", n)
	}
	// The ended runs' records were replaced: the last one holds the key.
	if _, err := c.Store().Get(ctx, ids[0]); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the first run's record after two later firings: %v, want ErrNotFound", err)
	}
	// Delivered again after its run: its own job back, no run.
	counter.Reset()
	again, err := recurring.Fire(ctx, c, firing("2026-12-06T02:00:00Z"))
	if err != nil || !again.Duplicate || again.ID != ids[2] {
		t.Fatalf("the last firing delivered again: %+v %v; want its own job", again, err)
	}
	if calls := counter.Calls(); !slices.Equal(calls, []string{put}) {
		t.Fatalf("a redelivered firing made %v, want one failed PutItem", calls)
	}
	// While a run is active the next firing is a duplicate of it.
	active, err := recurring.Fire(ctx, c, firing("2026-12-07T02:00:00Z"))
	if err != nil || active.Duplicate {
		t.Fatalf("firing 4: %+v %v", active, err)
	}
	counter.Reset()
	skipped, err := recurring.Fire(ctx, c, firing("2026-12-08T02:00:00Z"))
	if err != nil || !skipped.Duplicate || skipped.ID != active.ID {
		t.Fatalf("a firing while the last run is Enqueued: %+v %v; want that run as a duplicate", skipped, err)
	}
	if calls := counter.Calls(); !slices.Equal(calls, []string{put}) {
		t.Fatalf("a skipped firing made %v, want one failed PutItem", calls)
	}
	e.Drain(t, h)
	if n := runs.Load(); n != 4 {
		t.Fatalf("%d runs for four firings that were not duplicates", n)
	}
}

// TestReplacingFiringUnderFaults: the put that replaces the ended run
// applied with its reply lost reads as created (the SDK's resend meets its
// own job); one throttled past the SDK's retries leaves the ended run in
// place and the firing's retry replaces it. One run per firing either way.
func TestReplacingFiringUnderFaults(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			ctx := context.Background()
			var runs atomic.Int32
			reg := counting(&runs)
			h := e.Handler(t, reg, &handler.Options{Logger: quiet})
			ft, cfg := e.Faulty()
			c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			firing := func(at string) recurring.Firing {
				return recurring.Firing{V: 1, ID: "hourly", Kind: "report", Args: []byte(`{"name":"h"}`), Concurrency: recurring.SkipIfRunning, ScheduledTime: at}
			}
			first, err := recurring.Fire(ctx, c, firing("2026-12-04T01:00:00Z"))
			if err != nil {
				t.Fatal(err)
			}
			e.Drain(t, h)
			e.RequireState(t, first.ID, ledger.Succeeded)

			rule := faults.Rule{Op: "DynamoDB.PutItem", Fault: f}
			if f == faults.Throttle {
				rule.Times = faults.Attempts
			}
			fired := ft.Add(rule)
			second, err := recurring.Fire(ctx, c, firing("2026-12-04T02:00:00Z"))
			if fired.Fired() == 0 {
				t.Fatal("the fault never fired")
			}
			if f == faults.Throttle {
				if err == nil {
					t.Fatalf("a firing throttled past the retries: %+v, want an error (Scheduler retries it)", second)
				}
				e.RequireState(t, first.ID, ledger.Succeeded) // nothing replaced
				second, err = recurring.Fire(ctx, c, firing("2026-12-04T02:00:00Z"))
			}
			if err != nil || second.Duplicate || second.ID == first.ID {
				t.Fatalf("the second firing: %+v %v; want a new job", second, err)
			}
			e.Drain(t, h)
			e.RequireState(t, second.ID, ledger.Succeeded)
			if n := runs.Load(); n != 2 {
				t.Fatalf("%d runs for two firings, want 2", n)
			}
		})
	}
}

// counting is a registry whose report worker counts its runs.
func counting(runs *atomic.Int32) *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(context.Context, *handler.Job[report]) error {
		runs.Add(1)
		return nil
	}), nil)
	return reg
}

// itemSize is the size of job id's item, as DynamoDB bills it.
func itemSize(t *testing.T, e *awstest.Env, id string) int {
	t.Helper()
	out, err := e.DB.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(e.Table), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range out.Items {
		if v, ok := it[ledger.AttrID].(*types.AttributeValueMemberS); ok && v.Value == id {
			return awstest.ItemSize(it)
		}
	}
	t.Fatalf("no item for job %s", id)
	return 0
}
