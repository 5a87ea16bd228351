package handler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestHookRunsAfterACrashBeforeIt: found by the soak (seed 1, 200 jobs):
// a worker SIGKILLed after the write that made a job Failed and before its
// dead-letter hook returned left the job Failed with no hook ever run; the
// message's next delivery found it Failed and was deleted. The Failed
// write now marks the hook due (HookPending); the next delivery runs the
// hook and clears the mark, and a later one runs nothing.
func TestHookRunsAfterACrashBeforeIt(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		return errors.New("smtp down")
	}), &handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "crash@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	failThenCrash(t, h.Producer().Store(), res.ID)
	if !e.Get(t, res.ID).HookPending {
		t.Fatal("the Failed write did not mark the hook due")
	}
	e.Drain(t, h) // the job's message, delivered again
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the hook ran %d times after the crash, want once", n)
	}
	if e.Get(t, res.ID).HookPending {
		t.Fatal("the mark is still set after the hook ran")
	}
	// One more delivery of its message.
	if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: res.ID, Kind: "email"}.Encode())}); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	if n := hooks.Load(); n != 1 {
		t.Fatalf("a later delivery ran the hook again: %d runs", n)
	}

	// The normal path: the hook runs once and the mark is gone.
	res2, err := e.Client.Enqueue(ctx, email{To: "fails@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	got := e.Get(t, res2.ID)
	if got.State != ledger.Failed || got.HookPending || hooks.Load() != 2 {
		t.Fatalf("normal failure: %s, mark %v, %d hook runs in all (want Failed, cleared, 2)", got.State, got.HookPending, hooks.Load())
	}
}

// Seed 2 of the short soak: a worker died between the Failed write and
// the hook, and an operator requeued the job before its message came back
// to run the hook; the message then found the job Enqueued and ran it,
// and that failure's hook never ran. The next claim runs it.
func TestHookDueAtARequeueRunsAtTheNextClaim(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	var hookState atomic.Value
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		return nil // the requeued run succeeds
	}), &handler.KindOptions{OnDeadLetter: func(_ context.Context, rec ledger.Record, cause error) error {
		hooks.Add(1)
		hookState.Store(string(rec.State) + ": " + cause.Error())
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "requeued@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	failThenCrash(t, h.Producer().Store(), res.ID)
	// The enqueue's message goes: either message claims the requeued job,
	// and the second would wait out the first run's visibility timeout.
	if _, err := e.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(e.QueueURL)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Requeue(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	if !e.Get(t, res.ID).HookPending {
		t.Fatal("the requeue dropped the due hook's mark")
	}
	e.Drain(t, h)
	got := e.Get(t, res.ID)
	if got.State != ledger.Succeeded || got.HookPending {
		t.Fatalf("after the requeued run: %s, mark %v (want Succeeded, cleared)", got.State, got.HookPending)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the failure before the requeue had its hook run %d times, want once", n)
	}
	if s := hookState.Load(); s != "Failed: smtp down" {
		t.Fatalf("the hook saw %q, want the record as it failed (Failed: smtp down)", s)
	}
}

// failThenCrash does what a worker that dies before the dead-letter hook
// did: claim, then the Failed write, marked for its hook ("smtp down").
func failThenCrash(t *testing.T, st *ledger.Store, id string) {
	t.Helper()
	ctx := context.Background()
	rec, err := st.Claim(ctx, id, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "smtp down", HookPending: true, Nonce: ledger.NewNonce()}); err != nil {
		t.Fatal(err)
	}
}
