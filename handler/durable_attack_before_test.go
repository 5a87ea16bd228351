package handler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Attacks on the durable jobs' promises (README: Results, Steps, Sleep,
// Signals, Callback tokens, Cancel of a running job), kept as regression
// tests: each is one promise a helper's attack broke (issue 29), held
// since its fix; its doc says how it broke.

type atkWait struct {
	N int `json:"n"`
}

func (atkWait) Kind() string { return "atk.wait" }

// README, Signals: "A signal sent before the wait is kept"; "The wait
// sleeps as Sleep does (no attempt spent, no compute held)";
// WaitForSignal's doc: "A signal sent before the wait is kept and
// returned at once."
//
// A signal that comes while the job runs, before its wait (a webhook
// faster than the worker), to a job with no steps yet: ledger.Signal
// creates the steps map, and the run's first record (the wait's end,
// written as "SET steps = {...} IF steps NOT EXISTS") is refused as "the
// record's steps changed under the run": the run fails, an attempt is
// spent, and on the job's last attempt (here its only one) the job fails
// with the signal on its record.
func TestAttackSignalDuringTheRunBeforeTheWait(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	var mu sync.Mutex
	got := map[string]string{}
	handler.AddWorker(reg, handler.WorkFunc[atkWait](func(ctx context.Context, j *handler.Job[atkWait]) error {
		if j.Attempt == 1 {
			// The webhook's signal lands while this run works, before
			// it waits.
			if err := e.Client.Signal(ctx, j.ID, "approval", approval{By: "ada"}); err != nil {
				return handler.Permanent(fmt.Errorf("the signal itself: %w", err))
			}
		}
		a, err := handler.WaitForSignal[approval](ctx, "approval", time.Hour)
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
	res, err := e.Client.Enqueue(ctx, atkWait{N: 1}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	rec := e.Get(t, res.ID)
	mu.Lock()
	by := got[res.ID]
	mu.Unlock()
	if rec.State != ledger.Succeeded || by != "ada" {
		t.Fatalf("a signal sent during the run, before its wait: job %s, attempt %d, last error %q; the wait got %q, want \"ada\"", rec.State, rec.Attempt, rec.LastError, by)
	}
}
