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
