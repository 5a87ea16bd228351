package recurring_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
)

// TestOneFiringOneRun: a firing Scheduler delivers again after its job
// ran, or retries after an error although its job was recorded and later
// ran, gets its own job back and runs nothing more. AllowConcurrent ran
// a redelivered firing again (its per-firing key took AllowAfterFailed);
// SkipIfRunning enqueued the retried firing anew once the guard had sent
// the first and it had Succeeded.
func TestOneFiringOneRun(t *testing.T) {
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
	firing := func(id string, cc recurring.Concurrency, at string) recurring.Firing {
		return recurring.Firing{V: 1, ID: id, Kind: "report", Args: []byte(`{"name":"daily"}`), Concurrency: cc, ScheduledTime: at}
	}

	// AllowConcurrent: delivered, run, delivered again.
	f := firing("ticker", recurring.AllowConcurrent, "2026-12-04T02:00:00Z")
	first, err := recurring.Fire(ctx, c, f)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, first.ID, ledger.Succeeded)
	again, err := recurring.Fire(ctx, c, f)
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("AllowConcurrent firing delivered again after its run: %+v %v; want its own job as a duplicate", again, err)
	}

	// SkipIfRunning: the send fails, the firing errs (Scheduler retries
	// it); the guard sends the recorded job, which Succeeds; the retry.
	f = firing("nightly", recurring.SkipIfRunning, "2026-12-04T02:00:00Z")
	send := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
	_, err = recurring.Fire(ctx, c, f)
	var de *enqueue.DispatchError
	if !errors.As(err, &de) || send.Fired() != faults.Attempts {
		t.Fatalf("firing with its send throttled: %v", err)
	}
	if err := e.Client.Dispatch(ctx, e.Get(t, de.JobID)); err != nil { // what the guard does
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, de.JobID, ledger.Succeeded)
	retried, err := recurring.Fire(ctx, c, f)
	if err != nil || !retried.Duplicate || retried.ID != de.JobID {
		t.Fatalf("the retried firing: %+v %v; want its own job as a duplicate", retried, err)
	}
	e.Drain(t, h)
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs for two firings, want 2", n)
	}

	// The next firing of the same schedule is a new run.
	next, err := recurring.Fire(ctx, c, firing("nightly", recurring.SkipIfRunning, "2026-12-05T02:00:00Z"))
	if err != nil || next.Duplicate {
		t.Fatalf("the next firing: %+v %v", next, err)
	}
}
