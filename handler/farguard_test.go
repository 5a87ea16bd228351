package handler_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// guardOf is the rig's dispatch guard (its requests counted with the
// handler's) and a poller of the table's stream playing its event source.
func (r *farRig) guardOf(t *testing.T) *guard.StreamPoller {
	t.Helper()
	g := guard.New(r.e.SQS, r.e.QueueURL, &guard.Options{Far: r.far, Now: r.clock.Now, Logger: quiet})
	return guard.NewStreamPoller(dynamodb.NewFromConfig(r.e.Cfg), dynamodbstreams.NewFromConfig(r.e.Cfg), r.e.Table, g)
}

// farJobFootprint runs one job 30 days ahead from its enqueue, through
// the dispatch guard's look at its insert, to Succeeded, playing
// Scheduler at the run time and again past the guard's check time, and
// returns the schedules that existed for it, the CreateSchedule requests
// made (the producer's and the guard's) and the schedules that fired.
func farJobFootprint(t *testing.T) (schedules map[string]string, creates, firings int) {
	t.Helper()
	r := newFarRig(t, false)
	sp := r.guardOf(t)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, email{To: "far-guarded@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	schedules = r.schedulesFor(t, res.ID)
	for _, c := range r.counter.Calls() {
		if c == "Scheduler.CreateSchedule" {
			creates++
		}
	}
	r.clock.Advance(30*24*time.Hour + time.Second)
	firings = r.fire(t)
	r.e.Drain(t, r.h)
	r.clock.Advance(enqueue.DefaultRedispatchAfter + time.Hour) // past any check of it
	firings += r.fire(t)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, res.ID); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("the far job: %s attempt %d", rec.State, rec.Attempt)
	}
	return schedules, creates, firings
}

// Issue 27 item 23: a far job with the dispatch guard takes one
// schedule and one firing. The guard's check of a far job was a second
// schedule (njc…, at its run time plus After) that fired a check: two
// schedules and two firings per far job, which the capacity model and
// the README's cost table counted as one (Scheduler's firings, the
// scarcest quota, understated 2×). The guard now makes sure the job's own
// schedule exists instead (one CreateSchedule that meets it).
func TestFarJobTakesOneSchedule(t *testing.T) {
	t.Parallel()
	schedules, creates, firings := farJobFootprint(t)
	if len(schedules) != 1 || firings != 1 {
		t.Fatalf("a far job with its guard: %d schedules %v, %d firings; want 1 and 1 (its own)", len(schedules), schedules, firings)
	}
	if creates != 2 {
		t.Fatalf("%d CreateSchedule requests, want 2 (the producer's, the guard's that meets it)", creates)
	}
}

// diedBeforeSchedule writes a job 30 days ahead as a producer that died
// between its PutItem and its CreateSchedule leaves it: no schedule.
func (r *farRig) diedBeforeSchedule(t *testing.T, key string) ledger.Record {
	t.Helper()
	runAt := r.clock.Now().Add(30 * 24 * time.Hour).UnixMilli()
	rec, _, err := r.h.Producer().Store().Insert(context.Background(), ledger.Record{Kind: "email", Args: `{"To":"died@example.com"}`, State: ledger.Scheduled, RunAt: runAt, MaxAttempts: 3}, key, ledger.AllowAfterFailed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// runsAtItsTime plays Scheduler at the job's run time and drains: the
// job runs once.
func (r *farRig) runsAtItsTime(t *testing.T, rec ledger.Record) {
	t.Helper()
	r.clock.Advance(ledger.Millis(rec.RunAt).Sub(r.clock.Now()) + time.Second)
	if n := r.fire(t); n != 1 {
		t.Fatalf("%d schedules fired at the run time, want 1", n)
	}
	r.e.Drain(t, r.h)
	if got := r.e.Get(t, rec.ID); got.State != ledger.Succeeded || got.Attempt != 1 {
		t.Fatalf("the job: %s attempt %d", got.State, got.Attempt)
	}
}

// The guard's CreateSchedule for a far job whose producer died before
// making it: applied with its reply lost, the SDK's resend meets it,
// which is done (one schedule); throttled past the SDK's retries, the
// guard sends an SQS check instead (TestFarGuardFallsBackToSQS), which
// makes the schedule when it reaches the worker.
func TestFarGuardCheckUnderFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			r := newFarRig(t, true)
			sp := r.guardOf(t)
			ctx := context.Background()
			rec := r.diedBeforeSchedule(t, "died-"+fault.String())
			times := 1
			if fault == faults.Throttle {
				times = faults.Attempts
			}
			h := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: fault, Times: times})
			if err := sp.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			fired(t, h, times)
			if fault == faults.Throttle {
				r.e.WantDepth(t, r.e.QueueURL, 1, "Scheduler refused: the SQS check")
				if s := r.schedulesFor(t, rec.ID); len(s) != 0 {
					t.Fatalf("Scheduler refused: schedules %v; want none", s)
				}
				r.e.Purge(t, r.e.QueueURL) // delayed: sent again as it comes
				check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: rec.RunAt + enqueue.DefaultRedispatchAfter.Milliseconds(), Check: true}
				if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(check.Encode())}); err != nil {
					t.Fatal(err)
				}
				r.e.Drain(t, r.h)
			}
			if got := r.schedulesFor(t, rec.ID); len(got) != 1 || got[onetimeName(rec.ID, rec.RunAt)] != atOf(rec.RunAt) {
				t.Fatalf("the job's schedules: %v, want its own at %s", got, atOf(rec.RunAt))
			}
			r.runsAtItsTime(t, rec)
		})
	}
}

// The worker carrying a far job's check (sent through SQS) makes the
// job's missing schedule: its CreateSchedule's reply lost, the resend
// meets it, done; throttled past the SDK's retries, the check hops
// through SQS (a delayed message, no receive counted, nothing in the
// DLQ) and makes it when it comes again.
func TestFarCheckCarryUnderFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			r := newFarRig(t, true)
			ctx := context.Background()
			rec := r.diedBeforeSchedule(t, "carry-"+fault.String())
			check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: rec.RunAt + (2 * time.Minute).Milliseconds(), Check: true}
			send := func() {
				if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(check.Encode())}); err != nil {
					t.Fatal(err)
				}
			}
			send()
			times := 1
			if fault == faults.Throttle {
				times = faults.Attempts
			}
			h := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: fault, Times: times})
			if n, err := r.poll.Poll(ctx); err != nil || n != 1 {
				t.Fatalf("poll: %d %v", n, err)
			}
			fired(t, h, times)
			if fault == faults.Throttle {
				hop := r.e.Messages(t, r.e.QueueURL) // none visible: the hop is delayed
				if len(hop) != 0 || len(r.schedulesFor(t, rec.ID)) != 0 {
					t.Fatalf("Scheduler refusing: %d visible, schedules %v; want the check hopping (delayed), none", len(hop), r.schedulesFor(t, rec.ID))
				}
				r.e.WantDepth(t, r.e.QueueURL, 1, "Scheduler refusing: the check hopping")
				if n := r.e.QueueDepth(t, r.e.DLQURL); n != 0 {
					t.Fatalf("%d in the DLQ", n)
				}
				r.e.Purge(t, r.e.QueueURL)
				send() // what the hop brings 15 minutes on
				r.e.Drain(t, r.h)
			}
			if got := r.schedulesFor(t, rec.ID); len(got) != 1 || got[onetimeName(rec.ID, rec.RunAt)] != atOf(rec.RunAt) {
				t.Fatalf("the job's schedules: %v, want its own at %s", got, atOf(rec.RunAt))
			}
			r.runsAtItsTime(t, rec)
		})
	}
}

// Issue 27 item 21: Scheduler keeps refusing (its quota, an outage)
// while the guard looks at three far jobs whose producers died before
// their schedules. The guard does not fail the stream batch (which
// Lambda retried for as long as Scheduler refused, holding up the
// checks of every job behind it, then gave up): it asks Scheduler once
// for the batch and sends the three an SQS check each, and the checks,
// reaching the worker once Scheduler is back, make the jobs' schedules.
func TestFarGuardFallsBackToSQS(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	sp := r.guardOf(t)
	ctx := context.Background()
	var recs []ledger.Record
	for i := range 3 {
		recs = append(recs, r.diedBeforeSchedule(t, "refused-"+string(rune('a'+i))))
	}
	h := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: faults.Throttle, Times: faults.Forever})
	if err := sp.Poll(ctx); err != nil {
		t.Fatalf("Scheduler refusing: the guard failed the stream batch: %v", err)
	}
	if n := h.Fired(); n != faults.Attempts {
		t.Fatalf("CreateSchedule asked %d times for the batch, want once (%d attempts)", n, faults.Attempts)
	}
	h.Remove()
	r.e.WantDepth(t, r.e.QueueURL, 3, "SQS checks, one per far job")
	r.e.Purge(t, r.e.QueueURL) // delayed 15 minutes: sent again as they come then
	for _, rec := range recs {
		check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: rec.RunAt + enqueue.DefaultRedispatchAfter.Milliseconds(), Check: true}
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(check.Encode())}); err != nil {
			t.Fatal(err)
		}
	}
	r.e.Drain(t, r.h)
	for _, rec := range recs {
		if got := r.schedulesFor(t, rec.ID); len(got) != 1 || got[onetimeName(rec.ID, rec.RunAt)] != atOf(rec.RunAt) {
			t.Fatalf("job %s's schedules: %v, want its own at %s", rec.ID, got, atOf(rec.RunAt))
		}
	}
}

// The guard's fallback check (Scheduler refusing) is an SQS batch send:
// its reply lost, the SDK's resend sends it twice (two checks of one
// job: the second finds the schedule made and ends); throttled past the
// SDK's retries, the stream batch fails, as any check's send does, and
// its retry (Scheduler back) makes the job's schedule.
func TestFarGuardFallbackSendUnderFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			r := newFarRig(t, true)
			g := guard.New(sqs.NewFromConfig(r.cfg), r.e.QueueURL, &guard.Options{Far: r.far, Now: r.clock.Now, Logger: quiet})
			sp := guard.NewStreamPoller(dynamodb.NewFromConfig(r.e.Cfg), dynamodbstreams.NewFromConfig(r.e.Cfg), r.e.Table, g)
			ctx := context.Background()
			rec := r.diedBeforeSchedule(t, "fallback-"+fault.String())
			refused := r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: faults.Throttle, Times: faults.Attempts})
			times := 1
			if fault == faults.Throttle {
				times = faults.Attempts
			}
			h := r.ft.Add(faults.Rule{Op: "SQS.SendMessageBatch", Fault: fault, Times: times})
			err := sp.Poll(ctx)
			fired(t, refused, faults.Attempts)
			fired(t, h, times)
			if fault == faults.LostReply {
				if err != nil {
					t.Fatal(err)
				}
				r.e.WantDepth(t, r.e.QueueURL, 2, "SQS checks (sent, and resent)")
				r.e.Purge(t, r.e.QueueURL)
				check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: rec.RunAt + enqueue.DefaultRedispatchAfter.Milliseconds(), Check: true}
				for range 2 {
					if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(check.Encode())}); err != nil {
						t.Fatal(err)
					}
				}
				r.e.Drain(t, r.h)
			} else {
				if err == nil {
					t.Fatal("the fallback check's send throttled past the retries, and the batch did not fail")
				}
				if err := sp.Poll(ctx); err != nil { // the stream's retry, Scheduler back
					t.Fatal(err)
				}
			}
			if got := r.schedulesFor(t, rec.ID); len(got) != 1 || got[onetimeName(rec.ID, rec.RunAt)] != atOf(rec.RunAt) {
				t.Fatalf("the job's schedules: %v, want its own at %s", got, atOf(rec.RunAt))
			}
			r.runsAtItsTime(t, rec)
		})
	}
}
