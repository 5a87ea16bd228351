package handler_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// debounced is a producer on the rig's clock whose AWS requests go
// through a fault transport of its own.
func debounced(t *testing.T, r *rig) (*enqueue.Client, *faults.Transport) {
	t.Helper()
	ft, cfg := r.e.Faulty()
	prod, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quiet, Ledger: ledger.Options{Now: r.clock.Now}, MaxDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return prod, ft
}

// pendingJobs maps the args of every Scheduled job to its id.
func pendingJobs(t *testing.T, r *rig) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, rec := range r.e.Records(t) {
		if rec.ID != "" && rec.State == ledger.Scheduled {
			out[rec.Args] = rec.ID
		}
	}
	return out
}

// deliverEach receives n messages and hands each to the handler alone
// (two messages of one job in one batch would meet each other's live
// lease and wait it out), then drains the queue.
func deliverEach(t *testing.T, r *rig, n int) {
	t.Helper()
	for _, m := range r.receive(t, n) {
		r.deliver(t, []sqstypes.Message{m}, 1)
	}
	r.drain(t)
}

// TestDebounceFoldResendsAnUnsentJob (debounce stranded): a debounced
// job whose send failed past the retries (a *DispatchError, the job
// marked unsent) is sent by the next fold into it, the caller's retry or
// the burst's next enqueue, as a keyed enqueue's retry re-sends its
// unsent job: it runs once, with the last args. The fold's re-send
// applied with its reply lost sends it twice (one run all the same);
// throttled past the retries it is that fold's *DispatchError, the job
// still marked, and the next fold sends it.
func TestDebounceFoldResendsAnUnsentJob(t *testing.T) {
	t.Parallel()
	for _, resend := range []faults.Fault{faults.Pass, faults.LostReply, faults.Throttle} {
		t.Run(resend.String(), func(t *testing.T) {
			t.Parallel()
			var seen recipients
			r := newRig(t, seen.work, nil)
			prod, ft := debounced(t, r)
			ctx := context.Background()
			db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "stranded", Period: time.Minute}}
			h := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
			_, err := prod.Enqueue(ctx, email{To: "first@example.com"}, db)
			var de *enqueue.DispatchError
			if !errors.As(err, &de) || h.Fired() != faults.Attempts {
				t.Fatalf("the send throttled past the retries: %v, want a *DispatchError", err)
			}
			id := de.JobID
			if !r.get(t, id).Undispatched {
				t.Fatalf("job %s not marked unsent after its send failed", id)
			}
			r.clock.Advance(30 * time.Second)
			switch resend {
			case faults.LostReply:
				ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.LostReply})
			case faults.Throttle:
				h := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
				res, err := prod.Enqueue(ctx, email{To: "throttled@example.com"}, db)
				if !errors.As(err, &de) || de.JobID != id || res.ID != id || !res.Folded || h.Fired() != faults.Attempts {
					t.Fatalf("a fold whose re-send is throttled past the retries: %+v %v (fired %d), want folded into %s with a *DispatchError", res, err, h.Fired(), id)
				}
				if !r.get(t, id).Undispatched {
					t.Fatalf("the fold's failed re-send cleared the unsent mark of job %s", id)
				}
			}
			res, err := prod.Enqueue(ctx, email{To: "last@example.com"}, db)
			if err != nil || !res.Folded || res.ID != id || !res.Redispatched {
				t.Fatalf("a fold into the unsent job: %+v %v; want folded into %s and re-sent", res, err, id)
			}
			if r.get(t, id).Undispatched {
				t.Fatalf("job %s still marked unsent after the fold sent it", id)
			}
			messages := 1
			if resend == faults.LostReply {
				messages = 2 // the re-send's and the SDK's resend of it
			}
			r.clock.Advance(2 * time.Minute)
			deliverEach(t, r, messages)
			if ran := seen.got(); !slices.Equal(ran, []string{"last@example.com"}) {
				t.Fatalf("runs %v, want one with the last args", ran)
			}
			expect(t, r.get(t, id), ledger.Succeeded, 1, "")
		})
	}
}

// TestDebounceCheckOfAJobMovedLaterComesBack (debounce stranded): the
// producer died between the debounced job's write and its send (no
// message, no unsent mark), and the burst's next enqueue folded into it,
// moving its run from +60 s to +110 s. The dispatch guard's check, due
// at the first run time + After, finds the job not yet due: it is sent
// again, due After past the new run time, instead of vanishing, and runs
// the job once with the last args. The check's re-send applied with its
// reply lost makes two checks (one run); throttled past the retries it
// leaves the check to come back.
func TestDebounceCheckOfAJobMovedLaterComesBack(t *testing.T) {
	t.Parallel()
	for _, rearm := range []faults.Fault{faults.Pass, faults.LostReply, faults.Throttle} {
		t.Run(rearm.String(), func(t *testing.T) {
			t.Parallel()
			var seen recipients
			r := newRigWith(t, seen.work, rigConfig{faults: true})
			dead, ft := debounced(t, r)
			ctx := context.Background()
			db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "died", Period: time.Minute}}
			// The producer dies after the write: its send and its unsent
			// mark never reach AWS.
			ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Forever})
			ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Forever})
			_, err := dead.Enqueue(ctx, email{To: "first@example.com"}, db)
			var de *enqueue.DispatchError
			if !errors.As(err, &de) {
				t.Fatalf("a producer that died after the write: %v, want a *DispatchError", err)
			}
			id := de.JobID
			first := r.get(t, id)
			if first.Undispatched {
				t.Fatal("the job is marked unsent: the producer was to die before that")
			}
			// The guard saw the insert: its check is due at the run time + 10 s.
			g := guard.New(r.e.SQS, r.e.QueueURL, &guard.Options{After: 10 * time.Second, MaxDelay: 1, Now: r.clock.Now, Logger: quiet})
			if err := g.Check(ctx, []guard.Change{{ID: id, Kind: first.Kind, State: first.State, Attempt: first.Attempt, RunAt: first.RunAt}}); err != nil {
				t.Fatal(err)
			}
			r.clock.Advance(50 * time.Second)
			if res, err := r.prod.Enqueue(ctx, email{To: "last@example.com"}, db); err != nil || !res.Folded || res.ID != id {
				t.Fatalf("the burst's next enqueue: %+v %v, want folded into %s", res, err, id)
			}
			check := r.receive(t, 1)
			r.clock.Advance(25 * time.Second) // +75 s: past the check's time, before the new run time
			isCheck := func(b []byte) bool { return bytes.Contains(b, []byte(`check\":true`)) }
			var h faults.Handle
			switch rearm {
			case faults.LostReply:
				h = r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: isCheck, Fault: faults.LostReply})
			case faults.Throttle:
				h = r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: isCheck, Fault: faults.Throttle, Times: faults.Attempts})
				r.deliver(t, check, 1)
				if d := r.e.QueueDepth(t, r.e.QueueURL); d != 1 || h.Fired() != faults.Attempts {
					t.Fatalf("%d messages after the check's re-send was throttled past the retries (fired %d), want the check kept", d, h.Fired())
				}
				if _, err := r.e.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(r.e.QueueURL), ReceiptHandle: check[0].ReceiptHandle, VisibilityTimeout: 0}); err != nil {
					t.Fatal(err)
				}
				check = r.receive(t, 1)
			}
			r.deliver(t, check, 1)
			if d := r.e.QueueDepth(t, r.e.QueueURL); d == 0 {
				t.Fatalf("the guard's check of job %s, not yet due (a fold moved its run from +60 s to +110 s), was dropped: no message names the job any more", id)
			}
			checks := 1
			if rearm == faults.LostReply {
				if checks = 2; h.Fired() != 1 {
					t.Fatalf("the lost reply fired %d times", h.Fired())
				}
			}
			r.clock.Advance(5 * time.Minute)
			deliverEach(t, r, checks)
			if ran := seen.got(); !slices.Equal(ran, []string{"last@example.com"}) {
				t.Fatalf("runs %v, want one with the last args", ran)
			}
			expect(t, r.get(t, id), ledger.Succeeded, 1, "")
		})
	}
}

// TestDebounceOneRunWhenAnEnqueueCutsIntoANewWindow (debounce run
// twice): an enqueue that comes while a new window is being written (here
// during one SDK throttle retry of the write that carries the window's
// job) and another after both make one job, which runs once with the
// last args.
func TestDebounceOneRunWhenAnEnqueueCutsIntoANewWindow(t *testing.T) {
	t.Parallel()
	var seen recipients
	r := newRig(t, seen.work, nil)
	prod, ft := debounced(t, r)
	ctx := context.Background()
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "cut-in", Period: time.Minute}}
	var between enqueue.Result
	var betweenErr error
	cut := func() { between, betweenErr = r.prod.Enqueue(ctx, email{To: "b@example.com"}, db) }
	isA := func(b []byte) bool { return bytes.Contains(b, []byte("a@example.com")) }
	var hs []faults.Handle
	for _, op := range []string{"DynamoDB.PutItem", "DynamoDB.TransactWriteItems"} { // whichever writes the job
		hs = append(hs, ft.Add(faults.Rule{Op: op, Match: isA, Fault: faults.Throttle, After: cut}))
	}
	a, err := prod.Enqueue(ctx, email{To: "a@example.com"}, db)
	if err != nil || betweenErr != nil || hs[0].Fired()+hs[1].Fired() != 1 {
		t.Fatalf("a: %+v %v; b, during a's retry: %+v %v", a, err, between, betweenErr)
	}
	c, err := r.prod.Enqueue(ctx, email{To: "c@example.com"}, db)
	if err != nil || !c.Folded {
		t.Fatalf("c, after both: %+v %v, want folded", c, err)
	}
	if p := pendingJobs(t, r); len(p) != 1 || p[`{"To":"c@example.com"}`] != c.ID {
		t.Fatalf("%d pending jobs for one burst: %v; want one, with the last args (c)", len(p), p)
	}
	r.clock.Advance(2 * time.Minute)
	r.drain(t)
	if ran := seen.got(); !slices.Equal(ran, []string{"c@example.com"}) {
		t.Fatalf("runs %v, want one with the last args", ran)
	}
}

// TestDebounceFoldCarriesTheLastDeadline (debounce lost): a fold moves
// the run later and takes the folding enqueue's Deadline, so a job whose
// last enqueue's deadline is after its run runs. The fold's reply lost:
// the deadline is carried all the same; a fold throttled past the
// retries is an error and changes nothing, and the caller's retry
// carries it.
func TestDebounceFoldCarriesTheLastDeadline(t *testing.T) {
	t.Parallel()
	var seen recipients
	r := newRig(t, seen.work, nil)
	prod, ft := debounced(t, r)
	ctx := context.Background()
	t0 := r.clock.Now()
	opts := func(deadline time.Duration) *enqueue.Opts {
		return &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "deadline", Period: time.Minute}, Deadline: t0.Add(deadline)}
	}
	first, err := prod.Enqueue(ctx, email{To: "first@example.com"}, opts(90*time.Second)) // runs at +60 s
	if err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(50 * time.Second)
	lost := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	if res, err := prod.Enqueue(ctx, email{To: "second@example.com"}, opts(3*time.Minute)); err != nil || !res.Folded || lost.Fired() != 1 {
		t.Fatalf("a fold with its reply lost: %+v %v (fired %d)", res, err, lost.Fired())
	}
	at := func(ms int64) time.Duration { return ledger.Millis(ms).Sub(t0).Round(time.Second) }
	if rec := r.get(t, first.ID); rec.Deadline != t0.Add(3*time.Minute).UnixMilli() {
		t.Fatalf("after a fold the job runs at +%s with the deadline +%s; want the folding enqueue's deadline, +3m0s", at(rec.RunAt), at(rec.Deadline))
	}
	r.clock.Advance(10 * time.Second)
	h := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts})
	if res, err := prod.Enqueue(ctx, email{To: "last@example.com"}, opts(4*time.Minute)); err == nil || h.Fired() != faults.Attempts {
		t.Fatalf("a fold throttled past the retries: %+v %v, want an error", res, err)
	}
	h.Remove()
	if rec := r.get(t, first.ID); rec.Args != `{"To":"second@example.com"}` || rec.Deadline != t0.Add(3*time.Minute).UnixMilli() {
		t.Fatalf("a throttled fold changed the job: args %s, deadline +%s", rec.Args, at(rec.Deadline))
	}
	before := r.clock.Now()
	if res, err := prod.Enqueue(ctx, email{To: "last@example.com"}, opts(4*time.Minute)); err != nil || !res.Folded {
		t.Fatalf("the caller's retry: %+v %v", res, err)
	}
	after := r.clock.Now()
	// The fold moves the run to a Period after itself: between a Period
	// after the call began and one after it returned (+2m0s when the
	// machine is quick; a loaded one read +2m1s).
	if rec := r.get(t, first.ID); rec.Deadline != t0.Add(4*time.Minute).UnixMilli() ||
		ledger.Millis(rec.RunAt).Before(before.Add(time.Minute).Truncate(time.Millisecond)) || ledger.Millis(rec.RunAt).After(after.Add(time.Minute)) {
		t.Fatalf("after the retry: run +%s, deadline +%s; want a Period after the fold (+%s to +%s) and +4m0s",
			at(rec.RunAt), at(rec.Deadline), before.Add(time.Minute).Sub(t0), after.Add(time.Minute).Sub(t0))
	}
	r.clock.Advance(70 * time.Second) // +130 s: past the run, before the deadline
	r.drain(t)
	if ran := seen.got(); !slices.Equal(ran, []string{"last@example.com"}) {
		t.Fatalf("runs %v, want one with the last args", ran)
	}
	expect(t, r.get(t, first.ID), ledger.Succeeded, 1, "")
}

// TestDebounceRefusesADeadlineBeforeItsRun (debounce lost): an enqueue
// whose Deadline comes before its debounced run time would always
// expire: it is an *InputError on Deadline and writes nothing, for a
// new window (Deadline < Period) and for a fold (the pending job keeps
// its args, run time and deadline).
func TestDebounceRefusesADeadlineBeforeItsRun(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ctx := context.Background()
	t0 := r.clock.Now()
	opts := func(deadline time.Duration) *enqueue.Opts {
		return &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "refused", Period: time.Minute, MaxWait: 10 * time.Minute}, Deadline: t0.Add(deadline)}
	}
	var in *enqueue.InputError
	res, err := r.prod.Enqueue(ctx, email{To: "early@example.com"}, opts(30*time.Second))
	if !errors.As(err, &in) || in.Field != "Deadline" {
		t.Fatalf("a new window whose Deadline (+30 s) is before its run (+60 s): %+v %v, want an *InputError on Deadline", res, err)
	}
	if n := len(r.e.Records(t)); n != 0 {
		t.Fatalf("%d items written by a refused enqueue", n)
	}
	first, err := r.prod.Enqueue(ctx, email{To: "first@example.com"}, opts(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	before := r.get(t, first.ID)
	r.clock.Advance(30 * time.Second)
	res, err = r.prod.Enqueue(ctx, email{To: "late@example.com"}, opts(80*time.Second)) // the fold would run it at +90 s
	if !errors.As(err, &in) || in.Field != "Deadline" {
		t.Fatalf("a fold whose Deadline (+80 s) is before its run (+90 s): %+v %v, want an *InputError on Deadline", res, err)
	}
	if got := r.get(t, first.ID); got.Args != before.Args || got.RunAt != before.RunAt || got.Deadline != before.Deadline || got.UpdatedAt != before.UpdatedAt {
		t.Fatalf("a refused fold wrote: %+v, was %+v", got, before)
	}
	if n := len(pendingJobs(t, r)); n != 1 {
		t.Fatalf("%d pending jobs, want 1", n)
	}
}
