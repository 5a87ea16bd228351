package enqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
)

// Dispatch sends the job's SQS message. A job scheduled more than
// MaxSQSDelay ahead is sent with the longest delay and carried forward by
// the worker until due. Dispatching a job twice is harmless: the worker's
// claim is conditional.
func (c *Client) Dispatch(ctx context.Context, rec ledger.Record) error {
	msg, delay := c.message(rec)
	return c.Send(ctx, msg, delay)
}

// message is the job's SQS message and the delay until it is due.
func (c *Client) message(rec ledger.Record) (Message, time.Duration) {
	msg := Message{V: 1, ID: rec.ID, Kind: rec.Kind, Queue: rec.Queue}
	var delay time.Duration
	if rec.State == ledger.Scheduled && rec.RunAt != 0 {
		msg.RunAt = rec.RunAt
		delay = ledger.Millis(rec.RunAt).Sub(c.store.Now())
	}
	return msg, delay
}

// sendNow sends rec's message due now, with no run time of its own: the
// worker that takes it reads the record and goes by its own clock (a
// caller's clock ahead of the workers' would have the message carried
// forward unread). Wakes, a cancel's follow-ups and a compensation's
// request send so.
func (c *Client) sendNow(ctx context.Context, rec ledger.Record) error {
	msg, _ := c.message(rec)
	msg.RunAt = 0
	return c.Send(ctx, msg, 0)
}

// delaySeconds is an SQS delay: whole seconds rounded up, capped at MaxDelay.
func (c *Client) delaySeconds(delay time.Duration) int32 {
	delay = max(0, min(delay, c.maxDelay))
	return int32((delay + time.Second - 1) / time.Second)
}

// EnsureFar makes sure the far run of rec (Scheduled more than FarAfter
// ahead, ClientOptions.Far set) has its one-time schedule: one
// CreateSchedule of the run's name (onetime.Name), and a create that
// meets it is done. This is the dispatch guard's check of a far job, by
// the guard or by the worker carrying a check: the job's own schedule
// made if its producer never made it, instead of a second schedule that
// fires a check (two schedules and two firings per far job). ok is false
// when the run is not far: the caller's check then hops through SQS.
func (c *Client) EnsureFar(ctx context.Context, rec ledger.Record) (ok bool, err error) {
	msg, delay := c.message(rec)
	if !c.GoesFar(delay) {
		return false, nil
	}
	msg.Queue, _ = c.route(ctx, msg.Queue, msg.ID)
	at := ledger.Millis(msg.RunAt)
	if err := c.far.Ensure(ctx, onetime.Name(msg.ID, at), at, msg.Queue, msg.Encode()); err != nil {
		return true, fmt.Errorf("nexjob: send job %s: %w", msg.ID, err)
	}
	return true, nil
}

// GoesFar reports whether Send of a message delay ahead makes a one-time
// schedule (ClientOptions.Far) rather than an SQS message.
func (c *Client) GoesFar(delay time.Duration) bool { return c.far != nil && delay > c.farAfter }

// route is where a message of the job id for the named queue goes, by
// name and URL: that queue, or the job queue ("") for a name the client's
// Queues do not hold, with a warning. Such a name is a queue taken out of
// NEXJOB_QUEUES while records still named it, or one a newer producer
// knows and this role does not yet: a send must not fail for ever on it
// (its message came back each time, a far carry's until the DLQ
// consumer failed the job as never started, and a continuation was never
// sent). The worker runs a job from the job queue as from any other.
func (c *Client) route(ctx context.Context, queue, id string) (name, url string) {
	url, err := c.QueueURL(queue)
	if err == nil {
		return queue, url
	}
	c.log.WarnContext(ctx, "nexjob: the job's queue is not configured (NEXJOB_QUEUES); sent via the job queue", "job_id", id, "queue", queue)
	return "", c.queueURL
}

// Send sends one job message with a delay: an SQS delay capped at
// MaxDelay, or, with ClientOptions.Far and a delay beyond FarAfter, one
// one-time schedule that sends it at its time, named by the job and the
// run time the message carries (onetime.Name). The worker uses it to
// carry a long schedule forward. A message for a queue the client does
// not know goes to the job queue (see route).
func (c *Client) Send(ctx context.Context, msg Message, delay time.Duration) error {
	var url string
	msg.Queue, url = c.route(ctx, msg.Queue, msg.ID)
	if c.GoesFar(delay) && !msg.Check {
		// Named by the run time the message carries (the job's, from its
		// record), so a resend or a second dispatch of this run finds its
		// own schedule, and no later run's write reuses the name. A check
		// never takes a schedule of its own (see EnsureFar): it hops.
		if msg.RunAt == 0 {
			msg.RunAt = c.store.Now().Add(delay).UnixMilli()
		}
		at := ledger.Millis(msg.RunAt)
		if err := c.far.Schedule(ctx, onetime.Name(msg.ID, at), at, msg.Queue, msg.Encode()); err != nil {
			return fmt.Errorf("nexjob: send job %s: %w", msg.ID, err)
		}
		return nil
	}
	out, err := c.sqs.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:                aws.String(url),
		MessageBody:             aws.String(msg.Encode()),
		DelaySeconds:            c.delaySeconds(delay),
		MessageAttributes:       traceAttributes(ctx),
		MessageSystemAttributes: xrayAttribute(ctx, c.xray),
	})
	if err != nil {
		return fmt.Errorf("nexjob: send job %s: %w", msg.ID, err)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("messaging.message.id", aws.ToString(out.MessageId)))
	}
	return nil
}
