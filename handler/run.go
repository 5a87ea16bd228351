package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

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
	if rec.ReopenWaits && len(rec.TimedOutWaits()) > 0 {
		// A requeue asked this run to wait afresh where the job's waits
		// timed out: the worker's write (an operator may not write steps).
		// With none, the run's end removes the mark (no request of its own).
		out, err := h.store.ReopenTimedOutWaits(ctx, rec)
		if err != nil {
			h.log.WarnContext(ctx, "nexjob: opening a requeued job's timed-out waits failed; its run is put off, no attempt spent", "job_id", rec.ID, "err", err)
			return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: h.store.Now().Add(minConcurrencyBackoff), Deferred: true}, nil)
		}
		rec = out
	}
	start := time.Now()
	ctx = withRun(ctx, h.log, rec, start) // the job's logger, for the worker and for what follows the run
	runOf(ctx).began = h.store.Now()
	if rec.CancelReq != "" && !rec.Compensable {
		// An operator asked the job to stop while a run of it went on, and
		// that run ended without meeting a step's record (a replay that
		// slept again, a retry): this run stops it before any of its code
		// (a compensable job runs its compensations instead: stopping).
		cause := fmt.Errorf("%w: %s", ledger.ErrCancelRequested, rec.CancelReq)
		h.runLog(ctx, slog.LevelWarn, "nexjob: job cancelled by an operator while it ran; stopped before its next run", rec, start)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: cause.Error(), Cancelled: true}, cause)
	}
	runOf(ctx).steps = &steps{store: h.store, rec: rec, looked: h.store.Now()}
	if h.o.TracerProvider != nil {
		runOf(ctx).steps.tracer = h.tracer
	}
	runCtx, cancel := context.WithDeadlineCause(ctx, deadline, cause)
	defer cancel()
	if len(e.opts.Patches) > 0 {
		if err := runOf(ctx).steps.settlePatches(ctx, e.opts.Patches); err != nil {
			// Before any of the worker's code: the run fails as a step's
			// record would fail it (a throttle is retried).
			return h.runFailed(ctx, e, rec, runCtx, err, start)
		}
	}
	// A worker's error text is stored, logged and put on the span: capped
	// here as the ledger caps it, so no one error fills a log line (or
	// carries 8 KB of someone's data) where the record would not.
	runRec := rec
	if rec.ArgsBlob != "" {
		// Args over a record's room: read from the blob bucket (one
		// GetObject; an object a year old is written again). A failure is
		// the run's, retried: nothing is invented.
		args, err := h.store.ArgsOf(ctx, rec, true)
		if err != nil {
			return h.runFailed(ctx, e, rec, runCtx, err, start)
		}
		runRec.Args = args
	}
	result, err := safeRun(runCtx, e, runRec)
	if p := runOf(ctx).steps.pending(); p != nil && !errors.As(err, new(*sleepError)) {
		// The worker met a sleep or a wait and did not return its error:
		// the run ends in it all the same. What came after it (a success,
		// or a failure of going on with a zero payload) is not the job's
		// run: it runs again when the sleep ends.
		h.log.WarnContext(ctx, "nexjob: the worker went on past a sleep or a wait without returning its error; the job sleeps as it asked (return the error of Sleep and WaitForSignal)", "job_id", rec.ID, "kind", rec.Kind, "step", p.name)
		err, result = p, ""
	}
	if s := runOf(ctx).steps; err == nil && s.stopped {
		// Asked to stop and compensate, it refused something new and
		// the worker went on to return nil: it stopped all the same.
		err = s.stopRefusal()
	}
	err = redact.Capped(err, ledger.MaxLastError)
	var sleep *sleepError
	if err != nil && !errors.As(err, &sleep) {
		span.RecordError(err)
		span.SetStatus(codes.Error, "run failed")
	}
	if err == nil {
		h.runLog(ctx, slog.LevelInfo, "nexjob: job succeeded", rec, start)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Succeeded, Result: result}, nil)
	}
	return h.runFailed(ctx, e, rec, runCtx, err, start)
}

// runFailed ends a run that returned err (or was cut off).
func (h *Handler) runFailed(ctx context.Context, e *entry, rec ledger.Record, runCtx context.Context, err error, start time.Time) bool {
	var perm *PermanentError
	var sleep *sleepError
	switch {
	case errors.As(err, &sleep):
		// Not a failure: the job sleeps until its time, no attempt spent.
		attrs := []slog.Attr{slog.Time("until", sleep.until)}
		if len(sleep.signals) > 0 {
			attrs = append(attrs, slog.Any("signals", sleep.signals)) // the names it waits for (never a payload)
		}
		h.runLog(ctx, slog.LevelInfo, "nexjob: job sleeping", rec, start, attrs...)
		done := h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: sleep.until, Deferred: true, AwaitChildren: sleep.children}, nil)
		if done && len(sleep.signals) > 0 {
			return h.signalledMeanwhile(ctx, rec.ID, sleep.signals) // not done: the message comes back and wakes it
		}
		if done && sleep.children {
			return h.childrenEndedMeanwhile(ctx, rec)
		}
		return done
	case errors.Is(context.Cause(runCtx), errCutOff) && rec.CutOffs+1 < h.o.MaxCutOffs:
		h.runLog(ctx, slog.LevelWarn, "nexjob: job cut off by the invocation deadline; attempt given back", rec, start, slog.Int("cut_offs", rec.CutOffs+1))
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Enqueued, CutOff: true, LastError: errCutOff.Error()}, nil)
	case errors.Is(context.Cause(runCtx), errCutOff):
		err = fmt.Errorf("%w %d times in a row; the attempt is spent (raise the function timeout or set KindOptions.Timeout)", errCutOff, rec.CutOffs+1)
	case context.Cause(runCtx) != nil && runCtx.Err() != nil && ctx.Err() == nil:
		err = redact.Capped(fmt.Errorf("%w: %w", context.Cause(runCtx), err), ledger.MaxLastError)
	case errors.As(err, &perm):
		h.runLog(ctx, slog.LevelWarn, "nexjob: job failed permanently", rec, start, slog.Any("err", err))
		// An operator's cancel, seen at the next step's record, is marked
		// as every cancel is (Record.Cancelled). The compensations
		// declared so far run first.
		// The operator reads what failed, not how the package classed it.
		last := h.compensate(ctx, rec, strings.TrimPrefix(err.Error(), "permanent: "))
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: last, Cancelled: errors.Is(err, ledger.ErrCancelRequested)}, err)
	}
	return h.failed(ctx, rec, err, h.backoffOf(e))
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
		// The operator reads what failed, not how the package classed it.
		last := h.compensate(ctx, rec, strings.TrimPrefix(err.Error(), "permanent: ")) // the compensations its run declared, if it ran
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: last}, err)
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

func safeRun(ctx context.Context, e *entry, rec ledger.Record) (result string, err error) {
	defer func() {
		if v := recover(); v != nil {
			result, err = "", &PanicError{Value: v}
		}
	}()
	return e.run(ctx, rec)
}

// backoffOf is e's retry backoff: its kind's, else Options.Backoff.
func (h *Handler) backoffOf(e *entry) func(int) time.Duration {
	if e.opts.Backoff != nil {
		return e.opts.Backoff
	}
	return h.o.Backoff
}
