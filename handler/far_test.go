package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/onetime"
)

// farRig is a handler whose far messages wait in one-time schedules on
// the emulator's EventBridge Scheduler (moto stores schedules and never
// fires them: fire plays Scheduler).
type farRig struct {
	e       *awstest.Env
	h       *handler.Handler
	clock   *clock
	counter *awstest.Meter
	sched   *scheduler.Client // uncounted: Scheduler's own side
	group   string
	poll    *poller.Poller
	ft      *faults.Transport // the handler's requests, with faulty set
	cfg     aws.Config        // the handler's (counted, through ft when faulty)
	far     *onetime.Client   // the handler's one-time schedules
}

func newFarRig(t *testing.T, faulty bool) *farRig {
	t.Helper()
	return newFarRigWith(t, faulty, nil)
}

// newFarRigWith is newFarRig with more workers registered by add, and
// the handler's options changed by tune.
func newFarRigWith(t *testing.T, faulty bool, add func(*handler.Registry), tune ...func(*handler.Options)) *farRig {
	t.Helper()
	e := awstest.New(t, nil)
	r := &farRig{e: e, clock: &clock{}, sched: scheduler.NewFromConfig(e.Cfg), group: "far-" + e.Table[len(e.Table)-9:]}
	if _, err := r.sched.CreateScheduleGroup(context.Background(), &scheduler.CreateScheduleGroupInput{Name: aws.String(r.group)}); err != nil {
		t.Fatal(err)
	}
	cfg := e.Cfg.Copy()
	if faulty {
		var fcfg aws.Config
		r.ft, fcfg = e.Faulty()
		cfg = fcfg.Copy()
	}
	r.counter = e.Meter(&cfg)
	arn, err := onetime.QueueARN(cfg.Region, e.QueueURL)
	if err != nil {
		t.Fatal(err)
	}
	far, err := onetime.New(scheduler.NewFromConfig(cfg), onetime.Options{Group: r.group, QueueARN: arn, RoleARN: "arn:aws:iam::123456789012:role/nexjob-scheduler"})
	if err != nil {
		t.Fatal(err)
	}
	r.cfg, r.far = cfg, far
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](ok), nil)
	if add != nil {
		add(reg)
	}
	o := &handler.Options{Ledger: ledger.Options{Now: r.clock.Now}, Far: far, Logger: quiet}
	for _, f := range tune {
		f(o)
	}
	if r.h, err = handler.New(cfg, e.Table, e.QueueURL, reg, o); err != nil {
		t.Fatal(err)
	}
	r.poll = poller.New(e.SQS, e.QueueURL, r.h.Handle, &poller.Options{WaitTime: -1})
	return r
}

// fire does what Scheduler does when a one-time schedule's time comes:
// it sends the target's input to the queue and deletes the schedule
// (ActionAfterCompletion DELETE). It returns how many fired.
func (r *farRig) fire(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	list, err := r.sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(r.group)})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range list.Schedules {
		got, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: s.Name, GroupName: aws.String(r.group)})
		if err != nil {
			t.Fatal(err)
		}
		at, err := time.Parse("at(2006-01-02T15:04:05)", aws.ToString(got.ScheduleExpression))
		if err != nil {
			t.Fatalf("schedule %s: %q is not at(…)", aws.ToString(s.Name), aws.ToString(got.ScheduleExpression))
		}
		if at.After(r.clock.Now()) {
			continue
		}
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: got.Target.Input}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.sched.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: s.Name, GroupName: aws.String(r.group)}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

// TestFarScheduleCostsConstantRequests: a job 30 days ahead and one 366
// days ahead each cost the same AWS requests from enqueue to Succeeded:
// PutItem and CreateSchedule; Scheduler's one send two minutes before the
// run time (onetime.Lead: one firing), which the worker carries to the
// run time with one SQS delay (one send of ours, no DynamoDB request);
// then the claim and the finish: 3 write units + 2 index (the job is
// Scheduled while it waits), no read. With SQS delays they made 2,880 and
// 35,136 hops of 900 s (a send, a receive, a delete and a share of an
// invocation each).
func TestFarScheduleCostsConstantRequests(t *testing.T) {
	t.Parallel()
	r := newFarRigWith(t, false, nil, func(o *handler.Options) { o.MaxDelay = time.Second })
	r.clock.stop()
	ctx := context.Background()
	want := []string{"DynamoDB.PutItem", "Scheduler.CreateSchedule", "SQS.SendMessage", "DynamoDB.UpdateItem", "DynamoDB.UpdateItem"}
	wantUnits := awstest.Units{Write: 3, Index: 2, Sends: 1, Schedules: 1}
	for _, days := range []int{30, 366} {
		r.counter.Reset()
		res, err := r.h.Producer().Enqueue(ctx, email{To: fmt.Sprintf("far-%d@example.com", days)}, &enqueue.Opts{Delay: time.Duration(days) * 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if n := r.e.QueueDepth(t, r.e.QueueURL); n != 0 {
			t.Fatalf("%d days: %d SQS messages while it waits, want none", days, n)
		}
		if r.fire(t) != 0 {
			t.Fatalf("%d days: a schedule fired before its time", days)
		}
		runAt := ledger.Millis(r.e.Get(t, res.ID).RunAt)
		r.clock.Advance(r.scheduleTime(t, res.ID).Sub(r.clock.Now()))
		if n := r.fire(t); n != 1 {
			t.Fatalf("%d days: %d schedules fired at their time, want 1", days, n)
		}
		r.pollOne(t) // the firing, carried to the run time
		if rec := r.e.Get(t, res.ID); rec.State != ledger.Scheduled {
			t.Fatalf("%d days: the firing, %s before the run time, left the job %s", days, runAt.Sub(r.clock.Now()), rec.State)
		}
		r.clock.Advance(runAt.Sub(r.clock.Now()))
		r.pollOne(t) // the carried message, at the run time
		calls, units := r.counter.Calls(), r.counter.Units()
		t.Logf("%d days ahead: %v; %v; 1 firing", days, calls, units)
		if !slices.Equal(calls, want) || units != wantUnits {
			t.Errorf("%d days ahead: our requests %v, %v; want %v, %v (plus Scheduler's one send)", days, calls, units, want, wantUnits)
		}
		rec, err := r.h.Producer().Store().Get(ctx, res.ID)
		if err != nil || rec.State != ledger.Succeeded {
			t.Fatalf("%d days: %s %v", days, rec.State, err)
		}
	}
}

// TestFarScheduleResentAndCancelled: a CreateSchedule applied with its
// reply lost is resent by the SDK and meets its own schedule (a
// conflict): that reads as scheduled, once. Cancelling the job removes its
// schedule, and nothing fires.
func TestFarScheduleResentAndCancelled(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	ctx := context.Background()
	lost := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: faults.LostReply})
	res, err := r.h.Producer().Enqueue(ctx, email{To: "cancel@example.com"}, &enqueue.Opts{Delay: 40 * 24 * time.Hour})
	if err != nil {
		t.Fatalf("enqueue with the schedule's reply lost: %v", err)
	}
	fired(t, lost, 1)
	// Dispatching it again (a producer's retry, the guard) moves, not doubles, it.
	rec, err := r.h.Producer().Store().Get(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.h.Producer().Dispatch(ctx, rec); err != nil {
		t.Fatalf("dispatch again: %v", err)
	}
	list, err := r.sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(r.group)})
	if err != nil || len(list.Schedules) != 1 || aws.ToString(list.Schedules[0].Name) != onetime.Name(res.ID, ledger.Millis(rec.RunAt)) {
		t.Fatalf("schedules after two dispatches: %v %+v", err, list)
	}
	got, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: list.Schedules[0].Name, GroupName: aws.String(r.group)})
	if err != nil {
		t.Fatal(err)
	}
	var msg enqueue.Message
	if err := json.Unmarshal([]byte(aws.ToString(got.Target.Input)), &msg); err != nil || msg.ID != res.ID {
		t.Fatalf("the schedule sends %q", aws.ToString(got.Target.Input))
	}
	if _, err := r.h.Producer().Cancel(ctx, res.ID, "", 0); err != nil {
		t.Fatal(err)
	}
	if list, err := r.sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(r.group)}); err != nil || len(list.Schedules) != 0 {
		t.Fatalf("after the cancel: %v, %d schedules left", err, len(list.Schedules))
	}
}

// TestFarScheduleThrottled: CreateSchedule throttled past the SDK's
// retries: the enqueue says the job is recorded but not sent (a
// *DispatchError), the job is marked unsent, and the caller's retry of
// its key schedules it. Nothing is lost, nothing runs twice.
func TestFarScheduleThrottled(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	ctx := context.Background()
	h := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: faults.Throttle, Times: faults.Attempts})
	opts := &enqueue.Opts{IdempotencyKey: "far-throttled", Delay: 90 * 24 * time.Hour}
	_, err := r.h.Producer().Enqueue(ctx, email{To: "throttled@example.com"}, opts)
	var de *enqueue.DispatchError
	if !errors.As(err, &de) {
		t.Fatalf("enqueue with CreateSchedule throttled: %v, want a *DispatchError", err)
	}
	fired(t, h, faults.Attempts)
	if rec, _ := r.h.Producer().Store().Get(ctx, de.JobID); !rec.Undispatched || rec.State != ledger.Scheduled {
		t.Fatalf("the job: %s, unsent mark %v", rec.State, rec.Undispatched)
	}
	again, err := r.h.Producer().Enqueue(ctx, email{To: "throttled@example.com"}, opts)
	if err != nil || !again.Duplicate || !again.Redispatched || again.ID != de.JobID {
		t.Fatalf("the retry of its key: %+v %v", again, err)
	}
	list, err := r.sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(r.group)})
	if err != nil || len(list.Schedules) != 1 {
		t.Fatalf("schedules: %v %d", err, len(list.Schedules))
	}
	r.clock.Advance(90*24*time.Hour + time.Second)
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d fired", n)
	}
	r.e.Drain(t, r.h)
	if rec, _ := r.h.Producer().Store().Get(ctx, de.JobID); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("the job: %s attempt %d", rec.State, rec.Attempt)
	}
}

// TestFarCheckMakesSureOfTheJobsSchedule: a dispatch guard's check of a
// far job (due its run time plus After) that reaches the worker (the
// guard sent it through SQS) makes sure of the job's own one-time
// schedule, one CreateSchedule of the run's name, and is done: it takes
// no schedule of its own and hops no further. When the job's schedule is
// missing (its producer died before making it) the check makes it.
func TestFarCheckMakesSureOfTheJobsSchedule(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, false)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, email{To: "checked@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := r.h.Producer().Store().Get(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	name := onetime.Name(res.ID, ledger.Millis(rec.RunAt))
	check := enqueue.Message{V: 1, ID: res.ID, Kind: rec.Kind, RunAt: rec.RunAt + (2 * time.Minute).Milliseconds(), Check: true}
	for _, missing := range []bool{false, true} {
		if missing {
			if _, err := r.sched.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: aws.String(name), GroupName: aws.String(r.group)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(check.Encode())}); err != nil {
			t.Fatal(err)
		}
		r.counter.Reset()
		r.e.Drain(t, r.h)
		// The job's run time is the record's (one eventually consistent
		// read: a body anyone can send does not choose a far schedule).
		if calls := r.counter.Calls(); !slices.Equal(calls, []string{"DynamoDB.GetItem", "Scheduler.CreateSchedule"}) {
			t.Fatalf("the far check (schedule missing %v): %v, want the job's read and one CreateSchedule", missing, calls)
		}
		if u := r.counter.Units(); u != (awstest.Units{Read: 0.5, Schedules: 1}) {
			t.Fatalf("the far check (schedule missing %v): %v, want half a read unit (eventually consistent) and one CreateSchedule", missing, u)
		}
		if n := r.e.QueueDepth(t, r.e.QueueURL); n != 0 {
			t.Fatalf("%d SQS messages left hopping", n)
		}
		got := r.schedulesFor(t, res.ID)
		if len(got) != 1 || got[name] != atOf(rec.RunAt) {
			t.Fatalf("schedule missing %v: the job's schedules %v, want %s at %s alone", missing, got, name, atOf(rec.RunAt))
		}
	}
}

// TestFarCancelWhenDeleteScheduleFails: the cancel's DeleteSchedule is
// throttled past the SDK's retries. The job is cancelled all the same
// (removing the schedule is best effort), and when the schedule fires
// the claim refuses the job: nothing runs.
func TestFarCancelWhenDeleteScheduleFails(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, email{To: "cancelled-far@example.com"}, &enqueue.Opts{Delay: 60 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := r.ft.Add(faults.Rule{Op: "Scheduler.DeleteSchedule", Fault: faults.Throttle, Times: faults.Forever})
	rec, err := r.h.Producer().Cancel(ctx, res.ID, "not wanted", 0)
	if err != nil || rec.State != ledger.Failed || !rec.Cancelled {
		t.Fatalf("cancel with DeleteSchedule throttled: %+v %v", rec, err)
	}
	if h.Fired() < faults.Attempts {
		t.Fatalf("DeleteSchedule throttled %d times, want the SDK's whole budget", h.Fired())
	}
	h.Remove()
	r.clock.Advance(60*24*time.Hour + time.Second)
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d schedules fired, want the one left behind", n)
	}
	r.e.Drain(t, r.h)
	if got, _ := r.h.Producer().Store().Get(ctx, res.ID); got.State != ledger.Failed || got.Attempt != 0 {
		t.Fatalf("the cancelled job: %s attempt %d", got.State, got.Attempt)
	}
}

// TestFarScheduleOnANamedQueue: a far job on a named queue waits in a
// one-time schedule whose target is that queue (its ARN from
// onetime.Options.QueueARNs) and whose message names it, so the job is
// sent to its own queue at its time; a queue the scheduler has no ARN
// for is an error, not a schedule aimed at the job queue.
func TestFarScheduleOnANamedQueue(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk"}})
	ctx := context.Background()
	sched := scheduler.NewFromConfig(e.Cfg)
	group := "far-" + e.Table[len(e.Table)-9:]
	if _, err := sched.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
		t.Fatal(err)
	}
	jobs, _ := onetime.QueueARN(e.Cfg.Region, e.QueueURL)
	bulk, _ := onetime.QueueARN(e.Cfg.Region, e.Queues["bulk"])
	far, err := onetime.New(sched, onetime.Options{Group: group, QueueARN: jobs, RoleARN: "arn:aws:iam::123456789012:role/nexjob-scheduler", QueueARNs: map[string]string{"bulk": bulk}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Far: far, Queues: e.Queues, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Enqueue(ctx, email{To: "far@example.com"}, &enqueue.Opts{Queue: "bulk", Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.Client.Store().Get(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(onetime.Name(res.ID, ledger.Millis(rec.RunAt))), GroupName: aws.String(group)})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := enqueue.DecodeMessage(aws.ToString(got.Target.Input))
	if aws.ToString(got.Target.Arn) != bulk || err != nil || msg.Queue != "bulk" || msg.ID != res.ID {
		t.Fatalf("schedule target %s, message %+v (%v); want %s and a message naming bulk", aws.ToString(got.Target.Arn), msg, err, bulk)
	}
	if err := far.Schedule(ctx, "nj-x", time.Now().Add(time.Hour), "imports", "{}"); err == nil {
		t.Fatal("a schedule for a queue with no ARN was made")
	}
}
