package enqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/onetime"
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
	// MinFarAfter is the least ClientOptions.FarAfter: a one-time
	// schedule fires onetime.Lead before its run time, within a minute of
	// that (Scheduler's precision), and the worker carries the message
	// the rest of the way, which must be an SQS delay, not a schedule
	// again (nor one whose time has passed).
	MinFarAfter = 2 * onetime.Lead
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
	// hops. The schedule fires onetime.Lead (two minutes) before the run
	// time, since Scheduler fires within a minute of a schedule's time, and
	// the worker carries the message the rest of the way with an SQS delay
	// (one send): a far run starts at its time as a near one does. Such a
	// message carries no trace attributes (Scheduler's SQS target cannot
	// set them). Defaults to none: hops.
	Far FarScheduler
	// FarAfter is the delay beyond which Far is used. Defaults to
	// MaxSQSDelay (15 minutes): nearer delays stay SQS delays. Less than
	// MinFarAfter is an *InputError.
	FarAfter time.Duration
	// Queues names the named queues (name → queue URL) that Opts.Queue
	// and a kind's Defaults.Queue may choose, each with its own worker
	// event source, MaxConcurrency and DLQ in the construct (a bulk
	// import on one cannot starve payments on another). A job's every
	// message goes to its queue. Defaults to none: every job on the job
	// queue. Every role that sends jobs (producers, the worker, the guard,
	// the operator's tools) needs the same map: settings read it from
	// NEXJOB_QUEUES. A job whose record names a queue the map does not
	// hold (taken out of NEXJOB_QUEUES while jobs named it) has its
	// messages sent via the job queue, with a warning: a send never fails
	// on the name (new enqueues naming it are refused, see Opts.Queue).
	// Client.MoveQueue (nexjob move-queue) moves such jobs for good.
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
	if farAfter < MinFarAfter {
		return nil, &InputError{Field: "ClientOptions.FarAfter", Reason: fmt.Sprintf("%s is less than %s: a far message comes %s before its run time and is carried by an SQS delay from there", farAfter, MinFarAfter, onetime.Lead)}
	}
	if o.MaxDelay <= 0 || o.MaxDelay > MaxSQSDelay {
		o.MaxDelay = MaxSQSDelay
	}
	if o.Ledger.BlobBucket != "" && o.Ledger.Blobs == nil {
		o.Ledger.Blobs = s3.NewFromConfig(cfg, func(so *s3.Options) {
			so.UsePathStyle = cfg.BaseEndpoint != nil // an emulator's endpoint: no bucket in the host name
			// A response with no checksum to validate (an emulator's, an
			// object written without one) is no news: one log line per
			// GetObject otherwise.
			so.DisableLogOutputChecksumValidationSkipped = true
		})
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
		res, err = c.submit(ctx, rec, &o, viaEnqueue)
	}
	endSpan(span, res, err)
	return res, err
}

// submit inserts a validated record and sends it, or handles the duplicate.
func (c *Client) submit(ctx context.Context, rec ledger.Record, o *Opts, via entry) (Result, error) {
	got, send, r := c.decide(ctx, rec, o, via)
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
func (c *Client) decide(ctx context.Context, rec ledger.Record, o *Opts, via entry) (ledger.Record, bool, ItemResult) {
	if err := c.admit(ctx, rec, o); err != nil {
		return rec, false, ItemResult{Err: err}
	}
	if err := c.offloadArgs(ctx, &rec, o, via); err != nil {
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
