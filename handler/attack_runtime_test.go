package handler_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Attacks on the promise (docs/operating.md "Per kind"; docs/reliability.md
// "An ended job's runAt is its last run's start ... or nothing: never after
// its end, never kept by a job that did not run"; ledger.Finish.Began): an
// ended job's RunAt is its last run's start, or none when no run of its
// own ended it.
//
// Every run of the kind rtJob takes one second of the Env's clock (it
// advances it before it returns), and notes its start and end on the clock
// of the worker that ran it, so the last run's start is known to within
// what the claim did before the work: in (previous run's end, last run's
// work start].

type rtJob struct {
	N    int    `json:"n"`
	Mode string `json:"mode,omitempty"`
}

func (rtJob) Kind() string { return "rt-job" }

type rtKid struct {
	N int `json:"n"`
}

func (rtKid) Kind() string { return "rt-kid" }

// rtRun is one run's work as the worker saw it, on its own clock (ms).
type rtRun struct {
	attempt    int
	start, end int64
}

type rtRig struct {
	e  *nexjobtest.Env
	h  *handler.Handler
	ft *faults.Transport

	mu     sync.Mutex
	runs   map[string][]rtRun // by job id
	gate   chan struct{}      // "block" runs wait here
	in     chan string        // "block" runs say they began
	t      *testing.T
	kids   map[string][]rtRun // the children's runs, by id
	compAt []int64
}

// rtReg builds a registry whose work notes every run; now is the worker's
// clock.
func (r *rtRig) reg(now func() time.Time, kopts *handler.KindOptions) *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[rtJob](func(ctx context.Context, j *handler.Job[rtJob]) error {
		start := now().UnixMilli()
		end := func() {
			r.e.Advance(r.t, time.Second)
			r.mu.Lock()
			r.runs[j.ID] = append(r.runs[j.ID], rtRun{j.Attempt, start, now().UnixMilli()})
			r.mu.Unlock()
		}
		defer end()
		switch j.Args.Mode {
		case "fail1":
			r.mu.Lock()
			first := len(r.runs[j.ID]) == 0
			r.mu.Unlock()
			if first {
				return errors.New("first run fails")
			}
		case "perm":
			return handler.Permanent(errors.New("for good"))
		case "sleep":
			if _, err := handler.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return err
			}
			return handler.Sleep(ctx, "nap", time.Hour)
		case "comp":
			if err := handler.Compensate(ctx, "undo", func(context.Context) error {
				r.mu.Lock()
				r.compAt = append(r.compAt, now().UnixMilli())
				r.mu.Unlock()
				return nil
			}); err != nil {
				return err
			}
			return handler.Sleep(ctx, "nap", time.Hour)
		case "block":
			r.in <- j.ID
			<-r.gate
		case "block1":
			if j.Attempt == 1 {
				r.in <- j.ID
				<-r.gate
			}
		case "steps":
			// a cancel while running is seen at the next step
			r.in <- j.ID
			<-r.gate
			_, err := handler.Step(ctx, "after", func(context.Context) (int, error) { return 1, nil })
			return err
		case "child":
			_, err := handler.Invoke[string](ctx, "kid", rtKid{N: j.Args.N}, nil)
			return err
		}
		return nil
	}), kopts)
	handler.AddWorkerResult(reg, handler.ResultFunc[rtKid, string](func(ctx context.Context, j *handler.Job[rtKid]) (string, error) {
		start := now().UnixMilli()
		r.e.Advance(r.t, time.Second)
		r.mu.Lock()
		r.kids[j.ID] = append(r.kids[j.ID], rtRun{j.Attempt, start, now().UnixMilli()})
		r.mu.Unlock()
		return "ok", nil
	}), nil)
	return reg
}

func newRT(t *testing.T, kopts *handler.KindOptions) *rtRig {
	t.Helper()
	return newRTWith(t, kopts, &nexjobtest.Options{Ledger: ledger.Options{IndexAllStates: true}})
}

func newRTWith(t *testing.T, kopts *handler.KindOptions, o *nexjobtest.Options) *rtRig {
	t.Helper()
	r := &rtRig{t: t, e: nexjobtest.New(t, o), runs: map[string][]rtRun{}, kids: map[string][]rtRun{},
		gate: make(chan struct{}), in: make(chan string, 4)}
	r.ft = faults.New(nil)
	r.e.Cfg = faults.Config(r.e.Cfg, r.ft)
	r.h = r.e.Handler(t, r.reg(r.e.Now, kopts), &handler.Options{Logger: quiet})
	return r
}

// worker builds another handler over the same Env whose clock is the
// Env's plus skew.
func (r *rtRig) worker(t *testing.T, skew time.Duration, kopts *handler.KindOptions) *handler.Handler {
	t.Helper()
	now := func() time.Time { return r.e.Now().Add(skew) }
	h, err := handler.New(r.e.Cfg, r.e.Table, r.e.QueueURL, r.reg(now, kopts), &handler.Options{
		Ledger: ledger.Options{Now: now, StepsTable: r.e.StepsTable, IndexAllStates: true}, Logger: quiet,
		Backoff: handler.FloorBackoff, DLQURL: r.e.DLQURL, MaxDelay: nexjobtest.DefaultMaxDelay})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (r *rtRig) runsOf(id string) []rtRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]rtRun(nil), r.runs[id]...)
}

func (r *rtRig) enq(t *testing.T, a enqueue.JobArgs, o *enqueue.Opts) string {
	t.Helper()
	res, err := r.e.Client.Enqueue(context.Background(), a, o)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

func (r *rtRig) deliver(ctx context.Context, h *handler.Handler, id, kind, msgID string) events.SQSEventResponse {
	body := fmt.Sprintf(`{"v":1,"id":%q,"kind":%q}`, id, kind)
	resp, _ := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: msgID, ReceiptHandle: "rh-" + msgID, Body: body}}})
	return resp
}

// ranLast asserts rec ended with RunAt its last run's start: after the
// previous run's end (lo, on the Env's clock; 0 for none) and at or
// before the last run's work began, never after the job's end.
func ranLast(t *testing.T, what string, rec ledger.Record, runs []rtRun, lo int64) {
	t.Helper()
	if !rec.State.Terminal() {
		t.Fatalf("%s: job is %s, not ended", what, rec.State)
	}
	if len(runs) == 0 {
		t.Fatalf("%s: no run seen", what)
	}
	last := runs[len(runs)-1]
	if len(runs) > 1 && runs[len(runs)-2].end > lo {
		lo = runs[len(runs)-2].end
	}
	switch {
	case rec.RunAt == 0:
		t.Errorf("%s: %s job keeps no RunAt; its last run (attempt %d) began at %d", what, rec.State, last.attempt, last.start)
	case rec.RunAt > rec.UpdatedAt:
		t.Errorf("%s: RunAt %d is after the job's end %d", what, rec.RunAt, rec.UpdatedAt)
	case rec.RunAt > last.start:
		t.Errorf("%s: RunAt %d is after its last run's work began (%d): not its start", what, rec.RunAt, last.start)
	case rec.RunAt < lo:
		t.Errorf("%s: RunAt %d is before %d (the previous run's end, or the last run's earliest start): not its last run's start; runs %+v", what, rec.RunAt, lo, runs)
	case rec.UpdatedAt-rec.RunAt < 1000:
		t.Errorf("%s: the last run took 1 s of the clock; the record says %d ms (RunAt %d, end %d)", what, rec.UpdatedAt-rec.RunAt, rec.RunAt, rec.UpdatedAt)
	}
}

// ranNone asserts an ended job keeps no RunAt: no run of its own ended it.
func ranNone(t *testing.T, what string, rec ledger.Record) {
	t.Helper()
	if !rec.State.Terminal() {
		t.Fatalf("%s: job is %s, not ended", what, rec.State)
	}
	if rec.RunAt != 0 {
		after := ""
		if rec.RunAt > rec.UpdatedAt {
			after = fmt.Sprintf(", %d ms after its end", rec.RunAt-rec.UpdatedAt)
		}
		t.Errorf("%s: %s job no run ended keeps RunAt %d (end %d%s); want none", what, rec.State, rec.RunAt, rec.UpdatedAt, after)
	}
}

// Plain, retried, failed for good: the last run's start.
func TestAttackRTPlainRetriedFailed(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	t0 := r.e.Now().UnixMilli()
	ok := r.enq(t, rtJob{N: 1}, nil)
	retried := r.enq(t, rtJob{N: 2, Mode: "fail1"}, nil)
	perm := r.enq(t, rtJob{N: 3, Mode: "perm"}, nil)
	out := r.enq(t, rtJob{N: 4, Mode: "fail1"}, &enqueue.Opts{MaxAttempts: 1})
	r.e.Drain(t, r.h)
	ranLast(t, "succeeded", r.e.Get(t, ok), r.runsOf(ok), t0)
	ranLast(t, "retried then succeeded", r.e.Get(t, retried), r.runsOf(retried), t0)
	ranLast(t, "failed for good", r.e.Get(t, perm), r.runsOf(perm), t0)
	ranLast(t, "out of attempts", r.e.Get(t, out), r.runsOf(out), t0)
	if n := len(r.runsOf(retried)); n != 2 {
		t.Fatalf("the retried job ran %d times, want 2", n)
	}
}

// The last run's Finish is applied and its reply lost (a 500) on every
// resend: the handler gives the message back; it is delivered again a
// minute later, to the same worker and another. RunAt stays the run's
// start, not a redelivery's.
func TestAttackRTFinishReplyLostThenRedelivered(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	t0 := r.e.Now().UnixMilli()
	id := r.enq(t, rtJob{N: 1}, nil)
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Succeeded), Fault: faults.LostReply, Times: faults.Attempts})
	r.deliver(ctx, r.h, id, "rt-job", "m1")
	if lost.Fired() == 0 {
		t.Fatal("the finish's reply was never lost")
	}
	lost.Remove()
	r.e.Advance(t, time.Minute)
	r.deliver(ctx, r.h, id, "rt-job", "m2")
	other := r.worker(t, 0, nil)
	r.deliver(ctx, other, id, "rt-job", "m3")
	r.e.Drain(t, r.h) // the enqueue's own message
	rec := r.e.Get(t, id)
	if rec.State != ledger.Succeeded {
		t.Fatalf("job is %s, want Succeeded", rec.State)
	}
	ranLast(t, "finish's reply lost, redelivered", rec, r.runsOf(id), t0)
	if runs := r.runsOf(id); len(runs) == 1 && rec.RunAt > runs[0].start {
		t.Errorf("RunAt %d is after the only run's start %d", rec.RunAt, runs[0].start)
	}
}

// One lost reply on the Finish, recognised by the SDK's resend.
func TestAttackRTFinishReplyLostOnce(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	t0 := r.e.Now().UnixMilli()
	id := r.enq(t, rtJob{N: 1, Mode: "fail1"}, nil)
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Succeeded), Fault: faults.LostReply})
	thr := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Scheduled), Fault: faults.Throttle, Times: 2})
	r.e.Drain(t, r.h)
	fired(t, lost, 1)
	fired(t, thr, 2)
	ranLast(t, "lost reply on the last finish", r.e.Get(t, id), r.runsOf(id), t0)
}

// A durable job sleeps an hour, then wakes and succeeds: RunAt is the
// waking run's start, not the first run's (nor the wake's due time, if
// the waking run came later).
func TestAttackRTSleepThenWake(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	t0 := r.e.Now().UnixMilli()
	id := r.enq(t, rtJob{N: 1, Mode: "sleep"}, nil)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Scheduled {
		t.Fatalf("after the first run: %s, want Scheduled (asleep)", rec.State)
	}
	r.e.Advance(t, 2*time.Hour) // the wake is due; the waking run comes an hour late
	r.e.Drain(t, r.h)
	runs := r.runsOf(id)
	if len(runs) != 2 {
		t.Fatalf("%d runs, want 2", len(runs))
	}
	ranLast(t, "slept then woke", r.e.Get(t, id), runs, t0)
}

// Cancelled while Scheduled, never ran (a delay), or Scheduled for a
// retry after a run: no run ended it, and it keeps the due time it had
// (Cancel removes a far job's schedule by it; the run times leave
// cancelled jobs out), never a run's start.
func TestAttackRTCancelledWhileScheduled(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	never := r.enq(t, rtJob{N: 1}, &enqueue.Opts{Delay: time.Hour})
	retry := r.enq(t, rtJob{N: 2, Mode: "fail1"}, nil)
	r.e.DrainNow(t, r.h)
	if rec := r.e.Get(t, retry); rec.State != ledger.Scheduled || rec.Attempt != 1 {
		t.Fatalf("the retried job is %s at attempt %d; want Scheduled after its first run", rec.State, rec.Attempt)
	}
	due := map[string]int64{}
	for _, id := range []string{never, retry} {
		due[id] = r.e.Get(t, id).RunAt
		if _, err := r.e.Client.Cancel(ctx, id, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	r.e.Advance(t, 2*time.Hour)
	r.e.Drain(t, r.h)
	for what, id := range map[string]string{"cancelled, never ran": never, "cancelled while Scheduled for a retry": retry} {
		if rec := r.e.Get(t, id); rec.State != ledger.Failed || !rec.Cancelled || rec.RunAt != due[id] || due[id] == 0 {
			t.Errorf("%s: %s (cancelled %v) with RunAt %d; want Failed, cancelled, its due time %d kept", what, rec.State, rec.Cancelled, rec.RunAt, due[id])
		}
	}
	if n := len(r.runsOf(retry)); n != 1 {
		t.Fatalf("the cancelled job ran %d times, want 1", n)
	}
}

// Cancelled while running: the run stops at its next step and ends the job
// (Failed, Cancelled): a run of its own ended it, so RunAt is its start.
func TestAttackRTCancelledWhileRunning(t *testing.T) {
	t.Parallel()
	// Steps on the record: with a steps table, the step after the cancel
	// was recorded and the job Succeeded (see the report).
	r := newRTWith(t, nil, &nexjobtest.Options{StepsOnRecord: true, Ledger: ledger.Options{IndexAllStates: true}})
	ctx := context.Background()
	t0 := r.e.Now().UnixMilli()
	id := r.enq(t, rtJob{N: 1, Mode: "steps"}, &enqueue.Opts{MaxAttempts: 3})
	done := make(chan struct{})
	go func() { defer close(done); r.e.DrainNow(t, r.h) }()
	<-r.in
	_, err := r.e.Client.Cancel(ctx, id, "stop", 0)
	var cr *enqueue.CancelRequestedError
	if !errors.As(err, &cr) {
		t.Errorf("cancel of a running job: %v; want a *CancelRequestedError", err)
	}
	close(r.gate)
	<-done
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed {
		t.Fatalf("job is %s, want Failed (cancelled)", rec.State)
	}
	ranLast(t, "cancelled while running, ended by its run", rec, r.runsOf(id), t0)
}

// EndActive (an operator's delete of a running job) ends it by a
// transition: no run ended it, so no RunAt, and the fenced run's finish
// writes none afterwards.
func TestAttackRTEndActiveWhileRunning(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	id := r.enq(t, rtJob{N: 1, Mode: "block"}, nil)
	done := make(chan struct{})
	go func() { defer close(done); r.e.DrainNow(t, r.h) }()
	<-r.in
	if _, ended, err := r.e.Client.Store().EndActive(ctx, id, "deleted", time.Time{}); err != nil || !ended {
		t.Fatalf("EndActive: ended %v, %v", ended, err)
	}
	ranNone(t, "EndActive while running, before the run's finish", r.e.Get(t, id))
	close(r.gate)
	<-done
	ranNone(t, "EndActive while running, after the fenced finish", r.e.Get(t, id))
}

// A compensable job cancelled while it sleeps: the cancel makes it due
// now, and its next run compensates and ends it: that run's start.
func TestAttackRTCompensableCancelled(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	id := r.enq(t, rtJob{N: 1, Mode: "comp"}, nil)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Scheduled {
		t.Fatalf("after the first run: %s, want asleep", rec.State)
	}
	r.e.Advance(t, time.Minute)
	cancelAt := r.e.Now().UnixMilli()
	if _, err := r.e.Client.Cancel(ctx, id, "", 0); err == nil {
		t.Log("cancel of a compensable job returned nil")
	}
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed || len(r.compAt) != 1 {
		t.Fatalf("job is %s with %d compensations; want Failed, compensated once", rec.State, len(r.compAt))
	}
	switch {
	case rec.RunAt != 0 && rec.RunAt > rec.UpdatedAt:
		t.Errorf("compensated: RunAt %d after the end %d", rec.RunAt, rec.UpdatedAt)
	case rec.RunAt == 0:
		t.Errorf("compensated: the compensating run ended the job (at %d) and it keeps no RunAt", r.compAt[0])
	case rec.RunAt < cancelAt || rec.RunAt > r.compAt[0]:
		t.Errorf("compensated: RunAt %d is not the compensating run's start (in [%d, %d]): runs %+v", rec.RunAt, cancelAt, r.compAt[0], r.runsOf(id))
	}
}

// Failed for good, requeued an hour later, succeeds: the requeued run's
// start. Failed, requeued, then cancelled before it runs: none.
func TestAttackRTRequeued(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	id := r.enq(t, rtJob{N: 1, Mode: "fail1"}, &enqueue.Opts{MaxAttempts: 1})
	id2 := r.enq(t, rtJob{N: 2, Mode: "fail1"}, &enqueue.Opts{MaxAttempts: 1})
	r.e.Drain(t, r.h)
	r.e.Advance(t, time.Hour)
	rq := r.e.Now().UnixMilli()
	if _, err := r.e.Client.Requeue(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.e.Client.RequeueFrom(ctx, id2, ledger.Failed); err != nil {
		t.Fatal(err)
	}
	if _, err := r.e.Client.Cancel(ctx, id2, "", 0); err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if rec.State != ledger.Succeeded {
		t.Fatalf("requeued job is %s", rec.State)
	}
	ranLast(t, "requeued then succeeded", rec, r.runsOf(id), rq)
	ranNone(t, "requeued then cancelled before it ran", r.e.Get(t, id2))
}

// A continuation's runs; a continuation of a failed parent is ended
// without running: none.
func TestAttackRTContinuation(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	t0 := r.e.Now().UnixMilli()
	p := r.enq(t, rtJob{N: 1}, nil)
	bad := r.enq(t, rtJob{N: 2, Mode: "perm"}, nil)
	c, err := r.e.Client.ContinueWith(ctx, p, rtJob{N: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := r.e.Client.ContinueWith(ctx, bad, rtJob{N: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	ranLast(t, "parent", r.e.Get(t, p), r.runsOf(p), t0)
	ranLast(t, "continuation", r.e.Get(t, c.ID), r.runsOf(c.ID), r.runsOf(p)[0].end)
	ranNone(t, "continuation of a failed parent", r.e.Get(t, dead.ID))
}

// A child job (Invoke): the child's RunAt is its run's start; the caller,
// woken by the child's end, keeps its waking run's start.
func TestAttackRTChildAndCaller(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	t0 := r.e.Now().UnixMilli()
	id := r.enq(t, rtJob{N: 1, Mode: "child"}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if rec.State != ledger.Succeeded {
		t.Fatalf("caller is %s", rec.State)
	}
	runs := r.runsOf(id)
	if len(runs) < 2 {
		t.Fatalf("caller ran %d times, want 2 (it sleeps on its child)", len(runs))
	}
	ranLast(t, "caller", rec, runs, t0)
	r.mu.Lock()
	kids := r.kids
	r.mu.Unlock()
	if len(kids) != 1 {
		t.Fatalf("%d children ran", len(kids))
	}
	for kid, kr := range kids {
		ranLast(t, "child", r.e.Get(t, kid), kr, runs[0].start)
		if rec.RunAt < kr[len(kr)-1].end {
			t.Errorf("the caller's RunAt %d is before its child's end %d: not its waking run's start", rec.RunAt, kr[len(kr)-1].end)
		}
	}
}

// A dead letter of a job that was claimed by a lost worker, out of
// attempts: the DLQ consumer fails it as an orphan. No run ended it.
func TestAttackRTDeadLetteredOrphan(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	id := r.enq(t, rtJob{N: 1}, &enqueue.Opts{MaxAttempts: 1})
	if _, err := r.e.Client.Store().Claim(ctx, id, time.Minute); err != nil { // a run whose worker was lost
		t.Fatal(err)
	}
	r.e.Advance(t, time.Hour)
	body := fmt.Sprintf(`{"v":1,"id":%q,"kind":"rt-job"}`, id)
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "dl-1", ReceiptHandle: "rh-dl", Body: body, Attributes: map[string]string{"ApproximateReceiveCount": "5"}}}}
	if resp, err := r.h.HandleDeadLetters(ctx, ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter: %+v %v", resp, err)
	}
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed {
		t.Fatalf("dead-lettered orphan is %s, want Failed", rec.State)
	}
	ranNone(t, "dead-lettered orphan out of attempts", rec)
	// A poison message of a job never claimed, with attempts spent.
}

// Kills via two handlers: worker one's run hangs (its process is as good
// as dead); its lease runs out; worker two meets the job. Out of attempts:
// failed as an orphan, no RunAt, and worker one's late finish (fenced)
// writes none. With attempts left: worker two's run ends it, its start,
// and worker one's late finish does not move it.
func TestAttackRTOrphanViaTwoWorkers(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	two := r.worker(t, 0, nil)

	last := r.enq(t, rtJob{N: 1, Mode: "block1"}, &enqueue.Opts{MaxAttempts: 1})
	left := r.enq(t, rtJob{N: 2, Mode: "block1"}, &enqueue.Opts{MaxAttempts: 2})
	var wg sync.WaitGroup
	for i, id := range []string{last, left} {
		wg.Add(1)
		go func() { defer wg.Done(); r.deliver(ctx, r.h, id, "rt-job", fmt.Sprintf("one-%d", i)) }()
		<-r.in
	}
	r.e.Advance(t, 2*time.Hour) // both leases are over
	takeover := r.e.Now().UnixMilli()
	r.deliver(ctx, two, last, "rt-job", "two-0")
	r.deliver(ctx, two, left, "rt-job", "two-1")
	ranNone(t, "orphan out of attempts, failed by worker two", r.e.Get(t, last))
	ranLast(t, "orphan with attempts left, run by worker two", r.e.Get(t, left), r.runsOf(left), takeover)
	before := r.e.Get(t, left).RunAt
	close(r.gate)
	wg.Wait()
	r.e.Drain(t, two)
	ranNone(t, "orphan out of attempts, after worker one's late finish", r.e.Get(t, last))
	if rec := r.e.Get(t, left); rec.RunAt != before {
		t.Errorf("worker one's late (fenced) finish moved RunAt from %d to %d", before, rec.RunAt)
	}
}

// A deferred run (a throttle: one start an hour for the kind) later
// succeeds: RunAt is the run's start, not the deferred claim's.
func TestAttackRTThrottleDeferred(t *testing.T) {
	t.Parallel()
	kopts := &handler.KindOptions{Throttle: &handler.Throttle{Limit: 1, Period: time.Hour}}
	r := newRT(t, kopts)
	t0 := r.e.Now().UnixMilli()
	a := r.enq(t, rtJob{N: 1}, nil)
	b := r.enq(t, rtJob{N: 2}, nil)
	r.e.DrainNow(t, r.h)
	var first, second string
	switch {
	case len(r.runsOf(a)) == 1 && len(r.runsOf(b)) == 0:
		first, second = a, b
	case len(r.runsOf(b)) == 1 && len(r.runsOf(a)) == 0:
		first, second = b, a
	default:
		t.Fatalf("runs after the first pass: a %d, b %d; want one of them deferred", len(r.runsOf(a)), len(r.runsOf(b)))
	}
	deferred := r.e.Get(t, second)
	if deferred.State != ledger.Scheduled {
		t.Fatalf("the throttled job is %s, want Scheduled", deferred.State)
	}
	r.e.RunToEnd(t, r.h, second)
	ranLast(t, "first", r.e.Get(t, first), r.runsOf(first), t0)
	rec := r.e.Get(t, second)
	ranLast(t, "deferred by the throttle, then ran", rec, r.runsOf(second), t0+(59*time.Minute).Milliseconds())
}

// A deferred run by a concurrency key: one at a time; the second waits
// while the first runs.
func TestAttackRTConcurrencyDeferred(t *testing.T) {
	t.Parallel()
	kopts := &handler.KindOptions{Concurrency: &handler.Concurrency{Limit: 1}}
	r := newRT(t, kopts)
	ctx := context.Background()
	a := r.enq(t, rtJob{N: 1, Mode: "block"}, nil)
	done := make(chan struct{})
	go func() { defer close(done); r.deliver(ctx, r.h, a, "rt-job", "a-1") }()
	<-r.in
	t1 := r.e.Now().UnixMilli()
	b := r.enq(t, rtJob{N: 2}, nil)
	r.deliver(ctx, r.h, b, "rt-job", "b-1") // deferred: no slot
	if rec := r.e.Get(t, b); rec.State.Terminal() || len(r.runsOf(b)) != 0 {
		t.Fatalf("the second job ran beside the first (%s)", rec.State)
	}
	r.e.Advance(t, 10*time.Minute)
	t2 := r.e.Now().UnixMilli()
	close(r.gate)
	<-done
	r.e.Drain(t, r.h)
	ranLast(t, "holder", r.e.Get(t, a), r.runsOf(a), t1-1000)
	ranLast(t, "deferred by concurrency, then ran", r.e.Get(t, b), r.runsOf(b), t2)
}

// A debounced job: its run's start, not its enqueue's or fold's due time.
func TestAttackRTDebounced(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	var id string
	for i := range 3 {
		res, err := r.e.Client.Enqueue(ctx, rtJob{N: i}, &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "d", Period: 10 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		id = res.ID
	}
	t0 := r.e.Now().UnixMilli()
	r.e.Advance(t, 5*time.Minute) // it runs late
	late := r.e.Now().UnixMilli()
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	ranLast(t, "debounced", rec, r.runsOf(id), t0)
	if rec.RunAt < late {
		t.Errorf("debounced: RunAt %d is before the run could start (%d): its due time, not its start", rec.RunAt, late)
	}
}

// Workers whose clocks are skewed: ten minutes ahead fails the first run,
// ten minutes behind runs the retry (and the other way round). RunAt is
// the last worker's start, never after the job's end.
func TestAttackRTSkewedWorkers(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	for _, c := range []struct {
		name        string
		first, last time.Duration
	}{{"ahead then behind", 10 * time.Minute, -10 * time.Minute}, {"behind then ahead", -10 * time.Minute, 10 * time.Minute}} {
		id := r.enq(t, rtJob{N: 1, Mode: "fail1"}, nil)
		one, two := r.worker(t, c.first, nil), r.worker(t, c.last, nil)
		r.deliver(ctx, one, id, "rt-job", c.name+"-1")
		if rec := r.e.Get(t, id); rec.State != ledger.Scheduled {
			t.Fatalf("%s: after the first run %s, want Scheduled", c.name, rec.State)
		}
		r.e.Advance(t, 40*time.Minute) // the retry is due on either clock
		r.deliver(ctx, two, id, "rt-job", c.name+"-2")
		rec := r.e.Get(t, id)
		runs := r.runsOf(id)
		last := runs[len(runs)-1]
		switch {
		case rec.State != ledger.Succeeded:
			t.Errorf("%s: %s, want Succeeded", c.name, rec.State)
		case rec.RunAt == 0 || rec.RunAt > rec.UpdatedAt:
			t.Errorf("%s: RunAt %d, end %d: not a start before the end", c.name, rec.RunAt, rec.UpdatedAt)
		case rec.RunAt > last.start:
			t.Errorf("%s: RunAt %d after the last run's work began (%d, its worker's clock)", c.name, rec.RunAt, last.start)
		case rec.RunAt < last.start-5000:
			t.Errorf("%s: RunAt %d is %d ms before the last run's work began (%d, its worker's clock): not its start", c.name, rec.RunAt, last.start-rec.RunAt, last.start)
		}
		r.e.Drain(t, r.h)
	}
}

// TestRunAtOnTheEndingWriteIsItsDocumentedSize: the write that ends a
// job enqueued to run now (no RunAt while it runs) gains one attribute,
// its last run's start: "runAt" and 13 digits, 18 bytes, as
// docs/operating.md says (a write unit more only for a record within
// those bytes under a KB boundary); a delayed job's RunAt is replaced, not
// added. (Helper-16 reported the growth as a break of "no write unit
// more", which the docs no longer say.)
func TestRunAtOnTheEndingWriteIsItsDocumentedSize(t *testing.T) {
	t.Parallel()
	r := newRT(t, nil)
	ctx := context.Background()
	for _, o := range []*enqueue.Opts{nil, {Delay: time.Hour}} {
		id := r.enq(t, rtJob{N: 1, Mode: "block"}, o)
		r.e.RunNow(t, id)
		done := make(chan struct{})
		go func() { defer close(done); r.deliver(ctx, r.h, id, "rt-job", "m-"+id) }()
		<-r.in
		running := r.e.Get(t, id)
		r.gate <- struct{}{}
		<-done
		ended := r.e.Get(t, id)
		if ended.State != ledger.Succeeded || ended.RunAt == 0 {
			t.Fatalf("job is %s with RunAt %d; want Succeeded with its run's start", ended.State, ended.RunAt)
		}
		added := 0
		if running.RunAt == 0 {
			added = len("runAt") + len(fmt.Sprint(ended.RunAt))
		}
		if want := map[bool]int{true: 18, false: 0}[o == nil]; added != want {
			t.Errorf("opts %+v: the ending write adds %d bytes of RunAt; want %d", o, added, want)
		}
	}
}
