package recurring_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
)

func nightly(at string) recurring.Firing {
	return recurring.Firing{V: 1, ID: "nightly", Kind: "report", Args: []byte(`{"name":"daily"}`), Concurrency: recurring.SkipIfRunning, ScheduledTime: at}
}

// Issue 27 item 19: one firing, one run, whatever came between. The first
// firing's send fails (Scheduler will retry it) and the guard runs its
// job; the next firing replaces the ended record and runs; then
// Scheduler's retry of the first firing comes: it gets a job back as a
// duplicate and runs nothing (it met a record made by another request and
// ran the first firing again).
func TestLateRetryOfAReplacedFiringRunsNothing(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var runs atomic.Int32
	h := e.Handler(t, counting(&runs), &handler.Options{Logger: quiet})
	ft, cfg := e.Faulty()
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	first := nightly("2026-12-04T02:00:00Z")
	send := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
	_, err = recurring.Fire(ctx, c, first)
	var de *enqueue.DispatchError
	if !errors.As(err, &de) || send.Fired() != faults.Attempts {
		t.Fatalf("firing with its send throttled: %v", err)
	}
	if err := e.Client.Dispatch(ctx, e.Get(t, de.JobID)); err != nil { // the guard
		t.Fatal(err)
	}
	e.Drain(t, h)
	next, err := recurring.Fire(ctx, c, nightly("2026-12-05T02:00:00Z"))
	if err != nil || next.Duplicate {
		t.Fatalf("the next firing: %+v %v", next, err)
	}
	e.Drain(t, h)
	retried, err := recurring.Fire(ctx, c, first)
	if err != nil || !retried.Duplicate {
		t.Fatalf("Scheduler's late retry of the first firing: %+v %v; want a duplicate", retried, err)
	}
	e.Drain(t, h)
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs for two firings, want 2", n)
	}
}

// Issue 27 item 18: a firing's run fails for good and its worker dies
// before the dead-letter hook; the next firing does not overwrite the
// record with the hook still due (ReplaceEnded ignored the mark): the old
// record is moved aside, and its message's next delivery runs the hook.
func TestNextFiringKeepsADueHook(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(context.Context, *handler.Job[report]) error { return nil }),
		&handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error { hooks.Add(1); return nil }})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	f := nightly("2026-12-04T02:00:00Z")
	f.MaxAttempts = 1
	res, err := recurring.Fire(ctx, e.Client, f)
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL)
	st := e.Client.Store()
	rec, err := st.Claim(ctx, res.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Failed for good; the worker dies before the hook (it holds it a minute).
	if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "down", HookPending: true, HookLease: time.Minute, Nonce: ledger.NewNonce()}); err != nil {
		t.Fatal(err)
	}
	next, err := recurring.Fire(ctx, e.Client, nightly("2026-12-05T02:00:00Z"))
	if err != nil || next.Duplicate || next.ID == res.ID {
		t.Fatalf("the next firing: %+v %v; want a new job", next, err)
	}
	old, err := st.Get(ctx, res.ID)
	if err != nil || !old.HookPending {
		t.Fatalf("the failed firing's record after the next firing: hook due %v, err %v; want kept with its hook due", old.HookPending, err)
	}
	e.Advance(t, 2*time.Minute) // the dead worker's hold on the hook ends
	msg := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m", ReceiptHandle: "rh", Body: enqueue.Message{V: 1, ID: res.ID, Kind: "report"}.Encode()}}}
	if resp, _ := h.Handle(ctx, msg); len(resp.BatchItemFailures) != 0 || hooks.Load() != 1 {
		t.Fatalf("the failed firing's message again: kept %v, %d hook runs; want deleted, 1", resp.BatchItemFailures, hooks.Load())
	}
}
