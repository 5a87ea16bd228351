package handler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type atkBackoff struct {
	N int `json:"n"`
}

func (atkBackoff) Kind() string { return "atk.backoff" }

// README, Signals: "the same signal again, a caller's retry after an
// error, is no error and wakes the job if it still waits"; enqueue's
// Signal doc: "the same signal sent again (the same payload) is no error
// and wakes the job if it still sleeps in the wait". Running jobs:
// "handler.RetryAfter(d, err) picks the delay".
//
// A caller's retry of its signal (legit: its first call's send failed,
// say) after the job took the signal and moved on into a 10-minute
// RetryAfter wakes the job at once: Client.Signal wakes when
// Store.Waiting says so, and Waiting only checks that the job is
// Scheduled and the wait's end (48 h) is ahead, not that the job sleeps
// in that wait. The retry runs 10 minutes early.
func TestAttackSignalRetryWakesAJobNotInTheWait(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	var mu sync.Mutex
	afterSignal := map[string]int{}
	handler.AddWorker(reg, handler.WorkFunc[atkBackoff](func(ctx context.Context, j *handler.Job[atkBackoff]) error {
		if _, err := handler.WaitForSignal[approval](ctx, "approval", 48*time.Hour); err != nil {
			return err
		}
		mu.Lock()
		afterSignal[j.ID]++
		n := afterSignal[j.ID]
		mu.Unlock()
		if n == 1 {
			return handler.RetryAfter(10*time.Minute, errors.New("provider busy: come back in 10 minutes"))
		}
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, atkBackoff{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, res.ID, ledger.Scheduled)
	if err := e.Client.Signal(ctx, res.ID, "approval", approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, h)
	before := e.RequireState(t, res.ID, ledger.Scheduled) // in its 10-minute RetryAfter
	// The caller's retry of the same signal (as the docs invite).
	if err := e.Client.Signal(ctx, res.ID, "approval", approval{By: "ada"}); err != nil {
		t.Fatalf("the caller's retry of its signal: %v", err)
	}
	e.DrainNow(t, h) // no clock moved
	rec := e.Get(t, res.ID)
	mu.Lock()
	runs := afterSignal[res.ID]
	mu.Unlock()
	if rec.State != ledger.Scheduled || runs != 1 {
		t.Fatalf("a retry of a signal the job already took, during its RetryAfter(10m) (due in %s): job %s, runs after the signal %d, want still Scheduled and 1 run (the retry ran early)",
			ledger.Millis(before.RunAt).Sub(e.Now()).Round(time.Second), rec.State, runs)
	}
}
