package handler_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
)

// laterAgain is a kind whose every run asks to be retried 40 days on: a
// far retry, which waits in a one-time schedule.
type laterAgain struct{ N int }

func (laterAgain) Kind() string { return "later-again" }

func addLaterAgain(reg *handler.Registry) {
	handler.AddWorker(reg, handler.WorkFunc[laterAgain](func(context.Context, *handler.Job[laterAgain]) error {
		return handler.RetryAfter(40*24*time.Hour, errors.New("not yet"))
	}), nil)
}

// schedulesFor lists the far group's schedules whose message names the
// job: name → at(…) expression.
func (r *farRig) schedulesFor(t *testing.T, jobID string) map[string]string {
	t.Helper()
	ctx := context.Background()
	list, err := r.sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(r.group)})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Schedules {
		got, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: s.Name, GroupName: aws.String(r.group)})
		if err != nil {
			t.Fatal(err)
		}
		if msg, err := enqueue.DecodeMessage(aws.ToString(got.Target.Input)); err == nil && msg.ID == jobID {
			out[aws.ToString(s.Name)] = aws.ToString(got.ScheduleExpression)
		}
	}
	return out
}

// atOf is the at(…) expression a schedule for the run time ms has:
// onetime.Lead before it, rounded up to the second.
func atOf(ms int64) string {
	return "at(" + ledger.Millis(ms).UTC().Add(-onetime.Lead).Add(time.Second-1).Truncate(time.Second).Format("2006-01-02T15:04:05") + ")"
}

// Issue 27 item 20: an operator cancels a far job; the cancel's
// DeleteSchedule is slow, and lands after another operator requeued the
// job and its run was retried 40 days on (a far retry, its own
// schedule). The late delete removes only the cancelled run's schedule:
// schedules are named per run time, so the requeued run's survives and
// the job is not left Scheduled with nothing to send it.
func TestSlowCancelSparesTheRequeuedRunsSchedule(t *testing.T) {
	t.Parallel()
	r := newFarRigWith(t, true, addLaterAgain)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, laterAgain{N: 1}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	r.ft.Add(faults.Rule{Op: "Scheduler.DeleteSchedule", Fault: faults.Pass, Before: func(*http.Request, []byte) {
		close(started)
		<-release // in flight until the requeued run has its schedule
	}})
	cancelled := make(chan error, 1)
	go func() {
		_, err := r.h.Producer().Cancel(ctx, res.ID, "operator A", 0)
		cancelled <- err
	}()
	<-started // the job is cancelled; its DeleteSchedule is on its way
	if _, err := r.h.Producer().Requeue(ctx, res.ID); err != nil {
		t.Fatalf("operator B's requeue: %v", err)
	}
	r.e.DrainNow(t, r.h) // the requeued run fails, retried 40 days on
	rec := r.e.Get(t, res.ID)
	if rec.State != ledger.Scheduled || rec.Attempt != 1 {
		t.Fatalf("the requeued run: %s attempt %d, want Scheduled (a far retry) attempt 1", rec.State, rec.Attempt)
	}
	close(release)
	if err := <-cancelled; err != nil {
		t.Fatal(err)
	}
	got := r.schedulesFor(t, res.ID)
	found := false
	for _, at := range got {
		found = found || at == atOf(rec.RunAt)
	}
	if !found {
		t.Fatalf("after the cancel's late DeleteSchedule the job's schedules are %v: none sends its retry at %s; the job is Scheduled for good", got, atOf(rec.RunAt))
	}
	r.clock.Advance(ledger.Millis(rec.RunAt).Sub(r.clock.Now()) + time.Second)
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d schedules fired at the retry's time, want 1", n)
	}
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, res.ID); rec.Attempt != 2 {
		t.Fatalf("the retry did not run: %s attempt %d", rec.State, rec.Attempt)
	}
}

// Issue 27 item 20, the race the emulator cannot show: on AWS a fired
// schedule's ActionAfterCompletion DELETE can land after our next write
// of the same name (a debounce fold's carry after the early firing, a
// far retry), deleting the new schedule. The request sequence shows it
// cannot happen: no schedule name is ever written for two run times.
func TestNoScheduleNameServesTwoRunTimes(t *testing.T) {
	t.Parallel()
	r := newFarRigWith(t, true, addLaterAgain)
	ctx := context.Background()
	var mu sync.Mutex
	writes := map[string]map[string]bool{} // name → at(…) expressions written
	record := func(req *http.Request, body []byte) {
		s := string(body)
		i := strings.Index(s, `"ScheduleExpression":"`)
		if i < 0 {
			return
		}
		at, _, _ := strings.Cut(s[i+len(`"ScheduleExpression":"`):], `"`)
		name := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
		mu.Lock()
		defer mu.Unlock()
		if writes[name] == nil {
			writes[name] = map[string]bool{}
		}
		writes[name][at] = true
	}
	for _, op := range []string{"Scheduler.CreateSchedule", "Scheduler.UpdateSchedule"} {
		r.ft.Add(faults.Rule{Op: op, Fault: faults.Pass, Times: faults.Forever, Before: record})
	}
	// A debounced job 30 days ahead, folded a day later (its run moves a
	// day on, its schedule stays): the schedule fires early and the
	// worker carries the message to the new run time.
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "far-fold", Period: 30 * 24 * time.Hour}}
	res, err := r.h.Producer().Enqueue(ctx, laterAgain{N: 1}, db)
	if err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(24 * time.Hour)
	if got, err := r.h.Producer().Enqueue(ctx, laterAgain{N: 2}, db); err != nil || !got.Folded {
		t.Fatalf("the fold: %+v %v", got, err)
	}
	r.clock.Advance(29*24*time.Hour + time.Second)
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d fired at the first run time, want the early one", n)
	}
	r.e.Drain(t, r.h) // carried to the run time the fold chose
	r.clock.Advance(24 * time.Hour)
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d fired at the folded run time, want 1", n)
	}
	r.e.DrainNow(t, r.h) // runs, retried 40 days on: another schedule
	if rec := r.e.Get(t, res.ID); rec.State != ledger.Scheduled || rec.Attempt != 1 {
		t.Fatalf("the job: %s attempt %d, want a far retry", rec.State, rec.Attempt)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writes) == 0 {
		t.Fatal("no schedule written")
	}
	for name, ats := range writes {
		if len(ats) > 1 {
			t.Errorf("schedule %s written for %d run times %v: a fired one's late DELETE would remove the later", name, len(ats), ats)
		}
	}
}

// conflict is Scheduler's answer to a create whose name exists.
const conflict = `{"__type":"ConflictException","message":"injected: the schedule exists"}`

// A create meets its name (the schedule existed), and the update that
// follows finds it gone (it fired and deleted itself, or a cancel removed
// it, in between): the schedule is created again, not lost. The second
// create's reply lost: the SDK's resend meets it, which reads as done;
// throttled past the SDK's retries: the enqueue says the job is recorded
// but not sent (*DispatchError, marked unsent), and its key's retry
// schedules it.
func TestScheduleUpdateFindingItGoneCreates(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.Pass, faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			r := newFarRig(t, true)
			ctx := context.Background()
			r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: faults.Reject, Reply: conflict})
			update := r.ft.Add(faults.Rule{Op: "Scheduler.UpdateSchedule", Fault: faults.Pass})
			times := 1
			if fault == faults.Throttle {
				times = faults.Attempts
			}
			again := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: fault, Times: times})
			opts := &enqueue.Opts{IdempotencyKey: "gone-" + fault.String(), Delay: 30 * 24 * time.Hour}
			res, err := r.h.Producer().Enqueue(ctx, email{To: "gone@example.com"}, opts)
			fired(t, update, 1)
			fired(t, again, times)
			if fault == faults.Throttle {
				var de *enqueue.DispatchError
				if !errors.As(err, &de) {
					t.Fatalf("the second create throttled: %v, want a *DispatchError", err)
				}
				if rec := r.e.Get(t, de.JobID); !rec.Undispatched {
					t.Fatal("the job is not marked unsent")
				}
				if res, err = r.h.Producer().Enqueue(ctx, email{To: "gone@example.com"}, opts); err != nil || !res.Redispatched {
					t.Fatalf("the key's retry: %+v %v", res, err)
				}
			} else if err != nil {
				t.Fatalf("enqueue: %v", err)
			}
			rec := r.e.Get(t, res.ID)
			if got := r.schedulesFor(t, res.ID); len(got) != 1 || got[onetimeName(res.ID, rec.RunAt)] != atOf(rec.RunAt) {
				t.Fatalf("the job's schedules: %v, want one at %s", got, atOf(rec.RunAt))
			}
		})
	}
}

// A cancel's DeleteSchedule applied with its reply lost: the SDK's resend
// finds it gone, which is done. Throttled past the retries:
// TestFarCancelWhenDeleteScheduleFails.
func TestFarCancelDeleteReplyLost(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, email{To: "cancel-lost@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lost := r.ft.Add(faults.Rule{Op: "Scheduler.DeleteSchedule", Fault: faults.LostReply})
	if rec, err := r.h.Producer().Cancel(ctx, res.ID, "", 0); err != nil || !rec.Cancelled {
		t.Fatalf("cancel with the delete's reply lost: %+v %v", rec, err)
	}
	fired(t, lost, 1)
	if got := r.schedulesFor(t, res.ID); len(got) != 0 {
		t.Fatalf("schedules left: %v", got)
	}
}

// Deleting a far job removes its run's schedule (the record the
// DeleteItem removed names the run time). The DeleteItem's reply lost:
// its resend finds no record, so the schedule is left; when it fires the
// worker finds no job and drops it. Throttled past the retries: an error,
// the job and its schedule untouched.
func TestDeleteFarJob(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.Pass, faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			r := newFarRig(t, true)
			ctx := context.Background()
			res, err := r.h.Producer().Enqueue(ctx, email{To: "delete@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			times := 1
			if fault == faults.Throttle {
				times = faults.Attempts
			}
			h := r.ft.Add(faults.Rule{Op: "DynamoDB.DeleteItem", Fault: fault, Times: times})
			err = r.h.Producer().Delete(ctx, res.ID)
			fired(t, h, times)
			left := r.schedulesFor(t, res.ID)
			switch fault {
			case faults.Pass:
				if err != nil || len(left) != 0 {
					t.Fatalf("delete: %v, schedules left %v", err, left)
				}
			case faults.LostReply:
				// The run's schedule is named from the record Delete read
				// before removing it, so a resend that finds nothing left
				// still removes it.
				if err != nil || len(left) != 0 {
					t.Fatalf("delete with its reply lost: %v, schedules left %v", err, left)
				}
			case faults.Throttle:
				// Delete ends an active job before it removes the record (see
				// enqueue.Client.Delete): throttled past the retries, the job
				// is left Failed and cancelled, its schedule in place (when it
				// fires it finds the job ended), and the error says so.
				if rec := r.e.Get(t, res.ID); err == nil || len(left) != 1 || rec.State != ledger.Failed || !rec.Cancelled {
					t.Fatalf("delete throttled: %v, schedules %v, job %s cancelled %v", err, left, rec.State, rec.Cancelled)
				}
				return
			}
			if _, err := r.h.Producer().Store().Get(ctx, res.ID); !errors.Is(err, ledger.ErrNotFound) {
				t.Fatalf("the record after the delete: %v", err)
			}
			r.clock.Advance(30*24*time.Hour + time.Second)
			r.fire(t)
			r.e.Drain(t, r.h) // a schedule left fires for no job: dropped
			if n := r.e.QueueDepth(t, r.e.DLQURL); n != 0 {
				t.Fatalf("%d messages in the DLQ", n)
			}
		})
	}
}

func onetimeName(jobID string, runAt int64) string { return onetime.Name(jobID, ledger.Millis(runAt)) }

// Cancelling a far job whose continuation cannot be ended (its update
// throttled past the retries) leaves the job's schedule: it is the only
// message that names the job, and when it fires the worker ends the
// continuation. Cancel removed the schedule whatever happened, and the
// continuation waited for good.
func TestCancelFarJobKeepsItsScheduleUntilItsContinuationsEnd(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, email{To: "cancel@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	child, err := r.h.Producer().ContinueWith(ctx, res.ID, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: func(b []byte) bool { return bytes.Contains(b, []byte("ended Failed")) },
		Fault: faults.Throttle, Times: faults.Attempts})
	if _, err := r.h.Producer().Cancel(ctx, res.ID, "", 0); err == nil {
		t.Fatal("cancel with its continuation's end throttled past the retries: no error")
	}
	fired(t, h, faults.Attempts)
	if left := r.schedulesFor(t, res.ID); len(left) != 1 {
		t.Fatalf("schedules left %v, want the job's: the only message that names it", left)
	}
	r.clock.Advance(30*24*time.Hour + time.Second)
	r.fire(t)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, child.ID); rec.State != ledger.Failed || rec.Attempt != 0 {
		t.Fatalf("the cancelled job's continuation: %s (attempt %d), want Failed unrun", rec.State, rec.Attempt)
	}
}
