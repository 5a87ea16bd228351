package enqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// JobArgs is a job's input. The type names its kind: one kind, one worker.
// Args are encoded as JSON into the ledger.
type JobArgs interface {
	Kind() string
}

// The DuplicatePolicy values, re-exported from ledger for callers.
type DuplicatePolicy = ledger.DuplicatePolicy

const (
	AllowAfterFailed = ledger.AllowAfterFailed
	RejectIfFailed   = ledger.RejectIfFailed
	RejectAlways     = ledger.RejectAlways
)

// SQS is the part of *sqs.Client the producer uses.
type SQS interface {
	SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// Defaults.
const (
	// DefaultMaxAttempts is NexJob's default attempt budget.
	DefaultMaxAttempts = 10
	// DefaultScheduleTolerance is how far in the past a RunAt may be and
	// still run at once rather than be refused (clock skew, slow callers).
	DefaultScheduleTolerance = time.Minute
	// DefaultRedispatchAfter: see ClientOptions.RedispatchAfter; the
	// dispatch guard waits as long before it checks a job.
	DefaultRedispatchAfter = 2 * time.Minute
	// MaxScheduleAhead bounds Delay and RunAt: a year and a day. Further
	// is refused (a unit mix-up, not a plan), and a message claiming more
	// is not a job.
	MaxScheduleAhead = 366 * 24 * time.Hour
	// MaxSQSDelay is SQS's limit on DelaySeconds. Longer schedules are
	// carried forward by the worker in hops of at most this.
	MaxSQSDelay = 900 * time.Second
)

// ClientOptions tune a Client. The zero value is ready to use.
type ClientOptions struct {
	// DynamoDB replaces the client built from the aws.Config (tests wrap
	// the real one to inject faults). Defaults to dynamodb.NewFromConfig.
	DynamoDB ledger.DynamoDB
	// SQS replaces the client built from the aws.Config. Defaults to
	// sqs.NewFromConfig.
	SQS SQS
	// Ledger passes options to the ledger (clock, key secret).
	Ledger ledger.Options
	// Logger receives one line per enqueue: job id, kind, outcome. Never
	// the key or the args. Defaults to slog.Default().
	Logger *slog.Logger
	// ScheduleTolerance: see DefaultScheduleTolerance.
	ScheduleTolerance time.Duration
	// RedispatchAfter: a duplicate enqueue of a job that has waited this
	// long unclaimed since it became due sends its message again (its
	// producer may have died between the write and the send). A job known
	// to be unsent (its send failed) is re-sent at once. Defaults to
	// DefaultRedispatchAfter.
	RedispatchAfter time.Duration
	// MaxDelay caps one SQS delay; a longer schedule is carried forward
	// in hops of MaxDelay. Defaults to MaxSQSDelay; tests shorten it to
	// drive long schedules with an injected clock.
	MaxDelay time.Duration
	// Metrics records Enqueued, Deduplicated and Rejected per kind in
	// CloudWatch's Embedded Metric Format (see package metrics): on in a
	// producer Lambda, where stdout reaches CloudWatch; elsewhere give it a
	// metrics.Options.MeterProvider or Logger. Defaults to none.
	Metrics *metrics.Recorder
	// TracerProvider turns tracing on: a producer span per Enqueue,
	// EnqueueMany, ContinueWith and Requeue ("send <queue>", with
	// OpenTelemetry's messaging attributes and the kind as nexjob.kind),
	// its context carried to the worker in the message's TraceAttribute.
	// Defaults to none (off).
	TracerProvider trace.TracerProvider
	// XRay, when set, also carries the span context in the message's
	// AWSTraceHeader system attribute, in X-Ray's format, through this
	// propagator (for example xray.Propagator{} of
	// go.opentelemetry.io/contrib/propagators/aws): X-Ray and Lambda's
	// active tracing follow a job from producer to worker then. Defaults
	// to none.
	XRay propagation.TextMapPropagator
	// Far carries a message due more than FarAfter ahead with one
	// one-time schedule (package onetime) instead of SQS delay hops of
	// MaxDelay: a job a year ahead costs one CreateSchedule, not 35,136
	// hops. Such a message carries no trace attributes (Scheduler's SQS
	// target cannot set them). Defaults to none: hops.
	Far FarScheduler
	// FarAfter is the delay beyond which Far is used. Defaults to
	// MaxSQSDelay (15 minutes): nearer delays stay SQS delays.
	FarAfter time.Duration
	// Queues names the named queues (name → queue URL) that Opts.Queue
	// and a kind's Defaults.Queue may choose, each with its own worker
	// event source, MaxConcurrency and DLQ in the construct (a bulk
	// import on one cannot starve payments on another). A job's every
	// message goes to its queue. Defaults to none: every job on the job
	// queue. Every role that sends jobs (producers, the worker, the guard,
	// the operator's tools) needs the same map: settings read it from
	// NEXJOB_QUEUES.
	Queues map[string]string
	// Retention is how long a record this client ends is kept: a
	// continuation whose link to its parent failed, ended Failed (or
	// Expired, as its parent). Defaults to ledger.DefaultRetention; a
	// handler passes its own Options.Retention.
	Retention *ledger.Retention
}

// FarScheduler sends a message at a later time: *onetime.Client.
type FarScheduler interface {
	// Schedule sends body to the named queue ("" the job queue) at at.
	Schedule(ctx context.Context, name string, at time.Time, queue, body string) error
	// Ensure is Schedule unless a schedule of that name exists (the
	// name is one run of one job: it sends this message already).
	Ensure(ctx context.Context, name string, at time.Time, queue, body string) error
	Unschedule(ctx context.Context, name string) error
}

// Client enqueues jobs: one conditional DynamoDB write, then one SQS send.
type Client struct {
	cfg       aws.Config
	store     *ledger.Store
	sqs       SQS
	queueURL  string
	log       *slog.Logger
	tolerance time.Duration
	maxDelay  time.Duration
	redisp    time.Duration
	metrics   *metrics.Recorder
	tracer    trace.Tracer
	tracing   bool // a TracerProvider was given
	xray      propagation.TextMapPropagator
	far       FarScheduler
	farAfter  time.Duration
	queues    map[string]string // named queue → URL
	retention ledger.Retention
}

// New returns a Client for the ledger table and the job queue. It does no
// I/O; call Ping to check at start that both exist.
func New(cfg aws.Config, table, queueURL string, opts *ClientOptions) (*Client, error) {
	var o ClientOptions
	if opts != nil {
		o = *opts
	}
	if queueURL == "" {
		return nil, errors.New("nexjob: enqueue needs the job queue URL")
	}
	for name, url := range o.Queues {
		if !kinds.Valid(name) || url == "" {
			return nil, fmt.Errorf("nexjob: named queue %q: the name must be %s and the URL set", name, kinds.Rule)
		}
	}
	if o.DynamoDB == nil {
		o.DynamoDB = dynamodb.NewFromConfig(cfg)
	}
	if o.SQS == nil {
		o.SQS = sqs.NewFromConfig(cfg)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ScheduleTolerance <= 0 {
		o.ScheduleTolerance = DefaultScheduleTolerance
	}
	if o.RedispatchAfter <= 0 {
		o.RedispatchAfter = DefaultRedispatchAfter
	}
	farAfter := o.FarAfter
	if farAfter <= 0 {
		farAfter = MaxSQSDelay
	}
	if o.MaxDelay <= 0 || o.MaxDelay > MaxSQSDelay {
		o.MaxDelay = MaxSQSDelay
	}
	store, err := ledger.New(o.DynamoDB, table, &o.Ledger)
	if err != nil {
		return nil, err
	}
	retention := ledger.DefaultRetention
	if o.Retention != nil {
		retention = *o.Retention
	}
	return &Client{cfg: cfg, store: store, sqs: o.SQS, queueURL: queueURL, log: o.Logger, tolerance: o.ScheduleTolerance, maxDelay: o.MaxDelay, redisp: o.RedispatchAfter, metrics: o.Metrics, tracer: tracer(o.TracerProvider), tracing: o.TracerProvider != nil, xray: o.XRay, far: o.Far, farAfter: farAfter, queues: o.Queues, retention: retention}, nil
}

// QueueURL is the URL of the named queue ("" the job queue), or an error
// matching ErrUnknownQueue when the client's Queues do not name it.
func (c *Client) QueueURL(name string) (string, error) {
	if name == "" {
		return c.queueURL, nil
	}
	if url, ok := c.queues[name]; ok {
		return url, nil
	}
	return "", fmt.Errorf("%w: %q", ErrUnknownQueue, name)
}

// Queues are the client's named queues (name → URL), the job queue not
// among them.
func (c *Client) Queues() map[string]string { return c.queues }

// Store returns the ledger the client writes to.
func (c *Client) Store() *ledger.Store { return c.store }

// Opts are the per-job options of Enqueue. A nil *Opts means all defaults.
type Opts struct {
	// IdempotencyKey deduplicates enqueues of the same logical operation.
	// Empty means no key: every call creates a job. A key of only white
	// space, longer than ledger.MaxKeyLen bytes or not UTF-8 is refused.
	IdempotencyKey string
	// RequestID names this enqueue request, for a caller that may retry it
	// after the job ran (a scheduler delivering at least once, a webhook
	// redelivered): with an IdempotencyKey, a retry that finds the key held
	// by the job this same request created gets that job back as a
	// duplicate, whatever its state and the DuplicatePolicy, instead of a
	// new run. Stored hashed, as keys are; 1 to 512 bytes. Defaults to
	// none. recurring.Fire sets it to the firing.
	RequestID string
	// RequestTime orders the key's requests, for requests that come in
	// order and may be retried late (a recurring schedule's firings, each
	// at its scheduled time): a request not after the one that made the
	// key's record is a late retry and gets that job back (Duplicate),
	// never a new job, even after the record was replaced. Needs
	// RequestID. Defaults to none (zero).
	RequestTime time.Time
	// DuplicatePolicy decides what a key held by a terminal job does.
	// Defaults to AllowAfterFailed.
	DuplicatePolicy DuplicatePolicy
	// ReplaceEnded: when the policy lets the key go, the ended job's
	// record is overwritten by the new one in the same conditional write
	// (1 write unit) instead of being moved aside under its job id (a
	// failed write and a 2-item transaction, 5 units). The ended job can
	// no longer be read by its id. For keys re-used often whose old runs
	// nobody reads back (recurring.Fire sets it). Defaults to false.
	ReplaceEnded bool
	// Delay schedules the job this far ahead. Defaults to 0 (run now).
	Delay time.Duration
	// RunAt schedules the job at this time; exclusive with Delay. A time
	// in the past within ScheduleTolerance means now; further back is
	// refused. Defaults to now.
	RunAt time.Time
	// Deadline: a job not started by then becomes Expired and never runs.
	// Must be after the run time. Defaults to none.
	Deadline time.Time
	// MaxAttempts is the attempt budget. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// PayloadMismatch: what a key held by an active job with other args
	// does. Defaults to IgnorePayload (a duplicate, as in NexJob).
	PayloadMismatch PayloadPolicy
	// NoKindDefaults takes these Opts as they are: the args type's
	// JobDefaults (KindDefaults) fill none of their zero fields, so a zero
	// field means the package's default (AllowAfterFailed over a kind
	// whose default is RejectAlways, say). Defaults to false.
	NoKindDefaults bool
	// RateLimit refuses the enqueue, with a *RateLimitedError and no job
	// written, when its key already had Limit enqueues in the last
	// Period (see RateLimit). Defaults to none.
	RateLimit *RateLimit
	// Queue sends the job to this named queue (one of
	// ClientOptions.Queues) instead of the job queue, and every later
	// message of it too. A name the client does not know is an
	// *InputError (ErrUnknownQueue), nothing written. Defaults to the
	// kind's Defaults.Queue, else the job queue.
	Queue string
	// Debounce folds a burst of enqueues with one key into one run (see
	// Debounce). Exclusive with IdempotencyKey, Delay and RunAt. Enqueue
	// and EnqueueMany apply it; EnqueueTx, ContinueWith and
	// ContinueWhenAll refuse it (an *InputError). Defaults to none.
	Debounce *Debounce
}

// Result is the outcome of an accepted enqueue.
type Result struct {
	ID        string       // the job's id: the new job's, or the existing one's
	Kind      string       // the job's kind (the existing job's for a duplicate)
	State     ledger.State // the job's state as this call saw it
	Duplicate bool         // true: an active job already held the key; nothing new was written
	// Redispatched: the duplicate's job had apparently never been sent
	// (see ClientOptions.RedispatchAfter), and this call sent it.
	Redispatched bool
	// Folded: a Debounce enqueue whose args went into the pending job ID
	// (its run moved later); no new job was written.
	Folded bool
}

// Enqueue records a job and sends it to SQS.
//
// With an idempotency key, an active job holding the key is returned as a
// duplicate (Result.Duplicate); a terminal one is replaced by a new job or,
// if the policy says so, refused with a *DuplicateJobError. Bad input gives
// an *InputError and writes nothing. If the ledger write succeeds and the
// send fails, the error is a *DispatchError naming the recorded job.
func (c *Client) Enqueue(ctx context.Context, args JobArgs, opts *Opts) (Result, error) {
	o := effective(args, opts)
	rec, err := c.newRecord(args, &o, viaEnqueue)
	if err != nil {
		return Result{}, err
	}
	ctx, span := c.startSpan(ctx, "enqueue", attribute.String("nexjob.kind", rec.Kind))
	var res Result
	if o.Debounce != nil {
		res, err = c.debounce(ctx, rec, &o).outcome()
	} else {
		res, err = c.submit(ctx, rec, &o)
	}
	endSpan(span, res, err)
	return res, err
}

// submit inserts a validated record and sends it, or handles the duplicate.
func (c *Client) submit(ctx context.Context, rec ledger.Record, o *Opts) (Result, error) {
	got, send, r := c.decide(ctx, rec, o)
	if send {
		c.sent(ctx, got, &r, c.Dispatch(ctx, got))
	}
	return r.outcome()
}

// outcome is an item's result as Enqueue returns it: no Result for a
// call that recorded nothing.
func (r ItemResult) outcome() (Result, error) {
	if r.Err != nil && !r.Recorded {
		return Result{}, r.Err
	}
	return r.Result, r.Err
}

// decide writes a validated record (or meets the key's holder) and says
// whether its message is to be sent now.
func (c *Client) decide(ctx context.Context, rec ledger.Record, o *Opts) (ledger.Record, bool, ItemResult) {
	if err := c.admit(ctx, rec, o); err != nil {
		return rec, false, ItemResult{Err: err}
	}
	got, created, err := c.insert(ctx, rec, o)
	if err != nil {
		return got, false, ItemResult{Err: err}
	}
	res := ItemResult{Result: Result{ID: got.ID, Kind: got.Kind, State: got.State, Duplicate: !created}, Recorded: true}
	if !created {
		if err := checkHolder(rec, got, o); err != nil {
			return got, false, ItemResult{Err: err}
		}
		c.log.LogAttrs(ctx, slog.LevelInfo, "nexjob: enqueue deduplicated", slog.String("job_id", got.ID), slog.String("kind", got.Kind), slog.String("state", string(got.State)))
		c.metrics.Count(metrics.Deduplicated, got.Kind, got.ID)
		if !c.unsent(got) {
			res.Sent = true
			return got, false, res
		}
		res.Redispatched = true
	}
	return got, true, res
}

// BookkeepingTimeout bounds the ledger writes that record what happened
// after a failure (an unsent mark, a child ended with its parent). They run
// on a context detached from the caller's: a caller whose deadline cut the
// call short still gets them written.
const BookkeepingTimeout = 5 * time.Second

func bookkeeping(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), BookkeepingTimeout)
}

// unsent reports whether an existing job looks as if its message was never
// sent: marked so after a failed send, or waiting unclaimed since it became
// due for longer than RedispatchAfter.
func (c *Client) unsent(rec ledger.Record) bool {
	if rec.Attempt != 0 {
		return false
	}
	if rec.Undispatched && (rec.State == ledger.Enqueued || rec.State == ledger.Scheduled) {
		return true
	}
	due := rec.UpdatedAt
	if rec.State == ledger.Scheduled {
		due = max(due, rec.RunAt)
	} else if rec.State != ledger.Enqueued {
		return false
	}
	return c.store.Now().Sub(ledger.Millis(due)) > c.redisp
}

func (c *Client) insert(ctx context.Context, rec ledger.Record, o *Opts) (ledger.Record, bool, error) {
	got, created, err := c.store.Insert(ctx, rec, o.IdempotencyKey, o.DuplicatePolicy, &ledger.InsertOptions{ReplaceEnded: o.ReplaceEnded, ID: rec.ID})
	return c.inserted(ctx, rec, got, created, err)
}

// inserted reads an insert's outcome (Insert's, or InsertContinuation's)
// as the caller needs it: a write of unknown outcome looked up, the
// ledger's errors as the producer API's.
func (c *Client) inserted(ctx context.Context, rec, got ledger.Record, created bool, err error) (ledger.Record, bool, error) {
	var uo *ledger.UnknownOutcomeError
	if errors.As(err, &uo) {
		// The write may have been applied (its reply lost, the caller's
		// context ended mid-call): look, on a context of our own. If it
		// was, the job is ours and goes on as created; the send then tells
		// the caller how far it got.
		bctx, cancel := bookkeeping(ctx)
		defer cancel()
		if mine, gerr := c.store.Get(bctx, uo.ID); gerr == nil {
			return mine, true, nil
		}
	}
	var dup *ledger.DuplicateJobError
	if errors.As(err, &dup) {
		c.metrics.Count(metrics.Rejected, rec.Kind, dup.ExistingJobID)
		return got, false, duplicateFrom(dup)
	}
	if errors.Is(err, ledger.ErrItemTooLarge) {
		return got, false, &InputError{Field: "args", Reason: "too large for a job record", Err: err}
	}
	if err != nil {
		return got, false, c.missing(err)
	}
	return got, created, nil
}

// entry is an entry point: its name and whether it applies
// Opts.Debounce. Every entry point applies Opts.RateLimit (admit); one
// that does not debounce refuses Debounce in newRecord, so no option is
// ever validated and then ignored.
type entry struct {
	name     string
	debounce bool
}

var (
	viaEnqueue     = entry{"Enqueue", true}
	viaEnqueueMany = entry{"EnqueueMany", true}
	viaEnqueueTx   = entry{"EnqueueTx", false}      // a transaction commits a new job; a fold is no part of it
	viaContinue    = entry{"a continuation", false} // it runs when its parents are done, not after a quiet period
)

// newRecord validates the input for the entry point via and builds the
// record to insert.
func (c *Client) newRecord(args JobArgs, o *Opts, via entry) (ledger.Record, error) {
	if args == nil || isNilPointer(args) {
		return ledger.Record{}, invalid("args", "nil")
	}
	kind := args.Kind()
	if !kinds.Valid(kind) {
		return ledger.Record{}, invalid("args", "Kind() must be "+kinds.Rule)
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return ledger.Record{}, &InputError{Field: "args", Reason: "cannot be encoded as JSON: " + redact.JSON(err), Err: err}
	}
	if string(raw) == "null" {
		return ledger.Record{}, invalid("args", "nil")
	}
	if len(raw) > ledger.MaxArgsBytes {
		return ledger.Record{}, invalid("args", fmt.Sprintf("%d bytes encoded, the limit is %d", len(raw), ledger.MaxArgsBytes))
	}
	if err := checkKey(o.IdempotencyKey); err != nil {
		return ledger.Record{}, err
	}
	if len(o.RequestID) > 512 {
		return ledger.Record{}, invalid("RequestID", "longer than 512 bytes")
	}
	if err := o.RateLimit.check(); err != nil {
		return ledger.Record{}, err
	}
	if err := o.Debounce.check(o); err != nil {
		return ledger.Record{}, err
	}
	if o.Debounce != nil && !via.debounce {
		return ledger.Record{}, invalid("Debounce", via.name+" does not debounce (Enqueue and EnqueueMany do)")
	}
	if o.RequestID != "" && o.IdempotencyKey == "" {
		return ledger.Record{}, invalid("RequestID", "needs an IdempotencyKey (the request is recognised on the key's record)")
	}
	if _, err := c.QueueURL(o.Queue); err != nil {
		return ledger.Record{}, &InputError{Field: "Queue", Reason: fmt.Sprintf("no queue named %q among ClientOptions.Queues", o.Queue), Err: err}
	}
	if !o.DuplicatePolicy.Valid() {
		return ledger.Record{}, invalid("DuplicatePolicy", fmt.Sprintf("unknown value %d", int(o.DuplicatePolicy)))
	}
	if o.PayloadMismatch != IgnorePayload && o.PayloadMismatch != RejectPayload {
		return ledger.Record{}, invalid("PayloadMismatch", fmt.Sprintf("unknown value %d", int(o.PayloadMismatch)))
	}
	switch {
	case o.MaxAttempts < 0:
		return ledger.Record{}, invalid("MaxAttempts", "negative")
	case o.MaxAttempts == 0:
		o.MaxAttempts = DefaultMaxAttempts
	}
	now := c.store.Now()
	runAt, err := c.runAt(now, o)
	if err != nil {
		return ledger.Record{}, err
	}
	rec := ledger.Record{Kind: kind, Args: string(raw), State: ledger.Enqueued, MaxAttempts: o.MaxAttempts, ArgsHash: ledger.ArgsHash(kind, string(raw)), Queue: o.Queue}
	if !o.RequestTime.IsZero() && o.RequestID == "" {
		return ledger.Record{}, invalid("RequestTime", "needs a RequestID")
	}
	if o.RequestID != "" {
		rec.Request = c.store.HashKey("request\x00" + o.RequestID)
		rec.RequestAt = o.RequestTime.UnixMilli()
	}
	if runAt.After(now) {
		rec.State, rec.RunAt = ledger.Scheduled, runAt.UnixMilli()
	}
	if !o.Deadline.IsZero() {
		if !o.Deadline.After(maxTime(runAt, now)) {
			return ledger.Record{}, invalid("Deadline", "must be after the run time")
		}
		rec.Deadline = o.Deadline.UnixMilli()
	}
	return rec, nil
}

func (c *Client) runAt(now time.Time, o *Opts) (time.Time, error) {
	switch {
	case o.Delay < 0:
		return time.Time{}, invalid("Delay", "negative")
	case o.Delay > MaxScheduleAhead:
		return time.Time{}, invalid("Delay", fmt.Sprintf("more than %s ahead", MaxScheduleAhead))
	case o.Delay > 0 && !o.RunAt.IsZero():
		return time.Time{}, invalid("RunAt", "set together with Delay")
	case o.Delay > 0:
		return now.Add(o.Delay), nil
	case o.RunAt.IsZero():
		return now, nil
	case o.RunAt.After(now.Add(MaxScheduleAhead)):
		return time.Time{}, invalid("RunAt", fmt.Sprintf("more than %s ahead", MaxScheduleAhead))
	case o.RunAt.Before(now.Add(-c.tolerance)):
		return time.Time{}, invalid("RunAt", fmt.Sprintf("%s is in the past beyond the %s tolerance", o.RunAt.UTC().Format(time.RFC3339), c.tolerance))
	}
	return o.RunAt, nil
}

func checkKey(key string) error {
	switch {
	case key == "":
		return nil
	case strings.TrimSpace(key) == "":
		return invalid("IdempotencyKey", "empty (only white space)")
	case len(key) > ledger.MaxKeyLen:
		return invalid("IdempotencyKey", fmt.Sprintf("%d bytes, the limit is %d", len(key), ledger.MaxKeyLen))
	case !utf8.ValidString(key):
		return invalid("IdempotencyKey", "not valid UTF-8")
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func isNilPointer(v any) bool {
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}
