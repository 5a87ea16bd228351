package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestZombieCannotOverwrite: run A's lease runs out while it is still
// working; run B takes the job over and succeeds; when A finally reports
// (a failure), its write is refused and the record keeps B's result.
func TestZombieCannotOverwrite(t *testing.T) {
	t.Parallel()
	aStarted, aRelease := make(chan struct{}), make(chan struct{})
	r := newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Attempt == 1 { // run A
			close(aStarted)
			<-aRelease
			return errors.New("A's late failure")
		}
		return nil // run B
	}, rigConfig{hopts: &handler.Options{Lease: time.Minute}})
	id := r.enqueue(t, email{To: "z@example.com"}, nil)
	msgs := r.e.Messages(t, r.e.QueueURL)
	for end := time.Now().Add(30 * time.Second); len(msgs) == 0 && time.Now().Before(end); {
		msgs = r.e.Messages(t, r.e.QueueURL) // the job's message, once the emulator shows it
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages for the job, want its one", len(msgs))
	}
	ev := poller.Event(r.e.QueueURL, msgs)
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		if _, err := r.h.Handle(context.Background(), ev); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-aStarted:
	case <-aDone:
		// Handle ended without running A (CI beside a soak hung here 18
		// minutes, waiting for A): say how the job stood, not hang.
		t.Fatalf("the first Handle ended without running the job: %+v", r.get(t, id))
	}
	r.clock.Advance(2 * time.Minute) // A's lease is over; SQS redelivers
	if _, err := r.h.Handle(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	b := r.get(t, id)
	expect(t, b, ledger.Succeeded, 2, "")
	close(aRelease)
	<-aDone
	after := r.get(t, id)
	if after.State != ledger.Succeeded || after.Token != b.Token || after.LastError != "" || after.UpdatedAt != b.UpdatedAt {
		t.Fatalf("the zombie overwrote the result: %+v, B left %+v", after, b)
	}
	// The ledger refuses it directly too.
	stale := b
	stale.Token--
	if _, err := r.prod.Store().Finish(context.Background(), stale, ledger.Finish{State: ledger.Failed}); !errors.Is(err, ledger.ErrFenced) {
		t.Fatalf("finish with a stale token: %v", err)
	}
}

// TestInvocationDeadline: a run cut off by the invocation's deadline goes
// back without spending an attempt; with too little time left nothing is
// claimed at all.
func TestInvocationDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(ctx context.Context, j *handler.Job[email]) error {
		if j.Args.To == "slow@example.com" && j.Attempt == 1 {
			<-ctx.Done() // runs until the invocation ends
			return ctx.Err()
		}
		return nil
	}, &handler.Options{StopBefore: time.Second})
	slow := r.enqueue(t, email{To: "slow@example.com"}, nil)
	msgs := r.e.Messages(t, r.e.QueueURL)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	resp, err := r.h.Handle(ctx, poller.Event(r.e.QueueURL, msgs))
	cancel()
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("handle: %+v %v", resp, err)
	}
	rec := r.get(t, slow)
	if rec.State != ledger.Enqueued || rec.Attempt != 0 {
		t.Fatalf("cut-off job is %s with %d attempts spent; want Enqueued, 0", rec.State, rec.Attempt)
	}
}

// TestStopClaimingNearDeadline: one job at a time; the first runs until
// its run's deadline (the finish margin, 2 s, before the invocation's) and
// succeeds, and the second, with less than StopBefore (2.5 s) left, goes
// back unclaimed (no attempt spent). Load only makes less time left.
func TestStopClaimingNearDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(ctx context.Context, j *handler.Job[email]) error {
		if j.Args.To == "sleepy@example.com" {
			<-ctx.Done()
		}
		return nil
	}, &handler.Options{StopBefore: 2500 * time.Millisecond, Concurrency: 1})
	sleepy := r.enqueue(t, email{To: "sleepy@example.com"}, nil)
	other := r.enqueue(t, email{To: "other@example.com"}, nil)
	msgs := r.e.Messages(t, r.e.QueueURL)
	ev := poller.Event(r.e.QueueURL, msgs)
	if strings.Contains(ev.Records[0].Body, other) { // the sleepy job first
		ev.Records[0], ev.Records[1] = ev.Records[1], ev.Records[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 7500*time.Millisecond) // StopBefore is capped at a third
	defer cancel()
	resp, err := r.h.Handle(ctx, ev)
	if err != nil || len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != ev.Records[1].MessageId {
		t.Fatalf("want only the second message back: %+v %v", resp, err)
	}
	expect(t, r.get(t, sleepy), ledger.Succeeded, 1, "")
	if rec := r.get(t, other); rec.State != ledger.Enqueued || rec.Attempt != 0 {
		t.Fatalf("claimed with no time left: %+v", rec)
	}
}

// TestGoneJobMessage: a well-formed message naming a job that does not
// exist is acknowledged and nothing is written.
func TestGoneJobMessage(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	body := `{"v":1,"id":"aaaaaaaaaaaaaaaaaaaaaaaaaa","kind":"email"}`
	ev := poller.Event(r.e.QueueURL, nil)
	ev.Records = append(ev.Records, eventMessage("m-1", body))
	resp, err := r.h.Handle(context.Background(), ev)
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("handle: %+v %v", resp, err)
	}
	if n := len(r.e.Records(t)); n != 0 || r.calls.Load() != 0 {
		t.Fatalf("%d records written, %d runs", n, r.calls.Load())
	}
}

func eventMessage(id, body string) events.SQSMessage {
	return events.SQSMessage{MessageId: id, ReceiptHandle: "rh-" + id, Body: body, EventSource: "aws:sqs"}
}

// TestOrphanOutOfAttempts: the worker of the last attempt died (the record
// stays Processing); when the message comes back after the lease, the job
// is Failed with ErrOrphaned and the hook is told so, without running.
func TestOrphanOutOfAttempts(t *testing.T) {
	t.Parallel()
	var causes []error
	r := newRigWith(t, ok, rigConfig{hook: func(_ context.Context, _ ledger.Record, cause error) error {
		causes = append(causes, cause)
		return nil
	}})
	id := r.enqueue(t, email{To: "o@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if _, err := r.prod.Store().Claim(context.Background(), id, time.Minute); err != nil {
		t.Fatal(err) // a worker claimed it, then died
	}
	r.clock.Advance(2 * time.Minute)
	r.drain(t)
	expect(t, r.get(t, id), ledger.Failed, 1, "orphaned job")
	if r.calls.Load() != 0 || len(causes) != 1 || !errors.Is(causes[0], handler.ErrOrphaned) {
		t.Fatalf("runs %d, hook causes %v", r.calls.Load(), causes)
	}
}
