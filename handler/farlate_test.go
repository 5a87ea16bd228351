package handler_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// lateFirings are how long after its at() time the tests fire a one-time
// schedule: EventBridge Scheduler invokes a target within the minute of
// its time ("60 second precision"), and two minutes is what the library
// allows for.
var lateFirings = []time.Duration{3 * time.Second, 30 * time.Second, 2 * time.Minute}

// scheduleTime is when the job's one schedule fires: its at() time.
func (r *farRig) scheduleTime(t *testing.T, id string) time.Time {
	t.Helper()
	exprs := r.schedulesFor(t, id)
	if len(exprs) != 1 {
		t.Fatalf("job %s has schedules %v, want one", id, exprs)
	}
	for _, x := range exprs {
		at, err := time.Parse("at(2006-01-02T15:04:05)", x)
		if err != nil {
			t.Fatalf("schedule %q is not at(…)", x)
		}
		return at
	}
	panic("unreachable")
}

// fireLate moves the clock to late after the job's schedule's time, has
// the schedule fire, and handles what comes until the job's run: a
// firing before the job's run time is carried the rest of the way by an
// SQS delay (no DynamoDB request: one send), then the clock is moved to
// the run time and the job claimed; one at or after it is claimed at
// once. run is the requests and units of the claim on, as meterStep
// counts them.
func (r *farRig) fireLate(t *testing.T, id string, late time.Duration, run []string, runUnits awstest.Units) {
	t.Helper()
	runAt := ledger.Millis(r.e.Get(t, id).RunAt)
	r.clock.Advance(r.scheduleTime(t, id).Add(late).Sub(r.clock.Now()))
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d firings, want 1", n)
	}
	step := meterStep(t, r.counter)
	if r.clock.Now().Before(runAt) {
		step("the firing, "+late.String()+" late, before the run time", []string{"SQS.SendMessage"}, awstest.Units{Sends: 1}, func() { r.pollOne(t) })
		r.clock.Advance(runAt.Sub(r.clock.Now()))
	}
	step("the run, after a firing "+late.String()+" late", run, runUnits, func() { r.pollOne(t) })
}

// A throttled start deferred to its slot an hour on waits in a one-time
// schedule, and Scheduler fires it late (3 s, 30 s, 2 min after its
// time): the job starts on the slot on its record, taking no new one.
// Before, the schedule fired at the deferral's run time, a second before
// the slot, and a claim more than slotTolerance (1 s) after the slot took
// a new slot an hour on: every hour, if the firings kept late.
func TestLateFiringStartsTheThrottledJobOnItsSlot(t *testing.T) {
	t.Parallel()
	for _, late := range lateFirings {
		t.Run(late.String(), func(t *testing.T) {
			t.Parallel()
			r := newFarRigWith(t, false, func(reg *handler.Registry) {
				handler.AddWorker(reg, handler.WorkFunc[throttledHourly](func(context.Context, *handler.Job[throttledHourly]) error { return nil }),
					&handler.KindOptions{Throttle: &handler.Throttle{Limit: 1, Period: time.Hour}})
			}, func(o *handler.Options) { o.MaxDelay = time.Second })
			r.clock.stop()
			ctx := context.Background()
			var ids []string
			for n := range 2 {
				res, err := r.h.Producer().Enqueue(ctx, throttledHourly{n}, nil)
				if err != nil {
					t.Fatal(err)
				}
				r.pollOne(t)
				ids = append(ids, res.ID)
			}
			rec := r.e.Get(t, ids[1])
			if rec.State != ledger.Scheduled || len(r.schedulesFor(t, ids[1])) != 1 {
				t.Fatalf("the second job: %s with schedules %v, want Scheduled to its slot an hour on, with one", rec.State, r.schedulesFor(t, ids[1]))
			}
			upd := "DynamoDB.UpdateItem"
			// The claim and the finish: no rate log read or put (a new slot).
			r.fireLate(t, ids[1], late, []string{upd, upd}, awstest.Units{Write: 2, Index: 1})
			if rec := r.e.Get(t, ids[1]); rec.State != ledger.Succeeded || rec.Attempt != 1 {
				t.Fatalf("the deferred job: %s attempt %d, want Succeeded on attempt 1", rec.State, rec.Attempt)
			}
		})
	}
}

// farTimed records the clock when it runs.
type farTimed struct{ N int }

func (farTimed) Kind() string { return "far-timed" }

// A far job (an hour ahead) with a deadline 10 s after its run time,
// fired late (3 s, 30 s, 2 min after its schedule's time): it starts at
// its run time, within the second after it as a job waiting in an SQS
// delay does. Before, the schedule fired at the run time: the job
// started late, and past its deadline it expired unrun.
func TestLateFiringStartsAFarJobAtItsRunTime(t *testing.T) {
	t.Parallel()
	for _, late := range lateFirings {
		t.Run(late.String(), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var started time.Time
			var r *farRig
			r = newFarRigWith(t, false, func(reg *handler.Registry) {
				handler.AddWorker(reg, handler.WorkFunc[farTimed](func(context.Context, *handler.Job[farTimed]) error {
					mu.Lock()
					defer mu.Unlock()
					started = r.clock.Now()
					return nil
				}), nil)
			}, func(o *handler.Options) { o.MaxDelay = time.Second })
			r.clock.stop()
			runAt := r.clock.Now().Add(time.Hour).Truncate(time.Millisecond)
			res, err := r.h.Producer().Enqueue(context.Background(), farTimed{1}, &enqueue.Opts{RunAt: runAt, Deadline: runAt.Add(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			upd := "DynamoDB.UpdateItem"
			r.fireLate(t, res.ID, late, []string{upd, upd}, awstest.Units{Write: 2, Index: 1})
			rec := r.e.Get(t, res.ID)
			mu.Lock()
			defer mu.Unlock()
			// To the second, as an SQS delay (whole seconds, rounded up)
			// and a schedule's at() (rounded up to the second) give it.
			if rec.State != ledger.Succeeded || started.Before(runAt) || !started.Before(runAt.Add(time.Second)) {
				t.Fatalf("the far job: %s (%q), started at %s, want Succeeded at its run time %s (within the second after)", rec.State, rec.LastError, started, runAt)
			}
		})
	}
}
