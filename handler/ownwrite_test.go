package handler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Own-write recognition against two writers acting on one record: every
// "that failed condition was my own write" must be this writer's write,
// never another's that happens to look the same.

// TestTwoFinishesOfOneClaim: two Finish calls of one claimed record with
// different results (two workers ending the same orphan, or a zombie and
// the run that took over). The first wins; the second is fenced. Both
// read as success while Finish's nonce was derived from the claim's.
func TestTwoFinishesOfOneClaim(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, email{To: "two@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	store := e.Client.Store()
	rec, err := store.Claim(ctx, res.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Finish(ctx, rec, ledger.Finish{State: ledger.Succeeded}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "orphaned"}); !errors.Is(err, ledger.ErrFenced) {
		t.Fatalf("the second writer's Finish: %v, want ErrFenced", err)
	}
	if got, _ := store.Get(ctx, res.ID); got.State != ledger.Succeeded {
		t.Fatalf("state %s, want the first writer's Succeeded", got.State)
	}
}

// TestOrphanEndedByTwoWorkers: a job on its last attempt whose worker
// died, with two messages: two workers' claims are both refused, and both
// fail it as an orphan. The dead-letter hook runs once ("runs once"): the
// loser's finish is fenced, not taken for its own.
func TestOrphanEndedByTwoWorkers(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](ok), &handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	clk := &clock{}
	clk.Advance(time.Hour) // the dead run's lease is long over for both workers
	ft, fcfg := e.Faulty()
	one, err := handler.New(fcfg, e.Table, e.QueueURL, reg, &handler.Options{Ledger: ledger.Options{Now: clk.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	two, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &handler.Options{Ledger: ledger.Options{Now: clk.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Client.Enqueue(ctx, email{To: "orphan@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Store().Claim(ctx, res.ID, time.Minute); err != nil { // the run that died
		t.Fatal(err)
	}
	ev := poller.Event(e.QueueURL, e.Messages(t, e.QueueURL))
	// Worker one's claim is refused; before it sees that, worker two
	// handles the job's other message from start to end.
	h := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isClaim, Fault: faults.Pass, After: func() {
		if _, err := two.Handle(ctx, ev); err != nil {
			t.Error(err)
		}
	}})
	if _, err := one.Handle(ctx, ev); err != nil {
		t.Fatal(err)
	}
	fired(t, h, 1)
	if rec, _ := e.Client.Store().Get(ctx, res.ID); rec.State != ledger.Failed {
		t.Fatalf("state %s, want Failed", rec.State)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the dead-letter hook ran %d times, want once", n)
	}
}

// TestOwnWriteAfterAnInterleavedWrite: a Finish to Scheduled is applied,
// its reply lost, and before the SDK resends it another write (a
// continuation's link) replaces the record's nonce. The resend must still
// read as applied: the job stays Scheduled forever if it is taken for
// fenced (its retry's message is never sent).
func TestOwnWriteAfterAnInterleavedWrite(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	r := newRigWith(t, func(context.Context, *handler.Job[email]) error {
		if runs.Add(1) == 1 {
			return errors.New("try again")
		}
		return nil
	}, rigConfig{faults: true})
	id := r.enqueue(t, email{To: "linked@example.com"}, &enqueue.Opts{MaxAttempts: 3})
	ctx := context.Background()
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Scheduled), Fault: faults.LostReply, After: func() {
		if _, err := r.prod.ContinueWith(ctx, id, email{To: "child@example.com"}, nil); err != nil {
			t.Error(err)
		}
	}})
	r.deliver(t, r.receive(t, 1), 1)
	fired(t, h, 1)
	rec := r.get(t, id)
	if rec.State != ledger.Scheduled || len(rec.Children) != 1 {
		t.Fatalf("after the lost reply: %s with %d children, want Scheduled with the link", rec.State, len(rec.Children))
	}
	r.drain(t) // the retry's message was sent: the job runs again
	r.ranAs(t, id, ledger.Succeeded, 2, "", 2)
}

// TestClaimAppliedThenThrottled: the claim is applied, its reply lost,
// and the SDK's resends are throttled past its retries. The claim was
// ours: read back and recognised, the job runs on its last attempt
// instead of the message coming back to find an "orphan" that never ran.
func TestClaimAppliedThenThrottled(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true})
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isClaim, Fault: faults.LostReply})
	throttled := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isClaim, Fault: faults.Throttle, Times: faults.Attempts - 1})
	id := r.enqueue(t, email{To: "applied@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	r.deliver(t, r.receive(t, 1), 1)
	fired(t, lost, 1)
	fired(t, throttled, faults.Attempts-1)
	r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
}

// TestDeadLetterAppliedThenThrottled: the DLQ consumer's DeadLetter write
// (an orphan's last attempt) is applied, its reply lost, its resends
// throttled past the retries. Read back, it is recognised: the hook runs
// once. It used to fail the dead letter, and its redelivery found the job
// Failed, took it for a duplicate and never ran the hook.
func TestDeadLetterAppliedThenThrottled(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	r := newRigWith(t, ok, rigConfig{faults: true, hook: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	id := r.enqueue(t, email{To: "dead@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if _, err := r.prod.Store().Claim(context.Background(), id, time.Minute); err != nil { // the run that died
		t.Fatal(err)
	}
	r.clock.Advance(time.Hour)
	m := poller.Event(r.e.DLQURL, r.receive(t, 1))
	m.Records[0].Attributes["ApproximateReceiveCount"] = "5"
	isDead := finishLike(ledger.Failed)
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isDead, Fault: faults.LostReply})
	throttled := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isDead, Fault: faults.Throttle, Times: faults.Attempts - 1})
	if resp, err := r.h.HandleDeadLetters(context.Background(), m); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter: %+v %v, want it recorded", resp, err)
	}
	fired(t, lost, 1)
	fired(t, throttled, faults.Attempts-1)
	if rec := r.get(t, id); rec.State != ledger.Failed || hooks.Load() != 1 {
		t.Fatalf("%s, hook ran %d times; want Failed and the hook once", rec.State, hooks.Load())
	}
}

// finishLike matches any update that SETs the state st.
func finishLike(st ledger.State) func([]byte) bool {
	return func(b []byte) bool { return parseUpdate(b).setsState() == st }
}

// TestDeadlineAfterACutOff: a job with a deadline started in time, was
// cut off by the invocation's end and got its attempt back. Claimed again
// after the deadline it runs: it started before its deadline, so it is
// not "never started". It was expired as "deadline passed before the job
// started".
func TestDeadlineAfterACutOff(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	r := newRig(t, func(ctx context.Context, _ *handler.Job[email]) error {
		if runs.Add(1) == 1 {
			<-ctx.Done() // the first run outlasts its invocation
			return ctx.Err()
		}
		return nil
	}, nil)
	id := r.enqueue(t, email{To: "deadline@example.com"}, &enqueue.Opts{Deadline: time.Now().Add(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), cutOffTimeout)
	r.deliverCtx(ctx, t, r.receive(t, 1), 1)
	cancel()
	expect(t, r.get(t, id), ledger.Enqueued, 0, "cut off")
	r.clock.Advance(2 * time.Hour) // past the deadline
	r.deliver(t, r.receive(t, 1), 1)
	r.ranAs(t, id, ledger.Succeeded, 1, "", 2)
}
