// Package poller plays the part of Lambda's SQS event source mapping, for
// local use only (make run, tests, a laptop against LocalStack or the
// default emulator). On AWS the event source mapping does this job; do not
// run a poller against a queue that a Lambda function also consumes.
//
// It long-polls the queue, hands each batch to the same handler function
// the Lambda runs, with a context whose deadline is the function timeout,
// deletes the messages the handler did not report as failures, and leaves
// the rest to the visibility timeout, as Lambda does. A handler that
// returns after the function timeout (Lambda would have ended it) deletes
// nothing: the whole batch comes back.
//
// # Failure
//
// A receive or delete error is logged and retried after a pause; a message
// not deleted comes back after its visibility timeout, so nothing is lost.
// Run stops when its context is done and returns nil.
package poller

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// SQS is the part of *sqs.Client the poller uses.
type SQS interface {
	ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
}

// HandlerFunc is the Lambda handler's signature.
type HandlerFunc func(context.Context, events.SQSEvent) (events.SQSEventResponse, error)

// Options tune a Poller. The zero value takes every default.
type Options struct {
	// BatchSize is the most messages per batch, 1 to 10. Defaults to 10.
	BatchSize int32
	// FunctionTimeout is the deadline given to each batch, as Lambda's
	// function timeout. Defaults to 30 s.
	FunctionTimeout time.Duration
	// WaitTime is the long-poll wait; negative means none. Defaults to 1 s.
	WaitTime time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Poller feeds one queue to one handler.
type Poller struct {
	sqs      SQS
	queueURL string
	handle   HandlerFunc
	o        Options
}

// New returns a Poller.
func New(client SQS, queueURL string, handle HandlerFunc, opts *Options) *Poller {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BatchSize <= 0 || o.BatchSize > 10 {
		o.BatchSize = 10
	}
	if o.FunctionTimeout <= 0 {
		o.FunctionTimeout = 30 * time.Second
	}
	switch {
	case o.WaitTime == 0:
		o.WaitTime = time.Second
	case o.WaitTime < 0:
		o.WaitTime = 0
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Poller{sqs: client, queueURL: queueURL, handle: handle, o: o}
}

// Run polls until ctx is done.
func (p *Poller) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if _, err := p.Poll(ctx); err != nil && ctx.Err() == nil {
			p.o.Logger.WarnContext(ctx, "nexjob poller: poll failed", "err", err)
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// Poll receives one batch, handles it and deletes what succeeded. It
// returns the number of messages received.
func (p *Poller) Poll(ctx context.Context) (int, error) {
	out, err := p.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(p.queueURL),
		MaxNumberOfMessages:         p.o.BatchSize,
		WaitTimeSeconds:             int32(p.o.WaitTime / time.Second),
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		MessageAttributeNames:       []string{"All"},
	})
	if err != nil || len(out.Messages) == 0 {
		return 0, err
	}
	ev := Event(p.queueURL, out.Messages)
	// Like Lambda, the invocation runs to its own deadline even if the
	// poller is asked to stop: cancelling mid-batch is a crash, not a stop.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.o.FunctionTimeout)
	resp, err := p.handle(bctx, ev)
	late := bctx.Err() != nil
	cancel()
	if late {
		// Lambda would have ended the invocation at its timeout and
		// deleted nothing. Past it, the messages' visibility may have run
		// out and another consumer hold them now: SQS deletes a message by
		// any receipt handle it gave, so deleting here would remove that
		// consumer's delivery (a job whose only message it was waited for
		// ever: the soak, seed 20261206, its processes stalled by the
		// machine's load). The whole batch comes back, and the ledger
		// tells its next delivery what is left to do.
		p.o.Logger.WarnContext(ctx, "nexjob poller: invocation returned after its function timeout; its messages come back", "messages", len(out.Messages), "timeout", p.o.FunctionTimeout)
		return len(out.Messages), nil
	}
	if err != nil {
		return len(out.Messages), err // the whole batch comes back, as with Lambda
	}
	failed := map[string]bool{}
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	var del []sqstypes.DeleteMessageBatchRequestEntry
	for i, m := range out.Messages {
		if !failed[aws.ToString(m.MessageId)] {
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
	}
	if len(del) > 0 {
		_, err = p.sqs.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(p.queueURL), Entries: del})
	}
	return len(out.Messages), err
}

// Event converts received messages to the event Lambda would deliver.
func Event(queueURL string, msgs []sqstypes.Message) events.SQSEvent {
	var ev events.SQSEvent
	for _, m := range msgs {
		attrs := map[string]string{}
		for k, v := range m.Attributes {
			attrs[k] = v
		}
		mattrs := map[string]events.SQSMessageAttribute{}
		for k, v := range m.MessageAttributes {
			mattrs[k] = events.SQSMessageAttribute{StringValue: v.StringValue, DataType: aws.ToString(v.DataType)}
		}
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId:         aws.ToString(m.MessageId),
			ReceiptHandle:     aws.ToString(m.ReceiptHandle),
			Body:              aws.ToString(m.Body),
			Attributes:        attrs,
			MessageAttributes: mattrs,
			EventSource:       "aws:sqs",
			EventSourceARN:    queueURL,
		})
	}
	return ev
}
