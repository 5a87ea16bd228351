package handler_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestHookMarkNotClearedKeepsTheMessage: the write that clears a
// dead-letter hook's mark fails past its retries (here refused). The
// hook ran; its message is kept, and its next delivery, once the
// worker's hold on the hook ends, runs the hook again and clears the
// mark (at least once). The message used to be deleted, and the job
// stayed Failed with its hook due and nothing to retry it (the soak at
// seed 20261206).
func TestHookMarkNotClearedKeepsTheMessage(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	r := newRigWith(t, func(context.Context, *handler.Job[email]) error {
		return handler.Permanent(errors.New("mailbox gone"))
	}, rigConfig{faults: true, queue: fastQueue, hook: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Reject, Reply: `{"__type":"com.amazonaws.dynamodb.v20120810#ValidationException","message":"injected"}`,
		Match: func(b []byte) bool {
			return bytes.Contains(b, []byte("attribute_exists")) && bytes.Contains(b, []byte(ledger.AttrHookPending))
		}})
	id := r.enqueue(t, email{To: "gone@example.com"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := r.receive(t, 1)
	r.deliverCtx(ctx, t, msgs, 1)
	if got := r.get(t, id); got.State != ledger.Failed || !got.HookPending || hooks.Load() != 1 {
		t.Fatalf("after the failing run: %s, mark %v, %d hook runs; want Failed, the mark left, 1", got.State, got.HookPending, hooks.Load())
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n != 1 {
		t.Fatalf("the hook's mark left with %d messages in the queue; want its message kept to clear it", n)
	}
	r.clock.Advance(time.Minute) // the worker's hold on the hook has ended
	if _, err := r.e.SQS.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(r.e.QueueURL), ReceiptHandle: msgs[0].ReceiptHandle, VisibilityTimeout: 0}); err != nil {
		t.Fatal(err) // its visibility timeout has run out
	}
	r.deliver(t, r.receive(t, 1), 1)
	if got := r.get(t, id); got.State != ledger.Failed || got.HookPending || hooks.Load() != 2 {
		t.Fatalf("after the message came back: %s, mark %v, %d hook runs; want Failed, cleared, 2 (at least once)", got.State, got.HookPending, hooks.Load())
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n != 0 {
		t.Fatalf("%d messages left after the mark was cleared, want 0", n)
	}
}
