package handler_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
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
