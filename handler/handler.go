package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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
	// enqueue.ClientOptions.Far). A dispatch guard's check of a far job
	// makes sure of the job's own schedule and ends (no schedule of its
	// own); when Scheduler refuses, it hops through SQS. Defaults to
	// none: hops.
	Far      enqueue.FarScheduler
	FarAfter time.Duration
	// Queues are the named queues (enqueue.ClientOptions.Queues): a
	// retry, a carried-forward schedule or a continuation of a job on one
	// goes back to it. Defaults to none.
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

// process handles one message and reports whether it may be deleted.
func (h *Handler) process(ctx context.Context, m events.SQSMessage, stopBefore time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < stopBefore {
		// Not claimed: it comes back after the visibility timeout, with no
		// attempt spent.
		h.log.WarnContext(ctx, "nexjob: invocation nearly over, message left for redelivery", "message_id", m.MessageId, "left", time.Until(dl))
		return false
	}
	msg, err := enqueue.DecodeMessage(m.Body)
	if err != nil {
		return h.notAJob(ctx, m, err)
	}
	// The producer's trace context: a run is its child, a message sent on
	// (carried forward, a retry) carries it on.
	ctx = enqueue.TraceContextOf(ctx, m, h.o.XRay)
	now := h.store.Now()
	if msg.RunAt > now.UnixMilli() {
		return h.carryForward(ctx, msg, now)
	}
	byCheck := false
	if msg.Check {
		run, first, later, err := h.stillWaiting(ctx, msg, now)
		if err != nil {
			// The read failed (a throttle past the SDK's retries): the
			// check comes back rather than vanish.
			h.log.ErrorContext(ctx, "nexjob: dispatch check failed; it comes back", "job_id", msg.ID, "err", err)
			return false
		}
		if later != 0 {
			msg.RunAt = later // not yet due: the check waits for the new run time
			return h.carryForward(ctx, msg, now)
		}
		if !run {
			return true // the job's own message did its work
		}
		byCheck = first
	}
	e, known := h.reg.lookup(msg.Kind)
	var timeout time.Duration
	if known {
		timeout = e.opts.Timeout
	}
	lease, deadline, cause := h.lease(ctx, now, timeout)
	claim := h.store.Claim
	if byCheck {
		claim = h.store.ClaimByCheck
	}
	rec, err := claim(ctx, msg.ID, lease)
	if err != nil {
		return h.unclaimed(ctx, m, msg, now, err)
	}
	if rec.HookPending {
		// Requeued while the hook of its last failure was still due (the
		// worker that failed it died before the hook, and the requeue
		// came before the message that would have run it): that failure's
		// hook runs now, shown the record as it failed, before this run.
		// A worker that holds its lease (running it, or killed in it) is
		// waited for: the run is deferred, no attempt spent, until the
		// lease ends, and then takes the hook over if it is still due
		// (10k soak, seed 1796411833611391690: the run went on, the
		// mark stayed for the next failure, and one hook was lost).
		failed := rec
		failed.State = ledger.Failed
		if held, ok := h.takeOverHook(ctx, failed); !ok {
			at := now.Add(minConcurrencyBackoff) // the claim of the hook failed: soon
			if held > 0 {
				at = ledger.Millis(held + 1)
			}
			return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: at, Deferred: true}, nil)
		}
	}
	// Every claimed job gets its consumer span, with a worker or not.
	if h.o.TracerProvider != nil {
		var span trace.Span
		ctx, span = h.tracer.Start(ctx, enqueue.SpanName("process", h.queueURL), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(append(enqueue.ConsumerSpanAttributes(h.queueURL, m.MessageId),
				attribute.String("nexjob.job_id", rec.ID), attribute.String("nexjob.kind", rec.Kind), attribute.Int("nexjob.attempt", rec.Attempt))...))
		defer span.End()
	}
	// Never started: the first attempt, and no run of it was cut off (a
	// cut-off run started, in time, and got its attempt back).
	if rec.Attempt == 1 && rec.CutOffs == 0 && rec.Deadline != 0 && now.UnixMilli() > rec.Deadline {
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Expired, LastError: "deadline passed before the job started"}, nil)
	}
	if rec.Kind != msg.Kind {
		// Not a message the system made (every message names its job's
		// kind): its kind chose this claim's lease and timeout. The claim
		// is given back, no attempt spent, and the job's own message is
		// sent; the run goes by the record alone.
		h.log.WarnContext(ctx, "nexjob: message names another kind than its job's; the claim is given back", "job_id", rec.ID, "kind", rec.Kind)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: now, Deferred: true}, nil)
	}
	if !known {
		// A producer deployed before its worker, most likely: retry, so
		// the job runs once the worker is deployed.
		err := fmt.Errorf("%w: %q", ErrUnknownKind, rec.Kind)
		h.log.ErrorContext(ctx, "nexjob: no worker for the job's kind", "job_id", rec.ID, "kind", rec.Kind, "attempt", rec.Attempt)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.RecordError(err)
			span.SetStatus(codes.Error, "no worker for the kind")
		}
		return h.failed(ctx, rec, err, h.o.UnknownKindBackoff)
	}
	deferTo, slot, release, err := h.admit(ctx, e, rec)
	if err != nil {
		// A flow-control key function panicked: user code, failed as a
		// worker's panic is (the attempt is spent).
		h.log.ErrorContext(ctx, "nexjob: flow-control key function failed", "job_id", rec.ID, "kind", rec.Kind, "err", err)
		return h.failed(ctx, rec, err, e.backoff)
	}
	if !deferTo.IsZero() {
		// Flow control: no slot now. Not a run: the attempt is given back.
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: deferTo, Deferred: true, Slot: slot}, nil)
	}
	defer release() // after the run's end is recorded, whatever it was
	return h.run(ctx, e, rec, deadline, cause)
}

// unclaimed handles a message whose claim failed and reports whether it
// may be deleted.
func (h *Handler) unclaimed(ctx context.Context, m events.SQSMessage, msg enqueue.Message, now time.Time, err error) bool {
	var nc *ledger.NotClaimableError
	switch {
	case errors.As(err, &nc):
		return h.notClaimable(ctx, m, msg, nc.Current, now)
	case errors.Is(err, ledger.ErrNotFound):
		h.log.WarnContext(ctx, "nexjob: message for a job that is gone", "job_id", msg.ID, "kind", msg.Kind)
		return true
	case errors.Is(err, ledger.ErrBadID):
		return h.notAJob(ctx, m, err)
	}
	h.log.ErrorContext(ctx, "nexjob: claim failed", "job_id", msg.ID, "err", err)
	return false
}

// stillWaiting answers a dispatch guard's check: run tells whether the
// check message goes on to the claim. It does for a job waiting past its
// run time and never started (first: its claim marks the record
// ByCheck), and for a job that a check started before (ByCheck): that
// message is the job's only one, back after a retry whose send failed, a
// worker killed mid-run or between its result's write and the send, and it
// is handled as the job's own from then on (10k soaks, seeds
// 1796411833611391690 and 1796415236576371073: the check was deleted, and
// the job stayed Scheduled, or Processing, for good). One eventually
// consistent read; a stale answer costs at most a refused claim. A job
// that is gone is no error: there is nothing to run.
//
// A job never started and not yet due gives later, the unix-ms time the
// check is due again (GuardAfter past its run time): its run moved later
// after the guard sent the check (a debounce fold), and the check may be
// all that names it (its producer died before the send), so it must not
// vanish. Its own message, if any, runs it first and the check is
// dropped then.
func (h *Handler) stillWaiting(ctx context.Context, msg enqueue.Message, now time.Time) (run, first bool, later int64, err error) {
	rec, err := h.store.Peek(ctx, msg.ID)
	if errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrBadID) {
		return false, false, 0, nil
	}
	if err != nil {
		return false, false, 0, err
	}
	waiting := rec.State == ledger.Enqueued || rec.State == ledger.Scheduled && rec.RunAt <= now.UnixMilli()
	switch {
	case rec.ByCheck:
		return true, false, 0, nil
	case waiting && rec.Attempt == 0:
		h.log.WarnContext(ctx, "nexjob: job was never sent; the guard's check runs it", "job_id", rec.ID, "kind", rec.Kind)
		return true, true, 0, nil
	case rec.State == ledger.Scheduled && rec.Attempt == 0:
		return false, false, rec.RunAt + h.o.GuardAfter.Milliseconds(), nil
	}
	return false, false, 0, nil
}

// lease returns the claim's lease, the run's deadline and the cause its
// context ends with then. Under Lambda the run cannot outlive the
// invocation, so the lease ends just after it; a kind's Timeout ends the
// run (and the lease) sooner. now is the ledger's clock, which tests may
// shift; the run's deadline is real time.
func (h *Handler) lease(ctx context.Context, now time.Time, timeout time.Duration) (time.Duration, time.Time, error) {
	run, cause := h.o.Lease-finishMargin, error(nil)
	if dl, ok := ctx.Deadline(); ok {
		run, cause = time.Until(dl)-finishMargin, errCutOff
	}
	if timeout > 0 && timeout < run {
		run, cause = timeout, &TimeoutError{Timeout: timeout}
	}
	if cause == nil {
		cause = &TimeoutError{Timeout: run}
	}
	return run + finishMargin + leaseSlack, time.Now().Add(run), cause
}

var errCutOff = errors.New("nexjob: run cut off by the invocation deadline")

func (h *Handler) run(ctx context.Context, e *entry, rec ledger.Record, deadline time.Time, cause error) bool {
	span := trace.SpanFromContext(ctx) // process's consumer span; tracing off: the producer's, not recording here
	start := time.Now()
	ctx = withRun(ctx, h.log, rec, start) // the job's logger, for the worker and for what follows the run
	runCtx, cancel := context.WithDeadlineCause(ctx, deadline, cause)
	defer cancel()
	// A worker's error text is stored, logged and put on the span: capped
	// here as the ledger caps it, so no one error fills a log line (or
	// carries 8 KB of someone's data) where the record would not.
	err := redact.Capped(safeRun(runCtx, e, rec), ledger.MaxLastError)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "run failed")
	}
	if err == nil {
		h.runLog(ctx, slog.LevelInfo, "nexjob: job succeeded", rec, start)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Succeeded}, nil)
	}
	return h.runFailed(ctx, e, rec, runCtx, err, start)
}

// runFailed ends a run that returned err (or was cut off).
func (h *Handler) runFailed(ctx context.Context, e *entry, rec ledger.Record, runCtx context.Context, err error, start time.Time) bool {
	var perm *PermanentError
	switch {
	case errors.Is(context.Cause(runCtx), errCutOff) && rec.CutOffs+1 < h.o.MaxCutOffs:
		h.runLog(ctx, slog.LevelWarn, "nexjob: job cut off by the invocation deadline; attempt given back", rec, start, slog.Int("cut_offs", rec.CutOffs+1))
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Enqueued, CutOff: true, LastError: errCutOff.Error()}, nil)
	case errors.Is(context.Cause(runCtx), errCutOff):
		err = fmt.Errorf("%w %d times in a row; the attempt is spent (raise the function timeout or set KindOptions.Timeout)", errCutOff, rec.CutOffs+1)
	case context.Cause(runCtx) != nil && runCtx.Err() != nil && ctx.Err() == nil:
		err = redact.Capped(fmt.Errorf("%w: %w", context.Cause(runCtx), err), ledger.MaxLastError)
	case errors.As(err, &perm):
		h.runLog(ctx, slog.LevelWarn, "nexjob: job failed permanently", rec, start, slog.Any("err", err))
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: err.Error()}, err)
	}
	return h.failed(ctx, rec, err, e.backoff)
}

// runLog logs the end of a run with the job's id, kind, attempt and run
// time, building nothing when the level is off.
func (h *Handler) runLog(ctx context.Context, level slog.Level, msg string, rec ledger.Record, start time.Time, extra ...slog.Attr) {
	if !h.log.Enabled(ctx, level) {
		return
	}
	attrs := append(make([]slog.Attr, 0, 4+len(extra)), slog.String("job_id", rec.ID), slog.String("kind", rec.Kind),
		slog.Int("attempt", rec.Attempt), slog.Duration("took", time.Since(start)))
	h.log.LogAttrs(ctx, level, msg, append(attrs, extra...)...)
}

// failed ends a failed attempt: Failed once attempts are exhausted, else
// Scheduled after the backoff (or the worker's RetryAfter), never further
// ahead than the longest schedule.
func (h *Handler) failed(ctx context.Context, rec ledger.Record, err error, backoff func(int) time.Duration) bool {
	log := h.log.With("job_id", rec.ID, "kind", rec.Kind, "attempt", rec.Attempt)
	if rec.Attempt >= rec.MaxAttempts {
		log.WarnContext(ctx, "nexjob: job failed, attempts exhausted", "err", err)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: err.Error()}, err)
	}
	delay := backoff(rec.Attempt)
	var after *RetryAfterError
	if errors.As(err, &after) {
		delay = after.Delay
	}
	if delay > enqueue.MaxScheduleAhead || delay < 0 {
		log.WarnContext(ctx, "nexjob: retry delay out of range; clamped", "asked", delay)
		delay = max(0, min(delay, enqueue.MaxScheduleAhead))
	}
	log.InfoContext(ctx, "nexjob: job failed, will retry", "err", err, "retry_in", delay)
	return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: h.store.Now().Add(delay), LastError: err.Error()}, nil)
}

func safeRun(ctx context.Context, e *entry, rec ledger.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v}
		}
	}()
	return e.run(ctx, rec)
}

func (e *entry) backoff(attempt int) time.Duration {
	if e.opts.Backoff != nil {
		return e.opts.Backoff(attempt)
	}
	return DefaultBackoff(attempt)
}

// finish records the end of a run and does what follows it: re-dispatch a
// retry or a refunded run, release continuations, call the dead-letter
// hook of a Failed job with its cause, end the children of a Failed or
// Expired one as it ended. It reports whether the message may be deleted.
func (h *Handler) finish(ctx context.Context, rec ledger.Record, f ledger.Finish, cause error) bool {
	// One nonce for this logical write and its retries in record: this
	// writer's own, so another worker's finish of the same record (two
	// messages of an orphan) never reads as ours.
	f.Nonce = ledger.NewNonce()
	// The hook's due mark rides on the write that makes the job Failed:
	// a crash before the hook returns leaves it, and the message's next
	// delivery runs the hook (notClaimable).
	f.HookPending = f.State == ledger.Failed && h.hookOf(rec.Kind) != nil
	if f.HookPending {
		// This worker holds the hook until its invocation ends: a
		// duplicate delivery meanwhile leaves it alone (ClaimHook).
		f.HookLease, _, _ = h.lease(ctx, h.store.Now(), 0)
	}
	f.ExpiresAt = h.store.ExpiresAfter(h.retention(rec.Kind).For(f.State)) // zero for a state that is not an end
	if latest := h.store.Now().Add(enqueue.MaxScheduleAhead); f.RunAt.After(latest) {
		// No message may name a run beyond the longest schedule (the
		// worker takes one for a forgery): a later run time (a throttle
		// slot a year ahead) is reached in steps, each deferral coming
		// back to defer again.
		f.RunAt = latest
	}
	out, err := h.record(ctx, rec, f)
	if err == nil {
		h.measure(ctx, out, f, cause)
	}
	if errors.Is(err, ledger.ErrFenced) {
		h.log.WarnContext(ctx, "nexjob: result refused, a newer run owns the job", "job_id", rec.ID, "token", rec.Token)
		return true
	}
	if err != nil {
		h.log.ErrorContext(ctx, "nexjob: recording the result failed", "job_id", rec.ID, "err", err)
		return false // the message comes back; the lease decides what then
	}
	switch out.State {
	case ledger.Succeeded:
		if err := h.producer.ReleaseContinuations(ctx, out); err != nil {
			// The message comes back, finds the parent Succeeded and
			// releases again; released children are not released twice.
			h.log.ErrorContext(ctx, "nexjob: releasing continuations failed", "job_id", rec.ID, "err", err)
			return false
		}
	case ledger.Scheduled, ledger.Enqueued:
		if err := h.producer.Dispatch(ctx, out); err != nil {
			// The message comes back and finds the job Scheduled: it is
			// carried forward then.
			h.log.ErrorContext(ctx, "nexjob: re-dispatch failed", "job_id", rec.ID, "err", err)
			return false
		}
	case ledger.Failed:
		h.runHook(ctx, out, cause)
		return h.endChildren(ctx, out)
	case ledger.Expired:
		return h.endChildren(ctx, out)
	}
	return true
}

// outcomes names the metric of each state a run ends in.
var outcomes = map[ledger.State]string{ledger.Succeeded: metrics.Succeeded, ledger.Failed: metrics.Failed,
	ledger.Scheduled: metrics.Retried, ledger.Expired: metrics.Expired, ledger.Enqueued: metrics.CutOff}

// measure records the run's outcome (and, after a run, its duration).
func (h *Handler) measure(ctx context.Context, out ledger.Record, f ledger.Finish, cause error) {
	if h.o.Metrics == nil {
		return
	}
	outcome := outcomes[out.State]
	if f.Deferred {
		outcome = metrics.Deferred
	}
	if start, ok := runStart(ctx); ok {
		h.o.Metrics.Run(outcome, out.Kind, out.ID, time.Since(start))
	} else {
		h.o.Metrics.Count(outcome, out.Kind, out.ID)
	}
	if errors.Is(cause, ErrOrphaned) {
		h.o.Metrics.Count(metrics.Orphaned, out.Kind, out.ID)
	}
}

// record writes the end of a run. A write that fails for a passing reason
// (throttled past the SDK's retries, a timeout, a 500) is tried again,
// with backoff, while the run's lease lasts: the job ran, and letting its
// message come back would run it again or call it an orphan. The retry is
// safe: Finish recognises its own earlier write.
func (h *Handler) record(ctx context.Context, rec ledger.Record, f ledger.Finish) (ledger.Record, error) {
	var out ledger.Record
	err := h.retrying(ctx, rec.LeaseUntil, "recording the result", rec.ID, func() (err error) {
		out, err = h.store.Finish(ctx, rec, f)
		return err
	})
	return out, err
}

// retrying calls write until it succeeds or fails for a reason that is
// not passing (see transient), with backoff (100 ms doubling to 2 s),
// while the lease ending at until (unix ms, on the ledger's clock) and the
// context last. Each write it retries must recognise its own earlier try.
func (h *Handler) retrying(ctx context.Context, until int64, what, id string, write func() error) error {
	// The lease is on the ledger's clock; wait in real time.
	end := time.Now().Add(ledger.Millis(until).Sub(h.store.Now()))
	if dl, ok := ctx.Deadline(); ok && dl.Before(end) {
		end = dl
	}
	wait := 100 * time.Millisecond
	for {
		err := write()
		if err == nil || !transient(err) || time.Now().Add(wait).After(end) {
			return err
		}
		h.log.WarnContext(ctx, "nexjob: "+what+" failed; trying again", "job_id", id, "err", err, "in", wait)
		if sleepCtx(ctx, wait) != nil {
			return err
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// endChildren ends the continuations still waiting on a Failed or Expired
// parent as it ended (its dead-letter hook ran first and may have released
// some), and hands the ending on to theirs (CancelContinuations sends an
// ended child with children its message, which comes back here: one level
// per message). On failure the message comes back, finds the parent ended
// and ends them then.
func (h *Handler) endChildren(ctx context.Context, parent ledger.Record) bool {
	if len(parent.Children) == 0 {
		return true
	}
	ret := h.retention(parent.Kind).Failed
	if parent.State == ledger.Expired {
		ret = h.retention(parent.Kind).Expired
	}
	if err := h.producer.CancelContinuations(ctx, parent, "", ret); err != nil {
		h.log.ErrorContext(ctx, "nexjob: ending the continuations of an ended job failed", "job_id", parent.ID, "err", err)
		return false
	}
	return true
}

// retention is the kind's own (KindOptions.Retention) or the handler's.
func (h *Handler) retention(kind string) Retention {
	if e, ok := h.reg.lookup(kind); ok && e.opts.Retention != nil {
		return *e.opts.Retention
	}
	return *h.o.Retention
}

// deadLetter calls the kind's hook (or the handler's) once; its failure or
// panic is logged.
// hookOf is the dead-letter hook of kind: its own, else Options'.
func (h *Handler) hookOf(kind string) func(context.Context, ledger.Record, error) error {
	if e, ok := h.reg.lookup(kind); ok && e.opts.OnDeadLetter != nil {
		return e.opts.OnDeadLetter
	}
	return h.o.OnDeadLetter
}

// takeOverHook runs the due hook of the Failed job rec that another
// worker left (ClaimHook), shown rec. Not ok: the hook is not this
// worker's to run now; heldUntil (unix ms) is when to look again, 0 when
// it ran already or the claim failed (a throttle: the message's next
// delivery tries again).
func (h *Handler) takeOverHook(ctx context.Context, rec ledger.Record) (heldUntil int64, ok bool) {
	lease, _, _ := h.lease(ctx, h.store.Now(), 0)
	cur, ok, err := h.store.ClaimHook(ctx, rec, lease)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return 0, true // gone: no hook is due any more
	case err != nil:
		h.log.ErrorContext(ctx, "nexjob: taking over the dead-letter hook failed", "job_id", rec.ID, "err", err)
		return 0, false
	case !ok && cur.HookPending:
		return cur.HookUntil, false
	case !ok:
		return 0, true // it ran
	}
	h.log.WarnContext(ctx, "nexjob: dead-letter hook still due; running it", "job_id", rec.ID, "kind", rec.Kind)
	rec.HookPending, rec.HookUntil = true, cur.HookUntil
	h.runHook(ctx, rec, nil)
	return 0, true
}

// runHook calls rec's dead-letter hook and then, if the record marks it
// due, clears the mark. A crash between the two runs the hook again on the
// next delivery: at least once, once unless a crash comes in between.
func (h *Handler) runHook(ctx context.Context, rec ledger.Record, cause error) {
	if !rec.HookPending {
		h.deadLetter(ctx, rec, cause)
		return
	}
	stop := h.holdHook(ctx, rec)
	h.deadLetter(ctx, rec, cause)
	stop()
	// Retried while this worker holds the hook (10k soak, seed
	// 1796415236576371073: one throttled clear, and the next delivery ran
	// the hook again). HookDone of a cleared mark is no error.
	until := rec.HookUntil
	if until == 0 {
		until = h.store.Now().Add(5 * time.Second).UnixMilli()
	}
	if err := h.retrying(ctx, until, "clearing the dead-letter hook's mark", rec.ID, func() error { return h.store.HookDone(ctx, rec) }); err != nil {
		// The hook ran; the mark stays, and a later delivery of this
		// job's message (if any) would run it again.
		h.log.WarnContext(ctx, "nexjob: clearing the dead-letter hook's mark failed", "job_id", rec.ID, "err", err)
	}
}

func (h *Handler) deadLetter(ctx context.Context, rec ledger.Record, cause error) {
	hook := h.hookOf(rec.Kind)
	if hook == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			h.log.ErrorContext(ctx, "nexjob: dead-letter hook panicked", "job_id", rec.ID, "panic", fmt.Sprint(v))
		}
	}()
	if cause == nil {
		cause = errors.New(rec.LastError)
	}
	if err := hook(ctx, rec, cause); err != nil {
		h.log.ErrorContext(ctx, "nexjob: dead-letter hook failed", "job_id", rec.ID, "err", err)
	}
}

// notClaimable decides the fate of a message whose job may not run now.
func (h *Handler) notClaimable(ctx context.Context, m events.SQSMessage, msg enqueue.Message, cur ledger.Record, now time.Time) bool {
	if cur.State == ledger.Failed && cur.HookPending {
		// The worker that failed it died before its hook returned, or is
		// running it now: then look again when its lease on the hook ends.
		if held, ok := h.takeOverHook(ctx, cur); !ok {
			if held > 0 {
				h.comeBackAt(ctx, m, held, cur.ID, now)
			}
			return false
		}
	}
	switch {
	case cur.State == ledger.Succeeded && len(cur.Children) > 0:
		// A replay after a crash between the parent's completion and its
		// children's release: release again (idempotent).
		if err := h.producer.ReleaseContinuations(ctx, cur); err != nil {
			h.log.ErrorContext(ctx, "nexjob: releasing continuations failed", "job_id", cur.ID, "err", err)
			return false
		}
		return true
	case (cur.State == ledger.Failed || cur.State == ledger.Expired) && len(cur.Children) > 0:
		// A replay after a failure to end the children of an ended job,
		// or the message that hands a parent's ending down to the
		// continuations of the child it ended (CancelContinuations).
		return h.endChildren(ctx, cur)
	case cur.State.Terminal() || cur.State == ledger.AwaitingContinuation:
		return true // a duplicate delivery, or the parent will dispatch it
	case cur.State == ledger.Scheduled && cur.RunAt > now.UnixMilli():
		msg.RunAt = cur.RunAt
		return h.carryForward(ctx, msg, now)
	case cur.State == ledger.Processing && cur.LeaseUntil > now.UnixMilli():
		// Running elsewhere: look again when the lease ends.
		h.comeBackAt(ctx, m, cur.LeaseUntil, cur.ID, now)
		return false
	case cur.Attempt >= cur.MaxAttempts:
		// The last attempt's worker died (a live lease returned above): an
		// orphan out of attempts.
		cause := fmt.Errorf("%w; no attempts are left", ErrOrphaned)
		return h.finish(ctx, cur, ledger.Finish{State: ledger.Failed, LastError: cause.Error()}, cause)
	}
	h.log.WarnContext(ctx, "nexjob: job not claimable", "job_id", cur.ID, "state", cur.State)
	return false
}

// comeBackAt makes m visible again just after the unix-ms time at; a
// failure only leaves the queue's own visibility timeout.
func (h *Handler) comeBackAt(ctx context.Context, m events.SQSMessage, at int64, id string, now time.Time) {
	secs := int32(ledger.Millis(at).Sub(now)/time.Second) + 1
	_, err := h.sqs.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(h.sourceQueue(m)), ReceiptHandle: aws.String(m.ReceiptHandle), VisibilityTimeout: min(max(secs, 0), 43200),
	})
	if err != nil {
		h.log.WarnContext(ctx, "nexjob: change visibility failed", "job_id", id, "err", err)
	}
}

// sourceQueue is the URL of the queue m was received from, which its
// receipt handle belongs to: the job queue or a named queue, matched by
// the event's source ARN (the queue's name is its last field) or, from the
// local poller, its URL. A source matching none is taken as the job
// queue.
func (h *Handler) sourceQueue(m events.SQSMessage) string {
	src := m.EventSourceARN
	name := src[strings.LastIndexByte(src, ':')+1:]
	for _, url := range h.o.Queues {
		if url == src || url[strings.LastIndexByte(url, '/')+1:] == name {
			return url
		}
	}
	return h.queueURL
}

// notAJob keeps a message that is not a job: in the DLQ with the reason
// when one is configured, else back to SQS for the redrive policy.
func (h *Handler) notAJob(ctx context.Context, m events.SQSMessage, why error) bool {
	h.log.ErrorContext(ctx, "nexjob: message is not a job", "message_id", m.MessageId, "err", why)
	if h.o.DLQURL == "" {
		return false
	}
	_, err := h.sqs.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:    aws.String(h.o.DLQURL),
		MessageBody: aws.String(m.Body),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"nexjob-reason":     {DataType: aws.String("String"), StringValue: aws.String(why.Error())},
			"nexjob-message-id": {DataType: aws.String("String"), StringValue: aws.String(m.MessageId)},
		},
	})
	if err != nil {
		h.log.ErrorContext(ctx, "nexjob: could not move the message to the DLQ", "message_id", m.MessageId, "err", err)
		return false
	}
	return true
}
