package handler_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Review: a forged body naming a waiting job and a queue no worker knows
// ("queue":"nope") is carried forward by the worker under the body's
// queue (a short carry takes msg.Queue from the body, not the record):
// the send fails, the message is never deleted, and the redrive policy
// moves it to the DLQ. There the consumer finds the job Scheduled, "never
// started", and returns it; after MaxReturns forgeries it makes the job
// Failed and runs its hook. A body must not make a job Failed.
func TestReviewForgedQueueFailsJob(t *testing.T) {
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
	e.Purge(t, e.QueueURL)
	forged := enqueue.Message{V: 1, ID: res.ID, Kind: "email", Queue: "nope"}.Encode()
	for i := range 4 {
		m := events.SQSMessage{MessageId: "forged-" + strconv.Itoa(i), ReceiptHandle: "rh", Body: forged,
			Attributes: map[string]string{"ApproximateReceiveCount": "5"}}
		// The worker's receives: each leaves the message (a failure), so
		// the queue's redrive policy moves it to the DLQ.
		out, err := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{m}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.BatchItemFailures) == 0 {
			continue // deleted: it never reaches the DLQ
		}
		if _, err := h.HandleDeadLetters(ctx, poller.Event(e.DLQURL, []sqstypes.Message{{
			MessageId: aws.String(m.MessageId), ReceiptHandle: aws.String("rh"), Body: aws.String(forged),
			Attributes: map[string]string{"ApproximateReceiveCount": "5"},
		}})); err != nil {
			t.Fatal(err)
		}
	}
	rec := e.Get(t, res.ID)
	if rec.State != ledger.Scheduled || hooks != 0 {
		t.Fatalf("after four forged bodies naming an unknown queue: %s (%q), %d returns, %d hook runs; want Scheduled, no hook", rec.State, rec.LastError, rec.Returns, hooks)
	}
}

// Review: a hook slower than its first lease is held by extensions; when
// it returns, the write that clears its mark is retried only until
// rec.HookUntil, the first lease's end (long past), not the lease its
// holder extended: one throttle past the SDK's retries and the mark stays,
// though the holder is alive and its lease runs on. The next delivery of
// the job's message then runs the hook a second time, no kill between.
func TestReviewSlowHookMarkNotRetried(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { return errors.New("down") }),
		&handler.KindOptions{OnDeadLetter: func(_ context.Context, rec ledger.Record, _ error) error {
			if hooks.Add(1) == 1 {
				// A slow hook: it outlasts its first lease (its holder
				// extends it).
				time.Sleep(time.Until(ledger.Millis(rec.HookUntil)) + 500*time.Millisecond)
			}
			return nil
		}})
	ft, cfg := e.Faulty()
	h := e.Handler(t, reg, &handler.Options{Logger: quiet, Lease: 3 * time.Second, DynamoDB: dynamodb.NewFromConfig(cfg)}) // no deadline: the hook's lease is 8 s
	isHookDone := func(b []byte) bool {
		return bytes.Contains(b, []byte("REMOVE")) && bytes.Contains(b, []byte("hookUntil")) && !bytes.Contains(b, []byte(":hookPending"))
	}
	done := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isHookDone, Fault: faults.Throttle, Times: faults.Attempts})
	res, err := e.Client.Enqueue(ctx, email{To: "slow-hook@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	msg := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m", ReceiptHandle: "rh", Body: enqueue.Message{V: 1, ID: res.ID, Kind: "email"}.Encode()}}}
	if _, err := h.Handle(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if done.Fired() != faults.Attempts {
		t.Fatalf("the clear of the mark was throttled %d times, want %d", done.Fired(), faults.Attempts)
	}
	rec := e.Get(t, res.ID)
	// The holder is done; its extended lease ends.
	e.Advance(t, ledger.Millis(rec.HookUntil).Sub(e.Now())+time.Second)
	if _, err := h.Handle(ctx, msg); err != nil { // SQS delivers at least once
		t.Fatal(err)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the hook ran %d times (its mark stayed after one throttled clear: due %v); want once", n, rec.HookPending)
	}
}
