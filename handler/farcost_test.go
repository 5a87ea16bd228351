package handler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// pollOne polls the rig's queue until a batch is handled.
func (r *farRig) pollOne(t *testing.T) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		n, err := r.poll.Poll(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatal("no message")
}

// farRetry fails its first run; its kind's backoff is DefaultBackoff's
// floor for the 6th attempt (21 min 51 s), the first one past 15 minutes.
type farRetry struct{ N int }

func (farRetry) Kind() string { return "far-retry" }

// throttledHourly may start once an hour.
type throttledHourly struct{ N int }

func (throttledHourly) Kind() string { return "throttled-hourly" }

// A retry due beyond 15 minutes (DefaultBackoff's after the 6th attempt:
// the 5th's is at most 13 min 34 s) waits in a one-time schedule, not in
// SQS hops: the failed run's claim and finish, a CreateSchedule (1
// firing, two minutes before the retry's time), the worker's carry of
// the firing to that time (one send), then the retry's claim and finish:
// 4 write units + 2 index.
func TestFarRetryTakesASchedule(t *testing.T) {
	t.Parallel()
	if handler.FloorBackoff(6) <= 15*time.Minute {
		t.Fatalf("DefaultBackoff(6) is at least %s, within 15 min", handler.FloorBackoff(6))
	}
	for range 1000 {
		if d := handler.DefaultBackoff(5); d > 15*time.Minute {
			t.Fatalf("DefaultBackoff(5) drew %s, past 15 min", d)
		}
	}
	failed := false
	r := newFarRigWith(t, false, func(reg *handler.Registry) {
		handler.AddWorker(reg, handler.WorkFunc[farRetry](func(context.Context, *handler.Job[farRetry]) error {
			if !failed {
				failed = true
				return errors.New("down")
			}
			return nil
		}), &handler.KindOptions{Backoff: func(int) time.Duration { return handler.FloorBackoff(6) }})
	}, func(o *handler.Options) { o.MaxDelay = time.Second })
	ctx := context.Background()
	step := meterStep(t, r.counter)
	upd := "DynamoDB.UpdateItem"
	var res enqueue.Result
	var err error
	step("enqueue", []string{"DynamoDB.PutItem", "SQS.SendMessage"}, awstest.Units{Write: 1, Sends: 1}, func() {
		if res, err = r.h.Producer().Enqueue(ctx, farRetry{1}, &enqueue.Opts{MaxAttempts: 7}); err != nil {
			t.Fatal(err)
		}
	})
	step("fails, retried 21 min 51 s on", []string{upd, upd, "Scheduler.CreateSchedule"}, awstest.Units{Write: 2, Index: 1, Schedules: 1}, func() { r.pollOne(t) })
	if rec := r.e.Get(t, res.ID); rec.State != ledger.Scheduled || len(r.schedulesFor(t, res.ID)) != 1 || r.e.QueueDepth(t, r.e.QueueURL) != 0 {
		t.Fatalf("after the failure: %s, schedules %v, %d SQS messages; want Scheduled, one schedule, none", rec.State, r.schedulesFor(t, res.ID), r.e.QueueDepth(t, r.e.QueueURL))
	}
	r.fireLate(t, res.ID, 0, []string{upd, upd}, awstest.Units{Write: 2, Index: 1}) // the retry runs
	if rec := r.e.Get(t, res.ID); rec.State != ledger.Succeeded || rec.Attempt != 2 {
		t.Fatalf("the job: %s attempt %d", rec.State, rec.Attempt)
	}
}

// A throttled start sent to a slot beyond 15 minutes (here an hour on)
// waits in a one-time schedule, not one delayed send: the claim, the
// rate log's read and its slot, the deferral and its CreateSchedule;
// when the schedule fires (1 firing, two minutes before the deferral's
// run time), the worker's carry of it to that time (one send), then a
// second claim, which finds its slot on the record, and the finish.
func TestFarDeferralTakesASchedule(t *testing.T) {
	t.Parallel()
	r := newFarRigWith(t, false, func(reg *handler.Registry) {
		handler.AddWorker(reg, handler.WorkFunc[throttledHourly](func(context.Context, *handler.Job[throttledHourly]) error { return nil }),
			&handler.KindOptions{Throttle: &handler.Throttle{Limit: 1, Period: time.Hour}})
	}, func(o *handler.Options) { o.MaxDelay = time.Second })
	// The carried firing comes within ThrottleWait before the slot, and the claim
	// honours the slot on the record within slotTolerance of it: on real
	// time, a loaded machine took longer than that between the firing and
	// the claim, and the start took a new slot an hour on (the five in a
	// row, run 1 at 5c04a95).
	r.clock.stop()
	ctx := context.Background()
	step := meterStep(t, r.counter)
	put, upd, get, send := "DynamoDB.PutItem", "DynamoDB.UpdateItem", "DynamoDB.GetItem", "SQS.SendMessage"
	enq := func(n int) string {
		res, err := r.h.Producer().Enqueue(ctx, throttledHourly{n}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.pollOne(t)
		return res.ID
	}
	var first, second string
	step("a start taking the hour's slot", []string{put, send, upd, get, put, upd}, awstest.Units{Write: 4, Read: 1, Sends: 1}, func() { first = enq(1) })
	step("a start sent to the next slot, an hour on", []string{put, send, upd, get, put, upd, "Scheduler.CreateSchedule"}, awstest.Units{Write: 4, Index: 1, Read: 1, Sends: 1, Schedules: 1}, func() { second = enq(2) })
	if rec := r.e.Get(t, first); rec.State != ledger.Succeeded {
		t.Fatalf("first job %s", rec.State)
	}
	if rec := r.e.Get(t, second); rec.State != ledger.Scheduled || len(r.schedulesFor(t, second)) != 1 || r.e.QueueDepth(t, r.e.QueueURL) != 0 {
		t.Fatalf("deferred job: %s, schedules %v, %d SQS messages; want Scheduled, one schedule, none", rec.State, r.schedulesFor(t, second), r.e.QueueDepth(t, r.e.QueueURL))
	}
	// Scheduler fires at its schedule's time, two minutes before the
	// deferral's run time (a second before the slot: the run waits the
	// rest); the worker carries it to the run time. The deferred start,
	// at its slot (on the record):
	r.fireLate(t, second, 0, []string{upd, upd}, awstest.Units{Write: 2, Index: 1})
	if rec := r.e.Get(t, second); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("the deferred job: %s attempt %d", rec.State, rec.Attempt)
	}
}
