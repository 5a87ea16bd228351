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
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// SQS is the part of *sqs.Client the handler uses.
type SQS interface {
	enqueue.SQS
	ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// Retention is how long terminal records are kept (the TTL written on the
// terminal write). Zero keeps a record forever.
type Retention struct {
	Succeeded, Failed, Expired time.Duration
}

// DefaultRetention is NexJob's: 7 days, 30 days, 7 days.
var DefaultRetention = Retention{Succeeded: 7 * 24 * time.Hour, Failed: 30 * 24 * time.Hour, Expired: 7 * 24 * time.Hour}

// Defaults of Options.
const (
	DefaultConcurrency = 10
	DefaultLease       = 5 * time.Minute
	DefaultStopBefore  = 10 * time.Second
	// finishMargin is kept back from a run's deadline to record its result.
	finishMargin = 2 * time.Second
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
	if o.StopBefore <= 0 {
		o.StopBefore = DefaultStopBefore
	}
	if o.Retention == nil {
		o.Retention = &DefaultRetention
	}
	p, err := enqueue.New(cfg, table, queueURL, &enqueue.ClientOptions{
		DynamoDB: o.DynamoDB, SQS: o.SQS, Ledger: o.Ledger, Logger: o.Logger, MaxDelay: o.MaxDelay,
	})
	if err != nil {
		return nil, err
	}
	return &Handler{reg: reg, store: p.Store(), producer: p, sqs: o.SQS, queueURL: queueURL, o: o, log: o.Logger}, nil
}

// Producer returns the enqueue client the handler dispatches with.
func (h *Handler) Producer() *enqueue.Client { return h.producer }

// Handle runs one SQS batch: the jobs run concurrently (bounded by
// Concurrency), and the response lists exactly the messages that must come
// back. It never returns an error: a failure is per message.
func (h *Handler) Handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var (
		resp events.SQSEventResponse
		mu   sync.Mutex
		wg   sync.WaitGroup
		sem  = make(chan struct{}, h.o.Concurrency)
		stop = h.o.StopBefore
	)
	if dl, ok := ctx.Deadline(); ok {
		stop = min(stop, time.Until(dl)/3)
	}
	for _, m := range ev.Records {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if h.process(ctx, m, stop) {
				return
			}
			mu.Lock()
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
			mu.Unlock()
		})
	}
	wg.Wait()
	return resp, nil
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
	now := h.store.Now()
	if ledger.Millis(msg.RunAt).After(now.Add(enqueue.MaxScheduleAhead + time.Hour)) {
		return h.notAJob(ctx, m, fmt.Errorf("%w: runAt beyond the longest schedule", enqueue.ErrMalformedMessage))
	}
	if msg.RunAt > now.UnixMilli() {
		return h.carryForward(ctx, msg, now)
	}
	if msg.Check && !h.neverStarted(ctx, msg, now) {
		return true // the job's own message did its work
	}
	lease, deadline := h.lease(ctx, now)
	rec, err := h.store.Claim(ctx, msg.ID, lease)
	var nc *ledger.NotClaimableError
	switch {
	case errors.As(err, &nc):
		return h.notClaimable(ctx, m, msg, nc.Current, now)
	case errors.Is(err, ledger.ErrNotFound):
		h.log.WarnContext(ctx, "nexjob: message for a job that is gone", "job_id", msg.ID, "kind", msg.Kind)
		return true
	case errors.Is(err, ledger.ErrBadID):
		return h.notAJob(ctx, m, err)
	case err != nil:
		h.log.ErrorContext(ctx, "nexjob: claim failed", "job_id", msg.ID, "err", err)
		return false
	}
	if rec.Attempt == 1 && rec.Deadline != 0 && now.UnixMilli() > rec.Deadline {
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Expired, LastError: "deadline passed before the job started"}, nil)
	}
	e, ok := h.reg.lookup(rec.Kind)
	if !ok {
		cause := fmt.Errorf("%w: %q", ErrUnknownKind, rec.Kind)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: cause.Error()}, cause)
	}
	return h.run(ctx, e, rec, deadline)
}

// neverStarted answers a dispatch guard's check: is the job still waiting,
// unstarted, past its run time? One eventually consistent read; a stale
// answer costs at most a refused claim.
func (h *Handler) neverStarted(ctx context.Context, msg enqueue.Message, now time.Time) bool {
	rec, err := h.store.Peek(ctx, msg.ID)
	if err != nil {
		return false
	}
	waiting := rec.State == ledger.Enqueued || rec.State == ledger.Scheduled && rec.RunAt <= now.UnixMilli()
	if waiting && rec.Attempt == 0 {
		h.log.WarnContext(ctx, "nexjob: job was never sent; the guard's check runs it", "job_id", rec.ID, "kind", rec.Kind)
		return true
	}
	return false
}

// lease returns the claim's lease and the run's deadline. Under Lambda the
// run cannot outlive the invocation, so the lease ends just after it.
func (h *Handler) lease(ctx context.Context, now time.Time) (time.Duration, time.Time) {
	if dl, ok := ctx.Deadline(); ok {
		return dl.Sub(now) + 5*time.Second, dl.Add(-finishMargin)
	}
	return h.o.Lease, now.Add(h.o.Lease - finishMargin)
}

var errCutOff = errors.New("nexjob: run cut off by the invocation deadline")

func (h *Handler) run(ctx context.Context, e *entry, rec ledger.Record, deadline time.Time) bool {
	runCtx, cancel := context.WithDeadlineCause(ctx, deadline, errCutOff)
	defer cancel()
	start := time.Now()
	err := safeRun(runCtx, e, rec)
	log := h.log.With("job_id", rec.ID, "kind", rec.Kind, "attempt", rec.Attempt, "took", time.Since(start))
	var perm *PermanentError
	var after *RetryAfterError
	switch {
	case err == nil:
		log.InfoContext(ctx, "nexjob: job succeeded")
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Succeeded}, nil)
	case errors.Is(context.Cause(runCtx), errCutOff):
		log.WarnContext(ctx, "nexjob: job cut off by the deadline; attempt refunded")
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Enqueued, Refund: true, LastError: errCutOff.Error()}, nil)
	case errors.As(err, &perm):
		log.WarnContext(ctx, "nexjob: job failed permanently", "err", err)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: err.Error()}, err)
	case rec.Attempt >= rec.MaxAttempts:
		log.WarnContext(ctx, "nexjob: job failed, attempts exhausted", "err", err)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: err.Error()}, err)
	}
	delay := e.backoff(rec.Attempt)
	if errors.As(err, &after) {
		delay = after.Delay
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
// hook of a Failed job with its cause.
func (h *Handler) finish(ctx context.Context, rec ledger.Record, f ledger.Finish, cause error) bool {
	switch f.State {
	case ledger.Succeeded:
		f.ExpiresAt = h.expiry(h.o.Retention.Succeeded)
	case ledger.Failed:
		f.ExpiresAt = h.expiry(h.o.Retention.Failed)
	case ledger.Expired:
		f.ExpiresAt = h.expiry(h.o.Retention.Expired)
	}
	out, err := h.store.Finish(ctx, rec, f)
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
		h.deadLetter(ctx, out, cause)
	}
	return true
}

func (h *Handler) expiry(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return h.store.Now().Add(d)
}

// deadLetter calls the kind's hook once; its failure or panic is logged.
func (h *Handler) deadLetter(ctx context.Context, rec ledger.Record, cause error) {
	e, ok := h.reg.lookup(rec.Kind)
	if !ok || e.opts.OnDeadLetter == nil {
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
	if err := e.opts.OnDeadLetter(ctx, rec, cause); err != nil {
		h.log.ErrorContext(ctx, "nexjob: dead-letter hook failed", "job_id", rec.ID, "err", err)
	}
}

// carryForward re-sends a message whose job is not due yet, for at most
// SQS's 900 s; no DynamoDB request.
func (h *Handler) carryForward(ctx context.Context, msg enqueue.Message, now time.Time) bool {
	if err := h.producer.Send(ctx, msg, ledger.Millis(msg.RunAt).Sub(now)); err != nil {
		h.log.ErrorContext(ctx, "nexjob: carry forward failed", "job_id", msg.ID, "err", err)
		return false
	}
	return true
}

// notClaimable decides the fate of a message whose job may not run now.
func (h *Handler) notClaimable(ctx context.Context, m events.SQSMessage, msg enqueue.Message, cur ledger.Record, now time.Time) bool {
	switch {
	case cur.State == ledger.Succeeded && len(cur.Children) > 0:
		// A replay after a crash between the parent's completion and its
		// children's release: release again (idempotent).
		if err := h.producer.ReleaseContinuations(ctx, cur); err != nil {
			h.log.ErrorContext(ctx, "nexjob: releasing continuations failed", "job_id", cur.ID, "err", err)
			return false
		}
		return true
	case cur.State.Terminal() || cur.State == ledger.AwaitingContinuation:
		return true // a duplicate delivery, or the parent will dispatch it
	case cur.State == ledger.Scheduled && cur.RunAt > now.UnixMilli():
		msg.RunAt = cur.RunAt
		return h.carryForward(ctx, msg, now)
	case cur.State == ledger.Processing && cur.LeaseUntil > now.UnixMilli():
		// Running elsewhere: look again when the lease ends.
		secs := int32(ledger.Millis(cur.LeaseUntil).Sub(now)/time.Second) + 1
		_, err := h.sqs.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(h.queueURL), ReceiptHandle: aws.String(m.ReceiptHandle), VisibilityTimeout: min(secs, 43200),
		})
		if err != nil {
			h.log.WarnContext(ctx, "nexjob: change visibility failed", "job_id", cur.ID, "err", err)
		}
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
