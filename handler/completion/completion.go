// Package completion publishes each job's end to an EventBridge bus, so
// other services react to "payment job Succeeded" without polling.
//
// It reads the ledger table's DynamoDB stream (on AWS a second event
// source mapping of the stream, beside the dispatch guard's; locally
// guard.StreamPoller.Also): every change that takes a job from an active
// state to Succeeded, Failed or Expired becomes one event, source Source,
// detail-type DetailType, detail an Event. Nothing runs on the worker's
// path: the run's end is the one write it always was, and the stream's
// reads are free.
//
// An Event names the job (id, kind, state, attempt of max, named queue,
// the end's time) and carries its last error cut to
// ledger.MaxListError characters, as the listings show it. Never its
// args, its result or its idempotency key: those are the caller's data,
// and a consumer that needs them reads the job (enqueue.Client.Result).
// A keyed job's id carries its key's hash (as every log line's job_id
// does): with the ledger's key secret set (ledger.Options.KeySecret, the
// construct's KeySecretParameter) a guessable key cannot be found from it;
// without one it can, by hashing guesses.
//
// # Trusting an event
//
// An event carries no proof of its origin: EventBridge delivers whatever
// a principal allowed events:PutEvents on the bus puts there. The
// construct's CompletionEvents put the ends on a bus of their own, whose
// resource policy denies PutEvents to every principal but the publisher's
// role, so its ends are the ledger's. On another bus (the account's
// default one, where any principal with events:PutEvents can put a
// "refund Succeeded" for a job the ledger holds Failed, and every rule
// owner reads every job's end and error), a consumer that acts on an end
// confirms it: it reads the job by id (strongly consistent) and calls
// Confirm, which holds the job's kind, state and last change to the
// event's.
//
// # How it fails
//
// Delivery is at least once. PutEvents entries that EventBridge refuses
// (throttled, an internal error) are tried again up to Options.Retries
// times; then, or when the call itself fails, HandleStream returns the
// error and Lambda retries the stream batch (the construct's mapping
// bisects it and keeps a failed batch's position in a queue of its own):
// events already published are published again. Each event's EventID
// (the job's id, the end's time and its write's nonce) is the same on
// every publication of one end and differs between two ends of a job
// (a requeued job's next end, even in the same millisecond), for a
// consumer to drop repeats. A change it cannot read (an
// unexpected attribute type: the stream is input) is skipped, never a
// panic.
//
// # Cost
//
// One PutEvents request per 10 ended jobs in a stream batch (at most;
// the construct batches up to 100 records over 10 s), each entry one
// EventBridge event under 1 KB: $1.00 per million ended jobs at list
// price (custom events, $1.00/M, 64 KB chunks), plus a share of a Lambda
// invocation per batch. No DynamoDB request.
package completion

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Source and DetailType are every event's: a rule matches them, and the
// detail's state (and kind) to pick the ends it wants.
const (
	Source     = "nexjob"
	DetailType = "nexjob job ended"
)

// Event is an event's detail.
type Event struct {
	// EventID is the same on every publication of one end (at least
	// once), and another for each end: the job's id, the end's time and
	// its write's nonce.
	EventID     string       `json:"eventId"`
	ID          string       `json:"id"`
	Kind        string       `json:"kind"`
	State       ledger.State `json:"state"`
	Attempt     int          `json:"attempt"`
	MaxAttempts int          `json:"maxAttempts,omitempty"`
	Queue       string       `json:"queue,omitempty"` // a named queue's name
	Error       string       `json:"error,omitempty"` // the last error, cut to ledger.MaxListError
	EndedAt     time.Time    `json:"endedAt"`
}

// EventBridge is the part of *eventbridge.Client the publisher uses.
type EventBridge interface {
	PutEvents(context.Context, *eventbridge.PutEventsInput, ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// Options tune a Publisher. The zero value takes every default.
type Options struct {
	// Bus is the event bus's name or ARN. Defaults to "default", the
	// account's default bus; the construct gives its publisher a bus of
	// its own (NEXJOB_EVENT_BUS).
	Bus string
	// Retries is how often entries EventBridge refused are sent again
	// before the batch fails. Defaults to 3.
	Retries int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Publisher publishes jobs' ends.
type Publisher struct {
	eb EventBridge
	o  Options
}

// New returns a publisher to eb's bus.
func New(eb EventBridge, opts *Options) *Publisher {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Bus == "" {
		o.Bus = "default"
	}
	if o.Retries <= 0 {
		o.Retries = 3
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Publisher{eb: eb, o: o}
}

// HandleStream is the Lambda handler for the table's stream.
func (p *Publisher) HandleStream(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	changes := make([]guard.Change, 0, len(ev.Records))
	for _, r := range ev.Records {
		if r.EventName == "MODIFY" {
			changes = append(changes, guard.ChangeFromImages(r.Change.NewImage, r.Change.OldImage))
		}
	}
	return events.DynamoDBEventResponse{}, p.Publish(ctx, changes)
}

// Publish sends an event for each change that is a job's end (see
// guard.Change.Ended), ten to a request, in the changes' order.
func (p *Publisher) Publish(ctx context.Context, changes []guard.Change) error {
	var batch []ebtypes.PutEventsRequestEntry
	for _, c := range changes {
		if !c.Ended() {
			continue
		}
		e := EventOf(c)
		detail, err := eventDetail(e)
		if err != nil {
			return err
		}
		batch = append(batch, ebtypes.PutEventsRequestEntry{
			Source: aws.String(Source), DetailType: aws.String(DetailType), Detail: aws.String(string(detail)),
			EventBusName: aws.String(p.o.Bus), Time: aws.Time(e.EndedAt),
		})
		if len(batch) == 10 {
			if err := p.put(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if len(batch) == 0 {
		return nil
	}
	return p.put(ctx, batch)
}

// maxDetail bounds an event's detail: one EventBridge event of under
// 1 KB (the package's cost promise).
const maxDetail = 1000

// eventDetail is e's JSON, not escaping HTML, with its error cut further
// when its escapes (a quoted HTML page, control characters) would take
// the detail past maxDetail.
func eventDetail(e Event) ([]byte, error) {
	for {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e); err != nil {
			return nil, err
		}
		detail := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
		if len(detail) <= maxDetail || e.Error == "" {
			return detail, nil
		}
		cut := max(0, len(e.Error)-(len(detail)-maxDetail)-1)
		for cut > 0 && !utf8.RuneStart(e.Error[cut]) {
			cut--
		}
		e.Error = e.Error[:cut]
	}
}

// EventOf is the event of the end c.
func EventOf(c guard.Change) Event {
	at := ledger.Millis(c.UpdatedAt)
	return Event{
		EventID: c.ID + "@" + strconv.FormatInt(c.UpdatedAt, 10) + "." + c.Nonce, ID: c.ID, Kind: c.Kind, State: c.State,
		Attempt: c.Attempt, MaxAttempts: c.MaxAttempts, Queue: c.Queue, Error: c.ListErr, EndedAt: at.UTC(),
	}
}

// ErrNotConfirmed matches every *NotConfirmedError.
var ErrNotConfirmed = errors.New("nexjob completion: the ledger does not hold this end")

// NotConfirmedError: an event whose end the job's record does not hold.
type NotConfirmedError struct {
	JobID string
	Why   string
}

func (e *NotConfirmedError) Error() string {
	return fmt.Sprintf("nexjob completion: the event of job %s is not confirmed by the ledger: %s", e.JobID, e.Why)
}

// Is matches ErrNotConfirmed.
func (e *NotConfirmedError) Is(target error) bool { return target == ErrNotConfirmed }

// Confirm checks the event e against rec, the job's record as the ledger
// holds it now, read by e.ID strongly consistent (enqueue's
// Client.Store().Get, `nexjob get ID`; on AWS GetItem, GrantRead or
// GrantEnqueue): the same job and kind, ended in e's state, its last
// change not before e's end. An event of an end the job never had (put by
// anyone allowed events:PutEvents on the bus: on the account's default
// bus, any principal with events:PutEvents) or of an end since undone (the
// job was requeued, and runs again or ended otherwise) is a
// *NotConfirmedError; nil means the ledger holds that end. A consumer
// that acts on an end (a refund paid, an order shipped) confirms it so,
// unless the ends come from the construct's own bus, on which only its
// publisher may put events.
func Confirm(rec ledger.Record, e Event) error {
	why := ""
	switch {
	case rec.ID != e.ID:
		why = fmt.Sprintf("the record read is job %s's", rec.ID)
	case rec.Kind != e.Kind:
		why = fmt.Sprintf("the job is of kind %q, the event says %q", rec.Kind, e.Kind)
	case !e.State.Terminal():
		why = fmt.Sprintf("the event's state %q is not an end", e.State)
	case rec.State != e.State:
		why = fmt.Sprintf("the job is %s, the event says %s", rec.State, e.State)
	case rec.UpdatedAt < e.EndedAt.UnixMilli():
		why = fmt.Sprintf("the job last changed at %s, before the event's end at %s", ledger.Millis(rec.UpdatedAt).UTC().Format(time.RFC3339Nano), e.EndedAt.UTC().Format(time.RFC3339Nano))
	default:
		return nil
	}
	return &NotConfirmedError{JobID: e.ID, Why: why}
}

// put sends entries, again for those refused, Retries times at most.
func (p *Publisher) put(ctx context.Context, entries []ebtypes.PutEventsRequestEntry) error {
	for try := 0; ; try++ {
		out, err := p.eb.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries})
		if err != nil {
			return fmt.Errorf("nexjob completion: put events: %w", err)
		}
		if out.FailedEntryCount == 0 {
			return nil
		}
		var again []ebtypes.PutEventsRequestEntry
		code := ""
		for i, r := range out.Entries {
			if r.ErrorCode != nil && i < len(entries) {
				again = append(again, entries[i])
				code = aws.ToString(r.ErrorCode)
			}
		}
		if len(again) == 0 || try >= p.o.Retries {
			return fmt.Errorf("nexjob completion: %d of %d events not published (%s)", out.FailedEntryCount, len(entries), code)
		}
		p.o.Logger.WarnContext(ctx, "nexjob completion: events refused; sending them again", "refused", len(again), "code", code)
		entries = again
	}
}
