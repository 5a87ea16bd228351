package handler_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// A signal that landed is never reported refused (issue 38 item 7): its
// write applied with the reply lost, the job took it and ended before the
// SDK's resend, and the resend read the job's end as a refusal ("nothing
// written"); a webhook's retry of an accepted signal got ErrJobEnded and
// could not tell "mine landed" from "it ended without me".
func TestALandedSignalIsNeverReportedRefused(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h) // the job waits for "approval"
	ctx := context.Background()
	ft := faults.New(nil)
	ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply,
		Match: func(b []byte) bool {
			return bytes.Contains(b, []byte(`nexjob:signal:approval`)) && bytes.Contains(b, []byte(`ada`))
		},
		After: func() {
			// Before the SDK resends: the same signal again wakes the job,
			// which takes it and ends.
			if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "ada"}); err != nil {
				t.Errorf("the wake: %v", err)
			}
			s.e.Drain(t, s.h)
		}})
	webhook, err := enqueue.New(faults.Config(s.e.Cfg, ft), s.e.Table, s.e.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.Signal(ctx, id, "approval", approval{By: "ada"}); err != nil {
		t.Errorf("a signal whose write landed (reply lost), taken by the job, which ended: %v; want no error", err)
	}
	if rec := s.e.Get(t, id); rec.State != ledger.Succeeded {
		t.Fatalf("the job: %s, want Succeeded with the signal", rec.State)
	}
	if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "ada"}); err != nil {
		t.Errorf("the webhook's retry of its accepted signal, the job ended: %v; want no error", err)
	}
	var refused *ledger.SignalRefusedError
	if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "bo"}); !errors.As(err, &refused) || !errors.Is(err, ledger.ErrJobEnded) {
		t.Errorf("another payload to the ended job: %v, want ErrJobEnded", err)
	}
}

// Requeue of a job whose wait timed out (issue 38 item 7): it kept the
// timeout and failed again at once, and the late approver's signal was
// refused as too late. Now the requeued run waits afresh, its steps
// before the wait replayed, and the late approver's signal completes it.
func TestRequeueReopensATimedOutWait(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h)
	s.e.Advance(t, 48*time.Hour+time.Minute)
	s.e.Drain(t, s.h)
	if rec := s.e.Get(t, id); rec.State != ledger.Failed {
		t.Fatalf("after the timeout: %s, want Failed", rec.State)
	}
	ctx := context.Background()
	if _, err := s.e.Client.Requeue(ctx, id); err != nil {
		t.Fatal(err)
	}
	s.e.Drain(t, s.h)
	if rec := s.e.Get(t, id); rec.State != ledger.Scheduled {
		t.Fatalf("the requeued job: %s (%s), want Scheduled in its wait again", rec.State, rec.LastError)
	}
	if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "late ada"}); err != nil {
		t.Fatalf("the late approver's signal after the requeue: %v", err)
	}
	s.e.Drain(t, s.h)
	rec := s.e.Get(t, id)
	if prepared, by := s.seen(id); rec.State != ledger.Succeeded || prepared != 1 || by != "late ada" {
		t.Fatalf("after the late signal: %s, prepared %d times, approved by %q; want Succeeded, prepared once, by the late approver", rec.State, prepared, by)
	}
}

type loneWait struct {
	Name string `json:"name"`
}

func (loneWait) Kind() string { return "lone-wait" }

// Found by the attack written from the docs (helper-5): a job whose only
// step is a wait that timed out, requeued, looped writing its wait (974
// UpdateItems in 8 s: the reopen left an empty steps map and the first
// step's write was conditional on no map); and a wait, a signal or a
// callback token named with 116 to 128 bytes could not be recorded or
// completed (the 128-byte limit was taken with the package's prefix).
func TestLoneAndLongestNamedWaits(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("a deployment's secret")}})
	tokens := make(chan [2]string, 4) // wait name, token
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[loneWait](func(ctx context.Context, j *handler.Job[loneWait]) error {
		tok, err := handler.CallbackToken(ctx, j.Args.Name)
		if err != nil {
			return err
		}
		_, err = handler.WaitForSignal[approval](ctx, j.Args.Name, time.Hour)
		var timeout *handler.SignalTimeoutError
		switch {
		case errors.As(err, &timeout):
			return handler.Permanent(err)
		case handler.IsSleep(err):
			tokens <- [2]string{j.Args.Name, tok}
		}
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	longest := strings.Repeat("😀", ledger.MaxStepName/4) // 128 bytes
	lone, named := enqueueOne(t, e.Client, loneWait{Name: "approval"}, nil), enqueueOne(t, e.Client, loneWait{Name: longest}, nil)
	e.Drain(t, h)
	var tok [2]string
	for range 2 {
		select {
		case got := <-tokens:
			if got[0] == longest {
				tok = got
			}
		default:
		}
	}
	if tok[1] == "" {
		t.Fatalf("the wait named with %d bytes never began: %s (%s)", len(longest), e.Get(t, named).State, e.Get(t, named).LastError)
	}
	if err := e.Client.Complete(ctx, tok[1], approval{By: "ada"}); err != nil {
		t.Fatalf("completing a wait named with %d bytes by its token: %v", len(longest), err)
	}
	e.Advance(t, time.Hour+time.Minute) // the lone wait times out
	e.Drain(t, h)
	if rec := e.Get(t, named); rec.State != ledger.Succeeded {
		t.Errorf("the wait named with %d bytes: %s (%s), want Succeeded", len(longest), rec.State, rec.LastError)
	}
	if rec := e.Get(t, lone); rec.State != ledger.Failed {
		t.Fatalf("the lone wait after its timeout: %s, want Failed", rec.State)
	}
	if _, err := e.Client.Requeue(ctx, lone); err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, h)
	if rec := e.Get(t, lone); rec.State != ledger.Scheduled {
		t.Fatalf("the requeued lone wait: %s (%s), want Scheduled in its wait again", rec.State, rec.LastError)
	}
	if err := e.Client.Signal(ctx, lone, "approval", approval{By: "late ada"}); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	if rec := e.Get(t, lone); rec.State != ledger.Succeeded {
		t.Fatalf("the requeued lone wait after its signal: %s (%s)", rec.State, rec.LastError)
	}
}
