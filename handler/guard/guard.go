// Package guard closes the gap between the ledger write and the SQS send.
//
// An enqueue writes the job, then sends its message. If the producer dies
// between the two, or the send fails and the caller never retries, the job
// exists but no message names it. The guard reads the ledger table's
// DynamoDB stream: for every job that becomes Enqueued or Scheduled with no
// attempt spent (a new job, a requeue, a released continuation) it sends one
// delayed check message, due After past the job's run time. When the check
// arrives, the worker reads the job (one eventually consistent read) and,
// if it was never started, runs it; if its run moved later meanwhile (a
// debounce fold) and it is not yet due, the check goes back, due After
// past the new run time (the worker's handler.Options.GuardAfter), since
// it may be all that names the job; otherwise it drops the check.
//
// A far job (Options.Far, its run more than FarAfter ahead) gets no check
// message: the guard makes sure of the job's own one-time schedule
// instead (one CreateSchedule of its run's name, onetime.Name; a create
// that meets it is done, and one that does not makes it, with the job's
// message). A producer that died between its PutItem and its
// CreateSchedule is covered, and a far job takes one schedule and one
// firing, not a second schedule that fires a check.
//
// # Cost and latency
//
// Per job whose claim is not in the same stream batch as its insert: no
// DynamoDB write; one check message sent in batches of ten (0.1 SQS
// request), received and deleted by the worker queue's event source (its
// share of a receive and a delete request), a share of a worker
// invocation, and half a read unit: about $0.20 per million jobs at
// list prices, +9% over the job itself (see the README's cost section).
// A job claimed within the same stream batch (the construct batches up to
// 10 s) costs nothing of that: its claim passes the stream filter and the
// guard sends no check. Stream reads by Lambda are free, and the filter
// keeps other changes from invoking it. A far job costs one
// CreateSchedule (against its quota, 5,000/s in us-east-1) and no
// message. A lost job runs about After
// (default 2 min) past its run time, a far one at its run time. A caller
// that retries its key re-sends at once (see enqueue).
//
// # How it fails
//
// A send error fails the whole stream batch, which Lambda retries (checks
// are idempotent: a second check of a started job is dropped). Scheduler
// refusing a far job's schedule (past the SDK's retries: its quota, an
// outage) does not: that job, and the batch's far jobs after it (without
// asking Scheduler again), get an SQS check, which the worker carries in
// hops of 15 minutes and which makes the job's schedule once Scheduler
// takes it. Records that are not jobs, or not in a state that needs a
// check, are skipped.
package guard

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
)

// SQS is the part of *sqs.Client the guard uses.
type SQS interface {
	SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// Options tune a Guard. The zero value takes every default.
type Options struct {
	// After is how long past its run time a job may wait for its own
	// message before the check runs it. Defaults to
	// enqueue.DefaultRedispatchAfter.
	After time.Duration
	// MaxDelay caps one SQS delay (tests shorten it). Defaults to
	// enqueue.MaxSQSDelay.
	MaxDelay time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Far, when set, checks a job whose run is more than FarAfter ahead
	// by making sure its own one-time schedule exists (package onetime:
	// one CreateSchedule of the run's name, onetime.Name; a create that
	// meets it is done), instead of sending a check: a far job takes one
	// schedule and one firing, and no check hops. Defaults to none: the
	// check's message is carried forward by the worker, which does the
	// same once the check reaches it.
	Far enqueue.FarScheduler
	// FarAfter is the producers' enqueue.ClientOptions.FarAfter: a run
	// further ahead waits in a one-time schedule. Defaults to
	// enqueue.MaxSQSDelay, as there; less than enqueue.MinFarAfter (which
	// producers refuse) is taken as that.
	FarAfter time.Duration
	// Queues are the named queues (name → URL, enqueue's
	// ClientOptions.Queues): a job's check goes to the job's queue. A
	// check for a queue not named here goes to the job queue, where the
	// worker runs it all the same, and so does a far job's schedule.
	// Defaults to none.
	Queues map[string]string
}

// Guard sends check messages for jobs the stream shows becoming runnable.
type Guard struct {
	sqs      SQS
	queueURL string
	o        Options
}

// New returns a Guard sending to the job queue.
func New(client SQS, queueURL string, opts *Options) *Guard {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.After <= 0 {
		o.After = enqueue.DefaultRedispatchAfter
	}
	if o.MaxDelay <= 0 || o.MaxDelay > enqueue.MaxSQSDelay {
		o.MaxDelay = enqueue.MaxSQSDelay
	}
	if o.FarAfter <= 0 {
		o.FarAfter = enqueue.MaxSQSDelay
	}
	o.FarAfter = max(o.FarAfter, enqueue.MinFarAfter)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Guard{sqs: client, queueURL: queueURL, o: o}
}

// Change is what the guard needs of one stream record.
type Change struct {
	ID       string
	Kind     string
	State    ledger.State
	OldState ledger.State // "" for an insert
	Attempt  int
	RunAt    int64  // Unix ms, for Scheduled
	Queue    string // the job's named queue, "" for the job queue
	// OldID is the old image's job id ("" for an insert): a key's record
	// put over by a new job names another job.
	OldID string
	// ListErr is the job's last error, cut to ledger.MaxListError.
	ListErr string
	// UpdatedAt is the change's time (Unix ms), by the writer's clock.
	UpdatedAt int64
	// MaxAttempts is the job's attempt budget.
	MaxAttempts int
	// Nonce is the change's write's own nonce (every write of a job
	// stamps a fresh one).
	Nonce string
}

// Ended reports whether the change is a job's end: the same job, from an
// active state to a terminal one, whatever its kind (a team's kind named
// like the DLQ consumer's records ended unpublished: those records are
// inserted Failed and never change state). Not a record inserted terminal (a
// replaced key holder's archive, a kept dead letter), nor a change
// between terminal states (a hook's mark cleared), nor a new job put over
// an ended one.
func (c Change) Ended() bool {
	return c.ID != "" && c.OldID == c.ID && c.State.Terminal() &&
		c.OldState != "" && !c.OldState.Terminal()
}

// needsCheck: the job just became runnable with no attempt spent. Not
// when a worker gave the attempt back (a cut-off's first attempt, a run
// deferred by flow control): that worker re-sends the job's message
// before it deletes the one it holds, so a failed send leaves that one
// to come back.
func (c Change) needsCheck() bool {
	return c.ID != "" && c.Attempt == 0 && c.State != c.OldState && c.OldState != ledger.Processing &&
		(c.State == ledger.Enqueued || c.State == ledger.Scheduled)
}

// HandleStream is the Lambda handler for the table's stream.
func (g *Guard) HandleStream(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	var changes []Change
	for _, r := range ev.Records {
		if r.EventName != "INSERT" && r.EventName != "MODIFY" {
			continue
		}
		changes = append(changes, ChangeFromImages(r.Change.NewImage, r.Change.OldImage))
	}
	return events.DynamoDBEventResponse{}, g.Check(ctx, changes)
}

// Check sends a check message for every change that needs one.
func (g *Guard) Check(ctx context.Context, changes []Change) error {
	now := g.o.Now()
	// A batch of checks per queue URL: a batch request names one queue.
	var urls []string
	batches := map[string][]sqstypes.SendMessageBatchRequestEntry{}
	flush := func(url string) error {
		batch := batches[url]
		if len(batch) == 0 {
			return nil
		}
		out, err := g.sqs.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: batch})
		batches[url] = batch[:0]
		if err != nil {
			return fmt.Errorf("nexjob guard: send checks: %w", err)
		}
		if len(out.Failed) > 0 {
			return fmt.Errorf("nexjob guard: %d checks not sent: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		return nil
	}
	// A job claimed later in the same stream batch has been started: it
	// needs no check (the construct's stream filter lets claims through
	// and batches a few seconds of changes, so most checks end here).
	claimedLater := make([]bool, len(changes))
	claimed := map[string]bool{}
	for i := len(changes) - 1; i >= 0; i-- {
		c := changes[i]
		claimedLater[i] = claimed[c.ID]
		if c.State == ledger.Processing {
			claimed[c.ID] = true
		}
	}
	refused := false // Scheduler refused this batch once: the rest go by SQS
	for i, c := range changes {
		if !c.needsCheck() || claimedLater[i] {
			continue
		}
		url, named := g.o.Queues[c.Queue]
		if !named {
			// Not a queue of this deployment (taken out of NEXJOB_QUEUES
			// while the job named it): the job queue, for the schedule as
			// for the check. Far's client refused the name, which read
			// as Scheduler refusing the whole batch's far jobs.
			url, c.Queue = g.queueURL, ""
		}
		if runAt := ledger.Millis(c.RunAt); g.o.Far != nil && !refused && runAt.Sub(now) > g.o.FarAfter {
			// A far job: its own schedule, made if its producer never
			// made it (a retried batch meets it: done).
			job := enqueue.Message{V: 1, ID: c.ID, Kind: c.Kind, RunAt: c.RunAt, Queue: c.Queue}
			err := g.o.Far.Ensure(ctx, onetime.Name(c.ID, runAt), runAt, c.Queue, job.Encode())
			if err == nil {
				continue
			}
			// Scheduler refuses (its quota, an outage): an SQS check
			// instead, which the worker carries and which makes the
			// schedule once Scheduler takes it. Failing the batch held
			// up every check behind it for as long as Scheduler refused.
			refused = true
			g.o.Logger.WarnContext(ctx, "nexjob guard: Scheduler refused a far job's schedule; this batch's far jobs get SQS checks", "job_id", c.ID, "err", err)
		}
		due := max(now.UnixMilli(), c.RunAt)
		checkAt := ledger.Millis(due).Add(g.o.After)
		msg := enqueue.Message{V: 1, ID: c.ID, Kind: c.Kind, RunAt: checkAt.UnixMilli(), Check: true, Queue: c.Queue}
		delay := min(checkAt.Sub(now), g.o.MaxDelay)
		if _, seen := batches[url]; !seen {
			urls = append(urls, url)
		}
		batches[url] = append(batches[url], sqstypes.SendMessageBatchRequestEntry{
			Id:           aws.String(strconv.Itoa(len(batches[url]))),
			MessageBody:  aws.String(msg.Encode()),
			DelaySeconds: int32((delay + time.Second - 1) / time.Second),
		})
		if len(batches[url]) == 10 {
			if err := flush(url); err != nil {
				return err
			}
		}
	}
	for _, url := range urls {
		if err := flush(url); err != nil {
			return err
		}
	}
	return nil
}

// ChangeFromImages reads a Lambda stream record's images. Attributes of
// an unexpected type are ignored, never a panic: the stream is input.
func ChangeFromImages(newImg, oldImg map[string]events.DynamoDBAttributeValue) Change {
	get := func(img map[string]events.DynamoDBAttributeValue) attrs {
		return func(k string, number bool) (string, bool) {
			v, ok := img[k]
			switch {
			case !ok:
				return "", false
			case number && v.DataType() == events.DataTypeNumber:
				return v.Number(), true
			case !number && v.DataType() == events.DataTypeString:
				return v.String(), true
			}
			return "", false
		}
	}
	return changeFrom(get(newImg), get(oldImg))
}

// attrs reads a string (or, with number, a number's text) attribute of one
// image, whatever client library decoded it.
type attrs func(name string, number bool) (string, bool)

func changeFrom(newImg, oldImg attrs) Change {
	str := func(img attrs, k string) string { v, _ := img(k, false); return v }
	num := func(k string) int64 {
		if v, ok := newImg(k, true); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
		return -1
	}
	return Change{
		ID: str(newImg, ledger.AttrID), Kind: str(newImg, ledger.AttrKind),
		State: ledger.State(str(newImg, ledger.AttrState)), OldState: ledger.State(str(oldImg, ledger.AttrState)),
		Attempt: int(num(ledger.AttrAttempt)), RunAt: max(num(ledger.AttrRunAt), 0),
		Queue: str(newImg, ledger.AttrQueue), OldID: str(oldImg, ledger.AttrID), ListErr: str(newImg, ledger.AttrListErr),
		UpdatedAt: max(num(ledger.AttrUpdatedAt), 0), MaxAttempts: int(max(num(ledger.AttrMaxAttempts), 0)),
		Nonce: str(newImg, ledger.AttrNonce),
	}
}
