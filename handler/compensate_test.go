package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Compensations (issue 39 item 10): declared after the step they undo,
// run once when the job fails for good or is cancelled.

type payJob struct {
	Mode string `json:"mode"` // "permanent", "flaky", "ok", "sleep", "block", "badRefund"
}

func (payJob) Kind() string { return "comp-pay" }

type compRig struct {
	e       *nexjobtest.Env
	h       *handler.Handler
	ft      *faults.Transport
	mu      sync.Mutex
	calls   map[string]int
	started chan struct{}
	proceed chan struct{}
}

func newCompRig(t *testing.T) *compRig {
	t.Helper()
	r := &compRig{e: nexjobtest.New(t, nil), calls: map[string]int{}, started: make(chan struct{}, 1), proceed: make(chan struct{})}
	r.ft = faults.New(nil)
	r.e.Cfg = faults.Config(r.e.Cfg, r.ft)
	reg := handler.NewRegistry()
	count := func(k string) {
		r.mu.Lock()
		r.calls[k]++
		r.mu.Unlock()
	}
	handler.AddWorker(reg, handler.WorkFunc[payJob](func(ctx context.Context, j *handler.Job[payJob]) error {
		if _, err := handler.Step(ctx, "charge", func(context.Context) (int, error) {
			count("charge")
			return 100, nil
		}); err != nil {
			return err
		}
		if err := handler.Compensate(ctx, "refund", func(context.Context) error {
			count("refund")
			if j.Args.Mode == "badRefund" {
				return errors.New("the bank is down")
			}
			return nil
		}); err != nil {
			return err
		}
		switch j.Args.Mode {
		case "sleep":
			if err := handler.Sleep(ctx, "cool-off", time.Hour); err != nil {
				return err
			}
		case "block":
			r.started <- struct{}{}
			<-r.proceed
		}
		_, err := handler.Step(ctx, "ship", func(context.Context) (int, error) {
			count("ship")
			switch j.Args.Mode {
			case "permanent", "badRefund":
				return 0, handler.Permanent(errors.New("no carrier"))
			case "flaky":
				return 0, errors.New("carrier busy")
			}
			return 1, nil
		})
		return err
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

func (r *compRig) called(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[k]
}

// A job that fails for good runs its compensation once, after the step
// it undoes; a success runs none; a failure with attempts left runs none
// until the last attempt fails.
func TestCompensationRunsOnceWhenTheJobFailsForGood(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode    string
		state   ledger.State
		refunds int
	}{{"permanent", ledger.Failed, 1}, {"flaky", ledger.Failed, 1}, {"ok", ledger.Succeeded, 0}} {
		r := newCompRig(t)
		id := enqueueOne(t, r.e.Client, payJob{Mode: tc.mode}, &enqueue.Opts{MaxAttempts: 3})
		r.e.Drain(t, r.h)
		rec := r.e.Get(t, id)
		if rec.State != tc.state || r.called("refund") != tc.refunds || r.called("charge") != 1 {
			t.Errorf("%s: %s (%s), charged %d, refunded %d; want %s, one charge, %d refunds", tc.mode, rec.State, rec.LastError, r.called("charge"), r.called("refund"), tc.state, tc.refunds)
		}
		if tc.mode == "flaky" && (rec.Attempt != 3 || r.called("ship") != 3) {
			t.Errorf("flaky: attempt %d, ship called %d times; want the refund only after the third", rec.Attempt, r.called("ship"))
		}
		if _, ok := rec.Steps["nexjob:comp:refund"]; ok != (tc.refunds == 1) {
			t.Errorf("%s: the refund's step recorded %v", tc.mode, ok)
		}
	}
}

// A cancel of a compensable job asleep is a run that refunds: the code
// after the sleep never runs, the job ends Failed, marked Cancelled.
func TestCancelOfASleepingJobCompensates(t *testing.T) {
	t.Parallel()
	r := newCompRig(t)
	id := enqueueOne(t, r.e.Client, payJob{Mode: "sleep"}, nil)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || !rec.Compensable {
		t.Fatalf("before the cancel: %s, compensable %v", rec.State, rec.Compensable)
	}
	_, err := r.e.Client.Cancel(context.Background(), id, "customer changed their mind", 0)
	var asked *enqueue.CancelRequestedError
	if !errors.As(err, &asked) {
		t.Fatalf("Cancel: %v, want a *CancelRequestedError (the job compensates)", err)
	}
	r.e.DrainNow(t, r.h)
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed || !rec.Cancelled || !strings.Contains(rec.LastError, "customer changed their mind") {
		t.Fatalf("after the cancel: %s cancelled=%v (%s)", rec.State, rec.Cancelled, rec.LastError)
	}
	if r.called("refund") != 1 || r.called("ship") != 0 || r.called("charge") != 1 {
		t.Fatalf("charged %d, refunded %d, shipped %d; want 1, 1, 0", r.called("charge"), r.called("refund"), r.called("ship"))
	}
}

// A running job cancelled stops at its next step and refunds.
func TestCancelOfARunningJobCompensates(t *testing.T) {
	t.Parallel()
	r := newCompRig(t)
	id := enqueueOne(t, r.e.Client, payJob{Mode: "block"}, nil)
	done := make(chan struct{})
	go func() { defer close(done); r.e.DrainNow(t, r.h) }()
	<-r.started
	_, err := r.e.Client.Cancel(context.Background(), id, "stop", 0)
	var asked *enqueue.CancelRequestedError
	if !errors.As(err, &asked) {
		t.Errorf("Cancel: %v, want a *CancelRequestedError", err)
	}
	r.e.Advance(t, ledger.CancelLook+time.Second) // the run looks at its record at its next step
	close(r.proceed)
	<-done
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed || !rec.Cancelled || r.called("refund") != 1 || r.called("ship") != 0 {
		t.Fatalf("%s cancelled=%v (%s), refunded %d, shipped %d", rec.State, rec.Cancelled, rec.LastError, r.called("refund"), r.called("ship"))
	}
}

// A compensation that keeps failing is called CompensationTries times and
// its error kept on the Failed job.
func TestFailingCompensationIsKept(t *testing.T) {
	t.Parallel()
	r := newCompRig(t)
	id := enqueueOne(t, r.e.Client, payJob{Mode: "badRefund"}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, `compensation "refund" failed`) || r.called("refund") != handler.CompensationTries {
		t.Fatalf("%s (%s), refund called %d times", rec.State, rec.LastError, r.called("refund"))
	}
}

// The refund's step written, its reply lost (500): the refund ran once,
// and the job's end stands.
func TestCompensationLostReplyRunsOnce(t *testing.T) {
	t.Parallel()
	r := newCompRig(t)
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), "nexjob:comp:refund") }, Fault: faults.LostReply})
	id := enqueueOne(t, r.e.Client, payJob{Mode: "permanent"}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if lost.Fired() != 1 || rec.State != ledger.Failed || r.called("refund") != 1 {
		t.Fatalf("fault fired %d; %s (%s), refunded %d", lost.Fired(), rec.State, rec.LastError, r.called("refund"))
	}
}

// A compensation's and a condition's name of 128 bytes (the documented
// limit is the user's name's, not the package's prefix and the name's)
// are recorded; 129 are refused up front.
func TestLongCompensationAndConditionNames(t *testing.T) {
	t.Parallel()
	for _, n := range []int{128, 129} {
		e := nexjobtest.New(t, nil)
		reg := handler.NewRegistry()
		name := strings.Repeat("n", n)
		refunds := 0
		handler.AddWorker(reg, handler.WorkFunc[payJob](func(ctx context.Context, j *handler.Job[payJob]) error {
			if err := handler.Compensate(ctx, name, func(context.Context) error { refunds++; return nil }); err != nil {
				return err
			}
			if _, err := handler.WaitForCondition(ctx, name, func(context.Context) (int, bool, error) { return 1, true, nil }, nil); err != nil {
				return err
			}
			return handler.Permanent(errors.New("no carrier"))
		}), nil)
		h := e.Handler(t, reg, &handler.Options{Logger: quiet})
		id := enqueueOne(t, e.Client, payJob{}, nil)
		rec := e.RunToEnd(t, h, id)
		switch {
		case n == 128 && (rec.State != ledger.Failed || !strings.Contains(rec.LastError, "no carrier") || refunds != 1 || strings.Contains(rec.LastError, "compensation")):
			t.Errorf("128 bytes: %s (%s), refunded %d times; want the job's own failure and one refund", rec.State, rec.LastError, refunds)
		case n == 129 && (rec.State != ledger.Failed || !strings.Contains(rec.LastError, "1 to 128 bytes") || refunds != 0):
			t.Errorf("129 bytes: %s (%s), refunded %d; want refused up front", rec.State, rec.LastError, refunds)
		}
	}
}
