package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// SQS is the part of *sqs.Client the handler uses.
type SQS interface {
	enqueue.SQS
	ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// Retention is how long terminal records are kept: see ledger.Retention.
type Retention = ledger.Retention

// DefaultRetention is NexJob's: 7 days, 30 days, 7 days
// (ledger.DefaultRetention).
var DefaultRetention = ledger.DefaultRetention

// Defaults of Options.
const (
	DefaultConcurrency = 10
	DefaultLease       = 5 * time.Minute
	DefaultStopBefore  = 10 * time.Second
	// DefaultMaxCutOffs: after this many runs of one attempt cut off by the
	// invocation's deadline, the attempt is spent as a failure.
	DefaultMaxCutOffs = 3
	// DefaultMaxReturns: a job whose message reaches the DLQ before any
	// run of it started is sent back this many times, then Failed.
	DefaultMaxReturns = 3
	// finishMargin is kept back from a run's deadline to record its result.
	finishMargin = 2 * time.Second
	// MinLease: Options.Lease must be longer (New refuses it otherwise
	// with an *enqueue.InputError): a run gets the lease less the 2 s
	// kept back to record its result.
	MinLease = finishMargin
	// replyMargin is kept back from the invocation's deadline to return
	// the batch response, whatever the workers do.
	replyMargin = 500 * time.Millisecond
	// leaseSlack is added to a lease past the run's end.
	leaseSlack = 5 * time.Second
)

// Options tune a Handler. The zero value takes every default.
type Options struct {
	// Concurrency bounds the jobs of one batch run at once. Defaults to
	// DefaultConcurrency.
	Concurrency int
	// Lease is how long a claim holds a job when the context has no
	// deadline. Under Lambda the lease follows the invocation's deadline
	// instead. Defaults to DefaultLease.
	Lease time.Duration
	// StopBefore: with less than this left before the invocation's
	// deadline, no new job is claimed; the rest of the batch goes back.
	// It never exceeds a third of the time the invocation had at its
	// start, so a short function timeout still runs jobs. Defaults to
	// DefaultStopBefore.
	StopBefore time.Duration
	// Retention of terminal records. Defaults to DefaultRetention.
	Retention *Retention
	// DLQURL receives messages that are not jobs, with the reason in a
	// message attribute. Defaults to none: such messages are returned as
	// failures and reach the DLQ through the queue's redrive policy.
	DLQURL string
	// DynamoDB and SQS replace the clients built from the aws.Config.
	DynamoDB ledger.DynamoDB
	SQS      SQS
	// Ledger passes options to the ledger (clock, key secret).
	Ledger ledger.Options
	// MaxDelay caps one SQS delay (see enqueue.ClientOptions.MaxDelay).
	// Defaults to enqueue.MaxSQSDelay.
	MaxDelay time.Duration
	// Logger defaults to slog.Default(). Logs carry job ids and kinds,
	// never args or keys.
	Logger *slog.Logger
	// MaxCutOffs: runs of one attempt that the invocation's deadline may
	// cut off (each gives the attempt back) before the attempt is spent as
	// a failure, so a job that always outruns the function timeout ends
	// after MaxAttempts. Defaults to DefaultMaxCutOffs.
	MaxCutOffs int
	// MaxReturns: times the DLQ consumer sends back a job whose message
	// reached the DLQ although no run of it started (claims throttled,
	// receives too near the invocation's end) before it fails it with
	// ErrNeverStarted. Defaults to DefaultMaxReturns.
	MaxReturns int
	// Backoff is the retry backoff of the kinds that set none
	// (KindOptions.Backoff). Defaults to DefaultBackoff.
	Backoff func(attempt int) time.Duration
	// UnknownKindBackoff is the wait before retrying a job whose kind has
	// no worker here (a producer deployed before its worker): the job
	// spends an attempt, is logged at ERROR and retried. Defaults to
	// DefaultBackoff.
	UnknownKindBackoff func(attempt int) time.Duration
	// OnDeadLetter is called once when a job becomes Failed whose kind has
	// no OnDeadLetter of its own, including kinds with no worker here (the
	// cause then matches ErrUnknownKind). Defaults to none.
	OnDeadLetter func(ctx context.Context, rec ledger.Record, cause error) error
	// Metrics records every run's outcome and duration per kind in
	// CloudWatch's Embedded Metric Format (see package metrics).
	// lambdamain turns it on; defaults to none.
	Metrics *metrics.Recorder
	// TracerProvider turns tracing on: a consumer span per claimed job
	// ("process <queue>", with OpenTelemetry's messaging attributes and
	// the kind as nexjob.kind; a job with no worker gets one too), the
	// child of the producer's span carried in the message
	// (enqueue.TraceAttribute, or AWSTraceHeader with XRay).
	// Defaults to none (off).
	TracerProvider trace.TracerProvider
	// XRay, when set, reads the producer's span context from the
	// message's AWSTraceHeader system attribute (X-Ray's format, which
	// Lambda's active tracing sets) when it has no traceparent, and sends
	// it on with retries and carried schedules: see
	// enqueue.ClientOptions.XRay. Defaults to none.
	XRay propagation.TextMapPropagator
	// Far and FarAfter: retries and carried schedules due beyond FarAfter
	// wait in one one-time schedule, not in SQS hops (see
	// enqueue.ClientOptions.Far): it fires onetime.Lead before the run
	// time and the worker carries it the rest by an SQS delay. A dispatch guard's check of a far job
	// makes sure of the job's own schedule and ends (no schedule of its
	// own); when Scheduler refuses, it hops through SQS. Defaults to
	// none: hops.
	Far      enqueue.FarScheduler
	FarAfter time.Duration
	// Queues are the named queues (enqueue.ClientOptions.Queues): a
	// retry, a carried-forward schedule or a continuation of a job on one
	// goes back to it. A job whose record names a queue not among them
	// (taken out of NEXJOB_QUEUES) is sent on via the job queue, with a
	// warning, and a message from a queue not among them is handled as
	// one from the job queue. Defaults to none.
	Queues map[string]string
	// GuardAfter is the dispatch guard's After (guard.Options.After): a
	// guard's check that finds its job not yet due (a debounce fold moved
	// its run later) is sent again, due this long past the new run time.
	// Defaults to enqueue.DefaultRedispatchAfter, the guard's default.
	GuardAfter time.Duration
}

// Handler runs the jobs of SQS batches. Its Handle method is the Lambda
// handler; the local poller calls the same method.
type Handler struct {
	reg      *Registry
	store    *ledger.Store
	producer *enqueue.Client
	sqs      SQS
	queueURL string
	o        Options
	log      *slog.Logger
	tracer   trace.Tracer
	pool     *pool
}

// New returns a Handler for the ledger table and the job queue.
func New(cfg aws.Config, table, queueURL string, reg *Registry, opts *Options) (*Handler, error) {
	if reg == nil {
		return nil, errors.New("nexjob: handler needs a Registry")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.SQS == nil {
		o.SQS = sqs.NewFromConfig(cfg)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Lease <= MinLease {
		// Every run would start with its context done: the lease less the
		// margin kept to record the result leaves no time to run.
		return nil, &enqueue.InputError{Field: "Options.Lease", Reason: fmt.Sprintf("%s is too short: a run gets the lease less %s kept to record its result, so it must be over %s", o.Lease, finishMargin, MinLease)}
	}
	if o.StopBefore <= 0 {
		o.StopBefore = DefaultStopBefore
	}
	if o.Retention == nil {
		o.Retention = &DefaultRetention
	}
	if o.MaxCutOffs <= 0 {
		o.MaxCutOffs = DefaultMaxCutOffs
	}
	if o.MaxReturns <= 0 {
		o.MaxReturns = DefaultMaxReturns
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.UnknownKindBackoff == nil {
		o.UnknownKindBackoff = DefaultBackoff
	}
	if o.GuardAfter <= 0 {
		o.GuardAfter = enqueue.DefaultRedispatchAfter
	}
	p, err := enqueue.New(cfg, table, queueURL, &enqueue.ClientOptions{
		DynamoDB: o.DynamoDB, SQS: o.SQS, Ledger: o.Ledger, Logger: o.Logger, MaxDelay: o.MaxDelay, XRay: o.XRay, Far: o.Far, FarAfter: o.FarAfter, Queues: o.Queues,
		Retention: o.Retention,
	})
	if err != nil {
		return nil, err
	}
	tp := o.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &Handler{reg: reg, store: p.Store(), producer: p, sqs: o.SQS, queueURL: queueURL, o: o, log: o.Logger, tracer: tp.Tracer(enqueue.TracerName), pool: newPool()}, nil
}

// Producer returns the enqueue client the handler dispatches with.
func (h *Handler) Producer() *enqueue.Client { return h.producer }

type clientKey struct{}

// ClientFrom is the enqueue client of the handler that runs the job (or
// the dead-letter hook) ctx is in, River's ClientFromContext: a worker
// enqueues follow-up jobs, continues, signals or reads results with the
// handler's own settings, named queues and key secret, instead of a
// second client its main builds (and settings read twice at start).
// Outside Handle and HandleDeadLetters it is ErrNotInRun.
func ClientFrom(ctx context.Context) (*enqueue.Client, error) {
	if c, ok := ctx.Value(clientKey{}).(*enqueue.Client); ok {
		return c, nil
	}
	return nil, ErrNotInRun
}

// Handle runs one SQS batch: the jobs run concurrently (bounded by
// Concurrency), and the response lists exactly the messages that must come
// back. It never returns an error: a failure is per message. The runs of a
// batch of several go to goroutines the Handler keeps between batches (as Lambda keeps its
// process); one idle for a minute ends.
//
// Under a deadline, Handle returns shortly before it whatever the workers
// do: a worker that ignores its context is left running and its message
// reported as a failure (it comes back and finds the job's record as the
// straggler left it), as are the messages not started by then.
//
// A batch of one message runs on Handle's own goroutine instead: there is
// no other message whose outcome an early return could save, so a worker
// that ignores its context past the deadline meets Lambda's timeout, which
// ends the invocation with the same result for the message (it comes back
// after its visibility timeout and finds the record as the run left it)
// and also stops the runaway worker, where a kept goroutine would run on
// into later invocations. Handing the run to a pool goroutine cost a
// one-job batch about a third more CPU on a 2-vCPU function (make bench).
func (h *Handler) Handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	ctx = context.WithValue(ctx, clientKey{}, h.producer)
	if len(ev.Records) == 1 {
		return h.handleOne(ctx, ev.Records[0]), nil
	}
	var (
		mu       sync.Mutex
		settled  = make([]bool, len(ev.Records))        // processed and may be deleted
		closed   bool                                   // the response was built
		finished = make(chan struct{}, len(ev.Records)) // one per run ended
		stop     = h.stopBefore(ctx)
		giveUp   <-chan time.Time
	)
	if dl, ok := ctx.Deadline(); ok {
		t := time.NewTimer(time.Until(dl) - replyMargin)
		defer t.Stop()
		giveUp = t.C
	}
	response := func() events.SQSEventResponse {
		mu.Lock()
		defer mu.Unlock()
		closed = true
		var resp events.SQSEventResponse
		for i, m := range ev.Records {
			if !settled[i] {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
			}
		}
		return resp
	}
	gaveUp := func() events.SQSEventResponse {
		h.log.ErrorContext(ctx, "nexjob: invocation ending with runs still going; their messages come back")
		return response() // the messages not started are failures
	}
	// Runs start here, at most Concurrency at once, each on a goroutine
	// other than this one, so that the response can be returned at giveUp
	// whatever they do.
	running := 0
	for i, m := range ev.Records {
		for running >= h.o.Concurrency {
			select {
			case <-finished:
				running--
			case <-giveUp:
				return gaveUp(), nil
			}
		}
		select {
		case <-giveUp: // a slot and the deadline both came: stopping wins
			return gaveUp(), nil
		default:
		}
		running++
		h.pool.run(func() {
			ok := h.process(ctx, m, stop)
			mu.Lock()
			if !closed {
				settled[i] = ok
			}
			mu.Unlock()
			finished <- struct{}{}
		})
	}
	for ; running > 0; running-- {
		select {
		case <-finished:
		case <-giveUp:
			return gaveUp(), nil
		}
	}
	return response(), nil
}

// handleOne runs a batch of one message on the caller's goroutine.
func (h *Handler) handleOne(ctx context.Context, m events.SQSMessage) events.SQSEventResponse {
	if h.process(ctx, m, h.stopBefore(ctx)) {
		return events.SQSEventResponse{}
	}
	return events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{{ItemIdentifier: m.MessageId}}}
}

// stopBefore is how long before ctx's deadline no message is claimed:
// StopBefore, or a third of the time left when that is less.
func (h *Handler) stopBefore(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return min(h.o.StopBefore, time.Until(dl)/3)
	}
	return h.o.StopBefore
}
