package handler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type atkMeanwhile struct {
	N int `json:"n"`
}

func (atkMeanwhile) Kind() string { return "atk.meanwhile" }

// README, Signals: "A signal that comes while the run that begins the
// wait is ending finds the job running and wakes no one: that run, once
// its wait is recorded, reads the record once and wakes the job itself";
// enqueue's Signal: "recorded on the job, and the job woken when it
// sleeps in that wait".
//
// The signal's call returns nil (recorded while the job ran). The run's
// one read for it (handler.signalledMeanwhile) is throttled past the
// SDK's retries: the error is dropped ("the wait's end wakes it") and the
// job sleeps to its timeout, 48 hours, with a signal it holds. Nothing
// tries again: the caller saw success, the run's message is deleted.
func TestAttackSignalMeanwhileLostToOneFailedRead(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	ft := faults.New(nil)
	cfg := faults.Config(e.Cfg, ft)
	e.Cfg = cfg // the handler's requests go through the faults; the signaller's (e.Client) do not
	reg := handler.NewRegistry()
	var mu sync.Mutex
	got := map[string]string{}
	var fault *faults.Handle
	handler.AddWorker(reg, handler.WorkFunc[atkMeanwhile](func(ctx context.Context, j *handler.Job[atkMeanwhile]) error {
		a, err := handler.WaitForSignal[approval](ctx, "approval", 48*time.Hour)
		if handler.IsSleep(err) && j.Attempt == 1 {
			// The wait is recorded; the signal lands now, while this run
			// ends (the job is Processing: it wakes no one).
			if err := e.Client.Signal(context.Background(), j.ID, "approval", approval{By: "ada"}); err != nil {
				return handler.Permanent(fmt.Errorf("the signal itself: %w", err))
			}
			f := ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Throttle, Times: faults.Attempts})
			fault = &f
		}
		if err != nil {
			return err
		}
		mu.Lock()
		got[j.ID] = a.By
		mu.Unlock()
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, atkMeanwhile{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h) // no clock moved: the signal, not the timeout, should wake it
	if fault == nil || fault.Fired() == 0 {
		t.Fatal("the fault never fired")
	}
	rec := e.Get(t, res.ID)
	mu.Lock()
	by := got[res.ID]
	mu.Unlock()
	if rec.State != ledger.Succeeded || by != "ada" {
		t.Fatalf("a signal recorded (its call returned nil) while the run that began the wait ended, that run's read throttled past the retries: job %s until %s from now, the wait got %q; want woken by the signal",
			rec.State, ledger.Millis(rec.RunAt).Sub(e.Now()).Round(time.Minute), by)
	}
}
