package handler_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
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
