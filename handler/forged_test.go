package handler_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
)

// Issue 27 item 26: anyone who can send to the job queue can write a
// body. The worker and the DLQ consumer decide from the ledger: four
// bodies naming a waiting job with a run time past the longest schedule
// (which went to the DLQ as "not a job", and after MaxReturns made the job
// Failed, "never started", running its dead-letter hook) leave the job
// Scheduled, its hook unrun, the DLQ empty.
func TestForgedFarBodiesMoveNoJob(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	hooks := 0
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { return nil }),
		&handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error { hooks++; return nil }})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet, MaxReturns: 3})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, email{To: "waiting@example.com"}, &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL) // the job's own hops: only the forgeries are left
	forged := enqueue.Message{V: 1, ID: res.ID, Kind: "email", RunAt: e.Now().Add(enqueue.MaxScheduleAhead + 48*time.Hour).UnixMilli()}.Encode()
	for range 4 {
		if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String(forged)}); err != nil {
			t.Fatal(err)
		}
	}
	for handled := 0; handled < 4; {
		n, err := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1}).Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		handled += n
	}
	for _, m := range e.Messages(t, e.DLQURL) { // what a worker moved to the DLQ, to its consumer
		if _, err := h.HandleDeadLetters(ctx, poller.Event(e.DLQURL, []sqstypes.Message{m})); err != nil {
			t.Fatal(err)
		}
	}
	rec := e.Get(t, res.ID)
	if rec.State != ledger.Scheduled || rec.Returns != 0 || hooks != 0 {
		t.Fatalf("after four forged bodies: %s, %d returns, %d hook runs; want Scheduled, 0, 0", rec.State, rec.Returns, hooks)
	}
}

// Issue 27 item 26: two forged bodies naming a far job (one a guard's
// check) with a time 360 days on do not move its one-time schedules: a
// far carry goes to the job's run time as its record has it.
func TestForgedBodiesMoveNoFarSchedule(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, false)
	ctx := context.Background()
	res, err := r.h.Producer().Enqueue(ctx, email{To: "far@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := r.e.Get(t, res.ID).RunAt
	later := r.clock.Now().Add(360 * 24 * time.Hour).UnixMilli()
	for _, check := range []bool{false, true} {
		body := enqueue.Message{V: 1, ID: res.ID, Kind: "email", RunAt: later, Check: check}.Encode()
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for handled := 0; handled < 2; {
		n, err := r.poll.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		handled += n
	}
	got := r.schedulesFor(t, res.ID)
	if len(got) == 0 {
		t.Fatal("no schedule for the job")
	}
	for name, expr := range got {
		at, err := time.Parse("at(2006-01-02T15:04:05)", expr)
		if err != nil {
			t.Fatal(err)
		}
		if d := at.Add(onetime.Lead).Sub(ledger.Millis(want)); d < -time.Second || d > time.Hour+time.Second { // a schedule fires onetime.Lead before its run
			t.Fatalf("schedule %s at %s, %s from the job's run time %s: moved by a forged body", name, at, d, ledger.Millis(want))
		}
	}
}

// Issue 27 item 26: a body naming a job under another kind (whose
// Timeout chose the claim's lease) does not run it under that lease: the
// claim is given back with no attempt spent, and the job's own message
// runs it.
func TestForgedKindRunsNothingUnderItsLease(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	runs := 0
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { runs++; return nil }), nil)
	handler.AddWorker(reg, handler.WorkFunc[paced](func(context.Context, *handler.Job[paced]) error { return nil }), &handler.KindOptions{Timeout: time.Hour})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, email{To: "x@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL)
	forged := enqueue.Message{V: 1, ID: res.ID, Kind: "paced"}.Encode()
	ev := poller.Event(e.QueueURL, []sqstypes.Message{{MessageId: aws.String("f"), ReceiptHandle: aws.String("rh"), Body: aws.String(forged)}})
	if _, err := h.Handle(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, res.ID); runs != 0 || rec.Attempt != 0 || rec.State != ledger.Scheduled {
		t.Fatalf("after a forged kind: %d runs, %s attempt %d; want none, given back (Scheduled, attempt 0)", runs, rec.State, rec.Attempt)
	}
	e.Drain(t, h)
	if rec := e.RequireState(t, res.ID, ledger.Succeeded); runs != 1 || rec.Attempt != 1 {
		t.Fatalf("then: %d runs, attempt %d; want 1, 1", runs, rec.Attempt)
	}
}
