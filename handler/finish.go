package handler

import (
	"context"
	"errors"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// finish records the end of a run and does what follows it: re-dispatch a
// retry or a refunded run, release continuations, call the dead-letter
// hook of a Failed job with its cause, end the children of a Failed or
// Expired one as it ended. It reports whether the message may be deleted.
func (h *Handler) finish(ctx context.Context, rec ledger.Record, f ledger.Finish, cause error) bool {
	if f.State == ledger.Failed && !h.earlierHookRan(ctx, rec) {
		return false // the message comes back; the earlier hook first
	}
	// One nonce for this logical write and its retries in record: this
	// writer's own, so another worker's finish of the same record (two
	// messages of an orphan) never reads as ours.
	f.Nonce = ledger.NewNonce()
	if r := runOf(ctx); r != nil && r.steps.ran() {
		f.Ran = true // its steps are in the steps table: the record must show it ran
	}
	// The hook's due mark rides on the write that makes the job Failed:
	// a crash before the hook returns leaves it, and the message's next
	// delivery runs the hook (notClaimable).
	f.HookPending = f.State == ledger.Failed && h.hookOf(rec.Kind) != nil
	if f.HookPending {
		// This worker holds the hook until its invocation ends: a
		// duplicate delivery meanwhile leaves it alone (ClaimHook).
		f.HookLease, _, _ = h.lease(ctx, h.store.Now(), 0)
	}
	if r := runOf(ctx); r != nil && f.State.Terminal() {
		// The run's start on the store's clock: an ended job's RunAt, what
		// the dashboard's run times read from the index.
		f.Began = r.began
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
		return h.settleFenced(ctx, rec.ID)
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
		cleared := h.runHook(ctx, out, cause)
		ended := h.endChildren(ctx, out)
		told := h.childFollowUps(ctx, out)
		return cleared && ended && told // a mark not cleared: the message comes back to clear it
	case ledger.Expired:
		ended := h.endChildren(ctx, out)
		return h.childFollowUps(ctx, out) && ended
	}
	if out.State == ledger.Succeeded {
		return h.childFollowUps(ctx, out)
	}
	return true
}

// childFollowUps does what an ended job owes its family of child jobs:
// a child's end recorded with its caller (which it wakes), and a
// cancelled job's unfinished children cancelled. false when either
// failed: the message comes back, and the ended job's next delivery does
// them again (notClaimable; both add nothing twice).
func (h *Handler) childFollowUps(ctx context.Context, out ledger.Record) bool {
	ok := true
	if out.Caller != "" {
		if err := h.producer.ChildEnded(ctx, out); err != nil {
			h.log.ErrorContext(ctx, "nexjob: telling a child's caller of its end failed; it is tried again", "job_id", out.ID, "caller", out.Caller, "err", err)
			ok = false
		}
	}
	if out.Cancelled {
		if err := h.producer.CancelChildren(ctx, out, h.retention(out.Kind).For(ledger.Failed)); err != nil {
			h.log.ErrorContext(ctx, "nexjob: cancelling a cancelled job's children failed; it is tried again", "job_id", out.ID, "err", err)
			ok = false
		}
	}
	return ok
}

// earlierHookRan runs the dead-letter hook still due on rec from an
// earlier failure (its worker died before the hook, and an operator
// requeued the job) before a new failure's Failed write takes the mark
// over: one hook per failure. The claim does it before a run; this is
// for failures with no run between (an orphan out of attempts, a dead
// letter): the 10k soak, seed 1796535410351433258, failed a requeued job
// whose claims never ran as an orphan, and one hook ran for the two
// failures. It reports false when that hook is held elsewhere or could
// not be taken over: fail the job later.
func (h *Handler) earlierHookRan(ctx context.Context, rec ledger.Record) bool {
	if !rec.HookPending || rec.State == ledger.Failed {
		return true
	}
	failed := rec
	failed.State = ledger.Failed // shown as it failed, as the claim does
	_, ok := h.takeOverHook(ctx, failed)
	return ok
}

// settleFenced follows a refused result: the job was ended by someone
// else (an operator's Cancel or Delete ended it while this run went on,
// or a newer run ended it). Its message is this run's, and deleting it
// must not leave its waiting continuations to no one: an operator's
// Delete that ended the job and then failed before settling them left a
// child waiting for ever (10k soak, seed 1796502170212235855). So the
// job is read (the fenced path only) and its children released or ended
// as its end says; a failure keeps the message, to try again.
func (h *Handler) settleFenced(ctx context.Context, id string) bool {
	cur, err := h.store.Get(ctx, id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return true
	case err != nil:
		h.log.ErrorContext(ctx, "nexjob: reading a job ended elsewhere failed", "job_id", id, "err", err)
		return false
	}
	return h.settleChildren(ctx, cur)
}

// settleChildren does for the waiting continuations of an ended job what
// its end says: released after a success, ended after a failure or an
// expiry (each idempotent). It reports whether that is done; on failure
// the message that brought the job here is kept, to try again. Every
// path that meets an ended job with children applies it: a replayed
// message (notClaimable), a refused result (settleFenced), a dead letter
// (the 10k soak, seed 1796502170212235855: a parent's release failed, its
// message went to the DLQ, and the consumer dropped it with a fan-in
// child left waiting for ever).
func (h *Handler) settleChildren(ctx context.Context, cur ledger.Record) bool {
	switch {
	case len(cur.Children) == 0:
		return true
	case cur.State == ledger.Succeeded:
		if err := h.producer.ReleaseContinuations(ctx, cur); err != nil {
			h.log.ErrorContext(ctx, "nexjob: releasing continuations failed", "job_id", cur.ID, "err", err)
			return false
		}
	case cur.State == ledger.Failed || cur.State == ledger.Expired:
		return h.endChildren(ctx, cur)
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
