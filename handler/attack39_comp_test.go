package handler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Attacks on compensations' promises (docs/durable-jobs.md
// "Compensations"; go doc handler.Compensate).

// compWork declares compensations a, b, c after a step each (their fns
// count calls in order and fail as fails says: "a" always, "b" twice
// then not), then ends as end says.
func compWork(r **rig39, order *[]string, mu *sync.Mutex, fails map[string]int, end func(ctx context.Context, j *handler.Job[a39]) error) func(ctx context.Context, j *handler.Job[a39]) error {
	return func(ctx context.Context, j *handler.Job[a39]) error {
		(*r).call("run")
		for _, n := range []string{"a", "b", "c"} {
			if _, err := handler.Step(ctx, "do-"+n, func(context.Context) (int, error) {
				(*r).call("do %s", n)
				return 1, nil
			}); err != nil {
				return err
			}
			if err := handler.Compensate(ctx, n, func(context.Context) error {
				k := (*r).call("undo %s", n)
				mu.Lock()
				*order = append(*order, n)
				mu.Unlock()
				if f := fails[n]; f < 0 || k <= f {
					return fmt.Errorf("undo %s failed (call %d)", n, k)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return end(ctx, j)
	}
}

// "the compensations declared so far run, last first, each once"; "A
// success runs none; a failure with attempts left runs none until the
// last one fails"; "A compensation still failing after its three calls is
// kept in the job's last error ... the others still run, and the job ends
// Failed"; one that fails twice and then succeeds is not kept.
func TestAttack39CompensationsOrderAndTries(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	var r *rig39
	r = newRig39(t, rig39Opts{kopts: &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }},
		work: compWork(&r, &order, &mu, map[string]int{"a": -1, "b": 2}, func(ctx context.Context, j *handler.Job[a39]) error {
			return errors.New("booking refused")
		})})
	id := enqueueOne(t, r.e.Client, a39{}, &enqueue.Opts{MaxAttempts: 3})
	for range 4 {
		r.e.Drain(t, r.h)
		if r.e.Get(t, id).State.Terminal() {
			break
		}
		mu.Lock()
		early := len(order)
		mu.Unlock()
		if early != 0 {
			t.Fatalf("promise \"a failure with attempts left runs none\": %d compensation calls at attempt %d", early, r.e.Get(t, id).Attempt)
		}
		r.e.Advance(t, 2*time.Second)
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Failed || rec.Attempt != 3 {
		t.Fatalf("job %s at attempt %d (%s)", rec.State, rec.Attempt, rec.LastError)
	}
	want := []string{"c", "b", "b", "b", "a", "a", "a"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("promise \"run, last first, each once\" (up to CompensationTries calls each): calls %v, want %v", order, want)
	}
	if !strings.Contains(rec.LastError, `compensation "a" failed`) || strings.Contains(rec.LastError, `compensation "b"`) {
		t.Errorf("promise \"a compensation still failing after its three calls is kept in the job's last error\": %q", rec.LastError)
	}
	if r.n("run") != 3 {
		t.Errorf("%d runs for 3 attempts", r.n("run"))
	}
}

// BREAK: "Each compensation is a step of the job (nexjob:comp:<name>),
// called up to handler.CompensationTries (3) times and recorded: a run
// that dies among them runs only the rest next time ... A compensation
// still failing after its three calls is kept in the job's last error"
// (docs/durable-jobs.md, Compensations): compensation "b" whose fn
// succeeded at its first call, its record throttled past the SDK's
// retries, is neither recorded on a retry nor called again: it is kept in
// the job's last error as failed ("compensation "b" failed: ... record
// step ... throttled") after one successful call, and the job ends for
// good.
//
// A lost reply on a compensation's record does not run it again; a
// throttle past the SDK's retries on another's record.
func TestAttack39CompensationRecordFaults(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	var r *rig39
	r = newRig39(t, rig39Opts{work: compWork(&r, &order, &mu, nil, func(ctx context.Context, j *handler.Job[a39]) error {
		return handler.Permanent(errors.New("booking refused"))
	})})
	rec := func(n string) func([]byte) bool {
		return func(b []byte) bool { return strings.Contains(string(b), "nexjob:comp:"+n+`"`) }
	}
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: rec("c"), Fault: faults.LostReply})
	thr := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: rec("b"), Fault: faults.Throttle, Times: faults.Attempts})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	for range 4 {
		r.e.Drain(t, r.h)
		if r.e.Get(t, id).State.Terminal() {
			break
		}
		r.e.Advance(t, time.Minute)
	}
	x := r.e.Get(t, id)
	t.Logf("lost %d, throttled %d; job %s at attempt %d (%s), calls %v", lost.Fired(), thr.Fired(), x.State, x.Attempt, x.LastError, order)
	if x.State != ledger.Failed || lost.Fired() != 1 || thr.Fired() != faults.Attempts {
		t.Fatalf("job %s (%s); faults fired %d and %d", x.State, x.LastError, lost.Fired(), thr.Fired())
	}
	if r.n("undo c") != 1 || r.n("undo a") != 1 || r.n("undo b") < 1 || r.n("undo b") > 2 {
		t.Errorf("promise \"a lost reply on its record does not run it again ... a run that dies among them runs only the rest next time\": undo c %d, b %d, a %d calls (order %v)", r.n("undo c"), r.n("undo b"), r.n("undo a"), order)
	}
	if strings.Contains(x.LastError, "compensation") {
		t.Errorf("promise \"called up to CompensationTries (3) times and recorded ... still failing after its three calls is kept\": compensation b, called %d time(s), its fn never failing, is kept as failed: %q", r.n("undo b"), x.LastError)
	}
}

// A cancel of a sleeping job: "its next run replays the steps that
// completed (declaring their compensations), refuses anything new ...
// compensates and ends Failed, marked Cancelled", each compensation once,
// though the cancel is asked twice and its message delivered again.
func TestAttack39CancelSleepingCompensatesOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	var r *rig39
	r = newRig39(t, rig39Opts{work: compWork(&r, &order, &mu, nil, func(ctx context.Context, j *handler.Job[a39]) error {
		if err := handler.Sleep(ctx, "cool", time.Hour); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "after", func(context.Context) (int, error) {
			r.call("after")
			return 1, nil
		})
		return err
	})})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	ctx := context.Background()
	_, err1 := r.e.Client.Cancel(ctx, id, "", 0)
	_, err2 := r.e.Client.Cancel(ctx, id, "", 0)
	for k := range 2 {
		r.deliver(ctx, id, "a39", fmt.Sprint("dup", k))
	}
	r.e.Drain(t, r.h)
	r.e.Advance(t, 2*time.Hour)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Failed || !rec.Cancelled {
		t.Fatalf("job %s cancelled=%v (%s); Cancel: %v, %v", rec.State, rec.Cancelled, rec.LastError, err1, err2)
	}
	if strings.Join(order, ",") != "c,b,a" || r.n("after") != 0 {
		t.Fatalf("promise \"compensates ... last first, each once\", nothing new run: compensations %v, the step after the sleep ran %d times", order, r.n("after"))
	}
	for _, n := range []string{"a", "b", "c"} {
		if r.n("do %s", n) != 1 {
			t.Errorf("step do-%s called %d times", n, r.n("do %s", n))
		}
	}
}

// A cancel that reaches a running job while its last step fails
// permanently: both say compensate; the compensations run once.
func TestAttack39CancelWhileFailingForGood(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	var cancelErr error
	var r *rig39
	r = newRig39(t, rig39Opts{work: compWork(&r, &order, &mu, nil, func(ctx context.Context, j *handler.Job[a39]) error {
		_, err := handler.Step(ctx, "book", func(context.Context) (int, error) {
			_, cancelErr = r.e.Client.Cancel(context.Background(), j.ID, "", 0)
			return 0, handler.Permanent(errors.New("no seats"))
		})
		return err
	})})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	for range 3 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Minute)
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	var asked *enqueue.CancelRequestedError
	if !errors.As(cancelErr, &asked) {
		t.Logf("Cancel during the run: %v", cancelErr)
	}
	if rec.State != ledger.Failed || strings.Join(order, ",") != "c,b,a" {
		t.Fatalf("promise \"the compensations declared so far run, last first, each once\": job %s (%s), compensations %v", rec.State, rec.LastError, order)
	}
}

// Compensate's names: "1 to 128 bytes, not beginning "nexjob:", once a
// run". Every printable ASCII character is a name; the others are refused
// (the declaration's error), and a refused one never runs.
func TestAttack39CompensateNames(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for c := byte(' '); c <= '~'; c++ {
		b.WriteByte(c)
	}
	good := []string{b.String(), strings.Repeat("x", 128), "n"}
	bad := []string{"", strings.Repeat("x", 129), "nexjob:refund"}
	var mu sync.Mutex
	errs := map[string]error{}
	var twice error
	var r *rig39
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		for _, n := range append(append([]string{}, good...), bad...) {
			err := handler.Compensate(ctx, n, func(context.Context) error {
				r.call("undo %q", n)
				return nil
			})
			mu.Lock()
			errs[n] = err
			mu.Unlock()
		}
		err := handler.Compensate(ctx, "n", func(context.Context) error {
			r.call("undo n twice")
			return nil
		})
		mu.Lock()
		twice = err
		mu.Unlock()
		return handler.Permanent(errors.New("give up"))
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	for _, n := range good {
		if errs[n] != nil || r.n("undo %q", n) != 1 {
			t.Errorf("a good name (%d bytes): %v, run %d times", len(n), errs[n], r.n("undo %q", n))
		}
	}
	for _, n := range bad {
		if errs[n] == nil || r.n("undo %q", n) != 0 {
			t.Errorf("promise \"name (1 to 128 bytes, not beginning nexjob:)\": %q (%d bytes) declared: %v, run %d times", n, len(n), errs[n], r.n("undo %q", n))
		}
	}
	if twice == nil || r.n("undo n twice") != 0 {
		t.Errorf("promise \"once a run\": a second \"n\": %v, run %d times", twice, r.n("undo n twice"))
	}
	if rec.State != ledger.Failed {
		t.Errorf("job %s", rec.State)
	}
}

// BREAK: "Each compensation is ... called up to handler.CompensationTries
// (3) times" (docs/durable-jobs.md) with Step's "fn's error is returned
// ... nothing is recorded, so the next run calls fn again" (go doc
// handler.Step): a compensation whose fn calls a Step that fails once
// gets, at its second call, ErrStepRepeated ("step name used twice in one
// run", permanent), so its retries can never succeed and it is kept as
// failed after two calls. (The docs do not say whether a compensation may
// call Step; its example hands StepKey the compensation's ctx.)
//
// A compensation whose own step fails: the compensation's fn calls Step,
// which fails the first time. It is called up to CompensationTries times:
// the second call's step must be able to run (not refused as a name used
// twice), and the compensation then succeeds, once.
func TestAttack39CompensationWhoseStepFails(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var stepErrs []error
	var r *rig39
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		if err := handler.Compensate(ctx, "refund", func(ctx context.Context) error {
			k := r.call("undo")
			_, err := handler.Step(ctx, "refund-call", func(context.Context) (int, error) {
				if r.call("refund-call") == 1 {
					return 0, errors.New("bank down")
				}
				return 1, nil
			})
			mu.Lock()
			stepErrs = append(stepErrs, err)
			mu.Unlock()
			_ = k
			return err
		}); err != nil {
			return err
		}
		return handler.Permanent(errors.New("give up"))
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	for range 3 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Minute)
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("job %s (%s); the compensation called %d times, its step %d, the step's errors %v", rec.State, rec.LastError, r.n("undo"), r.n("refund-call"), stepErrs)
	if rec.State != ledger.Failed || strings.Contains(rec.LastError, "compensation") || r.n("refund-call") != 2 {
		t.Fatalf("promise \"called up to CompensationTries (%d) times\": a compensation whose step failed once: job %s (%s), the step called %d times, its errors %v", handler.CompensationTries, rec.State, rec.LastError, r.n("refund-call"), stepErrs)
	}
}
