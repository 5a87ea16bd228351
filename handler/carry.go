package handler

import (
	"context"
	"errors"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// maxCheckLag bounds how far past its job's run time a dispatch guard's
// check is carried (the guard's After is minutes).
const maxCheckLag = time.Hour

// carryForward re-sends a message whose job is not due yet: for at most
// SQS's 900 s, with no DynamoDB request, while the carry stays in SQS.
//
// A carry that would make or move a one-time schedule (Options.Far), or
// that names a time beyond the longest schedule, is taken from the
// ledger, not the message: anyone who can send to the queue can write a
// body, and a far schedule is named by the job, so a forged body could
// move a real job's schedule (or its guard's check) a year on. The job's
// record is read (one eventually consistent read) and the carry goes to
// its run time, on its queue, under its kind; a message for a job that is
// gone or not waiting is dropped (the job's own messages wake it). Never
// to the DLQ: a forged body cannot make a job Failed.
//
// A dispatch guard's check of a far job (its run beyond FarAfter) ends
// here: the job's own one-time schedule is made if it is missing
// (enqueue.Client.EnsureFar, one CreateSchedule), and the check is done.
// A check never takes a schedule of its own: one schedule and one firing
// per far job. When Scheduler refuses, the check hops through SQS (never
// back to the queue to count a receive) and tries again at the next hop.
func (h *Handler) carryForward(ctx context.Context, msg enqueue.Message, now time.Time) bool {
	delay := ledger.Millis(msg.RunAt).Sub(now)
	if h.producer.GoesFar(delay) || delay > enqueue.MaxScheduleAhead {
		rec, err := h.store.Peek(ctx, msg.ID)
		switch {
		case errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrBadID):
			h.log.WarnContext(ctx, "nexjob: a future message for no job; dropped", "job_id", msg.ID)
			return true
		case err != nil:
			h.log.ErrorContext(ctx, "nexjob: reading the job to carry its message failed; it comes back", "job_id", msg.ID, "err", err)
			return false
		case rec.State != ledger.Scheduled && rec.State != ledger.Enqueued:
			h.log.WarnContext(ctx, "nexjob: a future message for a job not waiting; dropped", "job_id", msg.ID, "state", rec.State)
			return true
		}
		if msg.Check {
			// A far job's check is its own schedule, made if its producer
			// never made it: no second schedule that fires a check.
			far, err := h.producer.EnsureFar(ctx, rec)
			if far && err == nil {
				return true
			}
			if far {
				// Scheduler refuses (its quota, an outage): the check
				// hops through SQS, as it came, and tries again then.
				h.log.WarnContext(ctx, "nexjob: could not make sure of a far job's schedule; its check hops through SQS", "job_id", msg.ID, "err", err)
			}
		}
		at := rec.RunAt
		if msg.Check {
			at = min(max(msg.RunAt, rec.RunAt), rec.RunAt+maxCheckLag.Milliseconds())
		}
		if at != msg.RunAt {
			h.log.WarnContext(ctx, "nexjob: a message's run time is not its job's; carried to the job's", "job_id", msg.ID)
		}
		msg.RunAt, msg.Kind, msg.Queue = at, rec.Kind, rec.Queue
		if delay = ledger.Millis(at).Sub(now); delay <= 0 {
			return false // due after all: it comes back and is claimed
		}
	}
	if err := h.producer.Send(ctx, msg, delay); err != nil {
		h.log.ErrorContext(ctx, "nexjob: carry forward failed", "job_id", msg.ID, "err", err)
		return false
	}
	return true
}
