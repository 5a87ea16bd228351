package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestUnknownKindRetried (scenario 12): a job whose kind has no worker
// here (the producer deployed first) is retried with backoff and, if it
// finally fails, reported to the handler's dead-letter hook.
func TestUnknownKindRetried(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	var cause error
	r := newRigWith(t, ok, rigConfig{hopts: &handler.Options{
		UnknownKindBackoff: func(int) time.Duration { return 0 },
		OnDeadLetter: func(_ context.Context, _ ledger.Record, err error) error {
			hooks.Add(1)
			cause = err
			return nil
		}}})
	id := r.enqueue(t, orphanKind{}, &enqueue.Opts{MaxAttempts: 3})
	r.drain(t)
	expect(t, r.get(t, id), ledger.Failed, 3, "no worker registered")
	if hooks.Load() != 1 || !errors.Is(cause, handler.ErrUnknownKind) {
		t.Fatalf("hook ran %d times with %v; want once with ErrUnknownKind", hooks.Load(), cause)
	}
}

// TestRequeueDeadLetterRecordRefused (scenario 13): the ledger record that
// keeps a message that was not a job cannot be requeued.
func TestRequeueDeadLetterRecordRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m-1", Body: "not json", Attributes: map[string]string{"ApproximateReceiveCount": "5"}}}}
	if resp, err := r.h.HandleDeadLetters(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter not kept: %+v %v", resp, err)
	}
	recs := r.e.Records(t)
	if len(recs) != 1 || recs[0].Kind != handler.DeadLetterKind {
		t.Fatalf("records %+v", recs)
	}
	_, err := r.prod.Requeue(context.Background(), recs[0].ID)
	if !errors.Is(err, ledger.ErrDeadLetterRecord) {
		t.Fatalf("requeue of a dead-letter record: %v; want ledger.ErrDeadLetterRecord", err)
	}
	if rec := r.get(t, recs[0].ID); rec.State != ledger.Failed || rec.LastError != recs[0].LastError {
		t.Fatalf("record changed: %+v", rec)
	}
}

// TestDeadLetterOfJobThatNeverStarted (scenario 15): a job message reaches
// the DLQ although no run of the job ever started (its claims were
// throttled, or every receive came too near the invocation's end). That is
// not a poison job: the consumer sends it back to run, and says so; only
// when that keeps happening does it fail it, with what happened as the
// reason.
func TestDeadLetterOfJobThatNeverStarted(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	var cause error
	r := newRigWith(t, ok, rigConfig{hook: func(_ context.Context, _ ledger.Record, err error) error { hooks.Add(1); cause = err; return nil }})
	id := r.enqueue(t, email{To: "patient@example.com"}, nil)
	msgs := r.receive(t, 1)
	deadLetter := func() {
		t.Helper()
		m := poller.Event(r.e.DLQURL, msgs).Records[0]
		m.Attributes["ApproximateReceiveCount"] = "5"
		resp, err := r.h.HandleDeadLetters(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m}})
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("dead letter: %+v %v", resp, err)
		}
	}
	deadLetter()
	rec := r.get(t, id)
	if rec.State != ledger.Enqueued || rec.Attempt != 0 || !strings.Contains(rec.LastError, "never started") {
		t.Fatalf("after one dead letter: %s attempt %d %q; want Enqueued, sent back, saying why", rec.State, rec.Attempt, rec.LastError)
	}
	if r.e.QueueDepth(t, r.e.QueueURL) != 2 { // the original (in flight here) and the one sent back
		t.Fatalf("the job was not sent back")
	}
	for range handler.DefaultMaxReturns {
		deadLetter()
	}
	rec = r.get(t, id)
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "never started") || strings.Contains(rec.LastError, "crashed") {
		t.Fatalf("after %d dead letters: %s %q", handler.DefaultMaxReturns+1, rec.State, rec.LastError)
	}
	if hooks.Load() != 1 || !errors.Is(cause, handler.ErrNeverStarted) {
		t.Fatalf("hook ran %d times with %v; want once with ErrNeverStarted", hooks.Load(), cause)
	}
}
