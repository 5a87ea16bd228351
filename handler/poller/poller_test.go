package poller_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// TestLateInvocationDeletesNothing: an invocation that returns after its
// function timeout (a process stalled by the machine's load) deletes
// nothing, as Lambda, which ends it at its timeout, would not. Its
// messages' visibility may have run out meanwhile and another consumer
// may hold them now: SQS (and the emulator) deletes a message by any
// receipt handle it was given, so the late delete removed the other
// consumer's delivery, and a job whose only message that was waited for
// ever (the soak, seed 20261206).
func TestLateInvocationDeletesNothing(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String("a job's only message")}); err != nil {
		t.Fatal(err)
	}
	var second string // the receipt handle of the other consumer's delivery
	p := poller.New(e.SQS, e.QueueURL, func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		// The message's visibility runs out while this invocation stalls,
		// and another consumer receives it.
		if _, err := e.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(e.QueueURL), ReceiptHandle: aws.String(ev.Records[0].ReceiptHandle), VisibilityTimeout: 0}); err != nil {
			t.Error(err)
		}
		for second == "" && ctx.Err() == nil {
			out, err := e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(e.QueueURL), WaitTimeSeconds: 1})
			if err != nil {
				t.Error(err)
				break
			}
			if len(out.Messages) > 0 {
				second = aws.ToString(out.Messages[0].ReceiptHandle)
			}
		}
		<-ctx.Done() // the invocation outruns its function timeout
		return events.SQSEventResponse{}, nil
	}, &poller.Options{FunctionTimeout: 3 * time.Second, WaitTime: time.Second})
	for n := 0; n == 0; {
		var err error
		if n, err = p.Poll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if second == "" {
		t.Fatal("the other consumer never received the message")
	}
	// The other consumer's delivery is still there: it gives it back.
	if _, err := e.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(e.QueueURL), ReceiptHandle: aws.String(second), VisibilityTimeout: 0}); err != nil {
		t.Errorf("the other consumer's delivery after the late invocation returned: %v", err)
	}
	if n := e.QueueDepth(t, e.QueueURL); n != 1 {
		t.Errorf("after an invocation that outran its timeout reported success: %d messages in the queue, want 1 (the other consumer's delivery)", n)
	}
}
