package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
)

// DeadLetterKind is the kind of the ledger records that keep messages that
// were not jobs (malformed bodies, unknown ids): state Failed, args
// {"messageId", "body", "reason"}, listed with the other Failed jobs. They
// cannot be requeued (ledger.ErrDeadLetterRecord).
const DeadLetterKind = ledger.DeadLetterKind

// maxKeptBody bounds the body kept in a dead-letter record (the item limit
// is 400 KB).
const maxKeptBody = 300 * 1024

// HandleDeadLetters is the handler of the DLQ consumer function. What it
// does with a job's message depends on the job's record, read once:
//
//   - Processing with its lease run out and no attempts left: the worker
//     never reported a result (it crashed or timed out every time). The
//     job becomes Failed with that reason, once; its dead-letter hook runs
//     with a cause matching ErrOrphaned.
//   - Processing under a live lease: a run is going on and will record its
//     result; the message comes back (a failure) and is looked at again.
//   - Enqueued, Scheduled, or Processing with its lease run out and
//     attempts left: the ledger says it is not poison (receives are spent
//     by more than runs: claims that failed, receives too near the end of
//     an invocation, processes killed before their claim). The job is sent
//     back, the reason kept in its LastError, up to Options.MaxReturns
//     times (one dead letter counts once, however often it is delivered);
//     then it becomes Failed saying so, and its hook runs with a cause
//     matching ErrNeverStarted (ErrOrphaned if a run had started).
//   - Failed or Expired with continuations: they are ended (again), as
//     the worker ends them, down the tree.
//   - ended, or waiting on its parent: a duplicate; dropped.
//
// A message that is not a job (or names no job in the ledger) is kept as a
// DeadLetterKind record with the reason. Nothing is dropped: a message
// whose fate cannot be written is returned as a failure and stays in the
// DLQ. Every write is conditional on the record as read, so a job that
// moved on meanwhile is left to what moved it. With less than StopBefore
// (a third of the invocation's time, at most) left before the deadline,
// no dead letter is taken up: the rest of the batch comes back.
func (h *Handler) HandleDeadLetters(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	ctx = context.WithValue(ctx, clientKey{}, h.producer)
	var resp events.SQSEventResponse
	stop := h.stopBefore(ctx)
	for _, m := range ev.Records {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < stop {
			// Too near the invocation's end to start another (its
			// requests would be cut, or run past the deadline, when
			// Lambda ends the invocation and deletes nothing): it comes
			// back, untouched, as the worker leaves its messages.
			h.log.WarnContext(ctx, "nexjob: invocation nearly over, dead letter left for redelivery", "message_id", m.MessageId, "left", time.Until(dl))
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
			continue
		}
		if err := h.deadLetterOne(ctx, m); err != nil {
			h.log.ErrorContext(ctx, "nexjob: dead letter not recorded", "message_id", m.MessageId, "err", err)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
		}
	}
	return resp, nil
}

var errHookGoingOn = errors.New("nexjob: the job's dead-letter hook is running elsewhere (or could not be taken over); its dead letter is looked at again later")

var errRunGoingOn = errors.New("nexjob: the job is running under a live lease; its dead letter is looked at again later")

func (h *Handler) deadLetterOne(ctx context.Context, m events.SQSMessage) error {
	msg, err := enqueue.DecodeMessage(m.Body)
	if err != nil {
		return h.keepNonJob(ctx, m, err.Error())
	}
	rec, err := h.store.Get(ctx, msg.ID)
	switch {
	case errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrBadID):
		return h.keepNonJob(ctx, m, fmt.Sprintf("no job %s in the ledger", msg.ID))
	case err != nil:
		return err
	}
	if rec.State == ledger.Failed && rec.HookPending {
		if _, ok := h.takeOverHook(ctx, rec); !ok {
			return errHookGoingOn
		}
	}
	receives := m.Attributes["ApproximateReceiveCount"]
	now := h.store.Now()
	switch {
	case rec.State == ledger.Processing && rec.LeaseUntil > now.UnixMilli():
		return errRunGoingOn
	case rec.State == ledger.Processing && rec.Attempt >= rec.MaxAttempts:
		cause := fmt.Errorf("%w: poison message moved to the dead-letter queue after %s receives (the worker crashed or timed out every time); no attempts are left", ErrOrphaned, receives)
		return h.failDeadLetter(ctx, rec, cause)
	case (rec.State == ledger.Processing || rec.State == ledger.Enqueued || rec.State == ledger.Scheduled) && staleCopy(m, rec):
		// A copy of the job's message sent before its last return (a
		// duplicate delivery, a guard's check, a re-dispatch), which spent
		// its receives alongside the one returned: that return sent the
		// job afresh, so this one is dropped, not counted. Counting them
		// failed a job as never started after one bad stretch (10k soak,
		// seed 1796526818492146927: three copies returned in 35 s).
		h.log.InfoContext(ctx, "nexjob: stale copy of a job's message dropped from the DLQ", "job_id", rec.ID, "message_id", m.MessageId, "returns", rec.Returns)
		return nil
	case rec.State == ledger.Processing || rec.State == ledger.Enqueued || rec.State == ledger.Scheduled:
		// Not poison, by the ledger: attempts are left (a Processing job's
		// last claim ran out its lease: the next claim takes it over, as
		// the worker's would), or no run started. Receives are spent by
		// more than runs (receives too near an invocation's end, claims
		// that failed, kills before the claim), so the record decides.
		if rec.Returns >= h.o.MaxReturns && rec.ReturnOf != m.MessageId {
			cause := fmt.Errorf("%w, %d times (after %s receives the last time): its claims failed or its receives came too near the invocation's end",
				ErrNeverStarted, rec.Returns+1, receives)
			if rec.State == ledger.Processing {
				cause = fmt.Errorf("%w: its message reached the dead-letter queue %d times (after %s receives the last time) with attempts left; the worker crashed or timed out every time",
					ErrOrphaned, rec.Returns+1, receives)
			}
			return h.failDeadLetter(ctx, rec, cause)
		}
		reason := fmt.Sprintf("message reached the dead-letter queue after %s receives although the job never started (claims failed or receives came too near the invocation's end); sent back (%d of %d)",
			receives, rec.Returns+1, h.o.MaxReturns)
		if rec.State == ledger.Processing {
			reason = fmt.Sprintf("message reached the dead-letter queue after %s receives with attempts left (attempt %d of %d: its worker was lost and the lease ran out); sent back (%d of %d)",
				receives, rec.Attempt, rec.MaxAttempts, rec.Returns+1, h.o.MaxReturns)
		}
		back, ok, err := h.store.Return(ctx, rec, m.MessageId, reason)
		if err != nil {
			return err
		}
		if !ok {
			// It moved on meanwhile: whatever moved it dispatches it.
			h.log.InfoContext(ctx, "nexjob: dead letter of a job that moved on dropped", "job_id", rec.ID, "message_id", m.MessageId, "state", back.State)
			return nil
		}
		h.log.WarnContext(ctx, "nexjob: job sent back from the DLQ", "job_id", rec.ID, "kind", rec.Kind, "state", rec.State, "returns", back.Returns)
		return h.producer.Dispatch(ctx, back)
	case rec.State.Terminal() && len(rec.Children) > 0:
		// A dead letter again after its children could not be released
		// or ended.
		if !h.settleChildren(ctx, rec) {
			return fmt.Errorf("nexjob: continuations of %s not settled", rec.ID)
		}
	}
	return nil // ended (a duplicate dead letter) or waiting on its parent
}

// staleAfter is how long before the job's last return a dead letter must
// have been sent to be a stale copy (staleCopy): SQS's clock and the
// consumer's are apart by far less, so the return's own fresh message is
// never taken for one.
const staleAfter = time.Minute

// staleCopy reports whether dead letter m is a copy of rec's message sent
// (by SQS's SentTimestamp, set by SQS, not the sender) more than
// staleAfter before the job's last return, and not the dead letter that
// return counted.
func staleCopy(m events.SQSMessage, rec ledger.Record) bool {
	sent, err := strconv.ParseInt(m.Attributes["SentTimestamp"], 10, 64)
	return err == nil && rec.Returns > 0 && rec.ReturnOf != m.MessageId && sent < rec.ReturnAt-staleAfter.Milliseconds()
}

// failDeadLetter ends the job as Failed with cause, if it is still as
// read, and does what follows (hook, continuations).
func (h *Handler) failDeadLetter(ctx context.Context, rec ledger.Record, cause error) error {
	if !h.earlierHookRan(ctx, rec) {
		return errHookGoingOn
	}
	var hookLease time.Duration
	if h.hookOf(rec.Kind) != nil {
		hookLease, _, _ = h.lease(ctx, h.store.Now(), 0) // held until this invocation ends
	}
	out, dead, err := h.store.DeadLetter(ctx, rec, cause.Error(), h.store.ExpiresAfter(h.retention(rec.Kind).Failed), hookLease)
	if err != nil {
		return err
	}
	if !dead {
		if out.State == ledger.Failed && out.HookPending {
			// Our own write, its reply lost (or another consumer's): the
			// hook is due; run it when no one holds it.
			if _, ok := h.takeOverHook(ctx, out); !ok {
				return errHookGoingOn
			}
		}
		return nil
	}
	h.log.WarnContext(ctx, "nexjob: job dead-lettered", "job_id", out.ID, "kind", out.Kind, "err", cause)
	cleared := h.runHook(ctx, out, cause)
	if !h.endChildren(ctx, out) {
		return fmt.Errorf("nexjob: continuations of %s not ended", out.ID)
	}
	if !cleared {
		return fmt.Errorf("nexjob: the dead-letter hook's mark on %s was not cleared; its dead letter comes back to clear it", out.ID)
	}
	return nil
}

// keepNonJob writes a Failed record holding the message and the reason.
func (h *Handler) keepNonJob(ctx context.Context, m events.SQSMessage, reason string) error {
	body := m.Body
	if len(body) > maxKeptBody {
		body = body[:maxKeptBody]
	}
	args, err := json.Marshal(map[string]string{"messageId": m.MessageId, "body": body, "reason": reason})
	if err != nil {
		return err
	}
	// The reason is this consumer's own (never a sender-set attribute:
	// anyone who can send to a queue can set one), capped as every
	// stored error is.
	reason = redact.Truncate(reason, ledger.MaxLastError)
	rec := ledger.Record{Kind: DeadLetterKind, Args: string(args), State: ledger.Failed, LastError: reason, MaxAttempts: 1, NonJob: true}
	if exp := h.store.ExpiresAfter(h.o.Retention.Failed); !exp.IsZero() {
		rec.ExpiresAt = ledger.TTL(exp)
	}
	// Keyed by the message id: a redelivered dead letter is kept once.
	if _, _, err := h.store.Insert(ctx, rec, "dead-letter/"+m.MessageId, ledger.RejectAlways, nil); err != nil {
		var dup *ledger.DuplicateJobError
		if !errors.As(err, &dup) {
			return err
		}
	}
	h.log.WarnContext(ctx, "nexjob: non-job message kept in the ledger", "message_id", m.MessageId, "reason", reason)
	return nil
}
