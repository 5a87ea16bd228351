package enqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
)

// requestCompensation asks compensable job jobID, waiting, to stop and
// compensate (ledger.Store.RequestCompensation) and sends it: a
// *CancelRequestedError, as for a running job. A send that fails is
// an error: the job is due, and a Cancel again sends it.
func (c *Client) requestCompensation(ctx context.Context, jobID, reason string) (ledger.Record, error) {
	rec, asked, err := c.store.RequestCompensation(ctx, jobID, reason)
	if err != nil {
		return ledger.Record{}, c.missing(err)
	}
	if !asked {
		return rec, fmt.Errorf("nexjob: cancel job %s: it moved on (%s) while it was asked to compensate; try again", jobID, rec.State)
	}
	if err := c.sendNow(ctx, rec); err != nil {
		return rec, fmt.Errorf("nexjob: cancel job %s: asked to compensate, not sent (Cancel again sends it): %w", jobID, err)
	}
	return rec, &CancelRequestedError{JobID: jobID}
}

// Cancel withdraws a job that has not started (Enqueued or Scheduled): its
// record becomes Failed, marked Cancelled, with the reason (default
// "cancelled by an operator") and kept for retention (0 keeps it until
// deleted); its continuations end Failed too, down the whole tree (see
// CancelContinuations). If they cannot all be ended (or its caller told,
// or its children cancelled) the error says so, and a message sent at
// once has the worker do it (a far job's schedule is kept too). Its message, when it comes,
// is acknowledged without a run. A running job (Processing) is asked to
// stop at its next step: a *CancelRequestedError. An ended one gives a
// *NotCancellableError and nothing is written; an unknown job,
// ledger.ErrNotFound. A job whose run ends in a sleep or a retry while it
// is cancelled is followed to its new state and withdrawn there
// (TestCancelRacingASleepIsNotLost). Requeue runs a cancelled job after all.
//
// The record is kept, not deleted, so the operator's decision is visible
// and the key stays held as by any Failed job (RejectIfFailed refuses it).
//
// A job that declared compensations (handler.Compensate) is not
// withdrawn while it waits: it is asked to stop and made due now (a
// *CancelRequestedError); its next run runs the compensations and ends it
// Failed, marked Cancelled.
func (c *Client) Cancel(ctx context.Context, jobID, reason string, retention time.Duration) (ledger.Record, error) {
	if reason == "" {
		reason = "cancelled by an operator"
	}
	var (
		rec ledger.Record
		ok  bool
		err error
	)
	// The state is followed until Cancel can say which it did: a run that
	// ends in a sleep or a retry between the withdrawal (it found the job
	// Processing) and the request (it finds it Scheduled) is withdrawn on
	// the next turn. It used to be reported not cancellable, and the job
	// ran on when it woke. Each turn follows a change of the job's state
	// by its own run; a run changes it a bounded number of times.
	for range cancelTurns {
		rec, ok, err = c.store.Withdraw(ctx, jobID, reason, c.store.ExpiresAfter(retention))
		if err != nil {
			return ledger.Record{}, c.missing(err)
		}
		if !ok && rec.Compensable && (rec.State == ledger.Enqueued || rec.State == ledger.Scheduled) {
			// It declared compensations: a run stops it and runs them.
			return c.requestCompensation(ctx, jobID, reason)
		}
		if ok || rec.State != ledger.Processing {
			break
		}
		// Running: it is asked to stop at its next step (handler.Step).
		cur, asked, err := c.store.RequestCancel(ctx, jobID, reason)
		if err != nil {
			return ledger.Record{}, c.missing(err)
		}
		if asked {
			return cur, &CancelRequestedError{JobID: jobID}
		}
		rec = cur
		if cur.State != ledger.Enqueued && cur.State != ledger.Scheduled {
			break // ended meanwhile
		}
	}
	if !ok && (rec.State == ledger.Enqueued || rec.State == ledger.Scheduled) {
		return rec, fmt.Errorf("nexjob: cancel job %s: its runs moved it between running and waiting %d times while it was cancelled; nothing was cancelled, try again", jobID, cancelTurns)
	}
	if !ok {
		return rec, &NotCancellableError{JobID: jobID, State: rec.State}
	}
	c.log.InfoContext(ctx, "nexjob: cancelled", "job_id", rec.ID, "kind", rec.Kind)
	// Its continuations first: until its schedule is gone, a crash here
	// leaves its message to come and end them (the worker ends an ended
	// job's children). So the schedule stays when they could not all be
	// ended: it is the only message that names the job.
	err = c.CancelContinuations(ctx, rec, "", retention)
	// A child tells its caller it ended: its message, sent now, has the
	// worker record the end in the caller and wake it (an operator's
	// role writes no steps). A caller takes the children it started and
	// that still go with it (CancelChildren).
	if rec.Caller != "" {
		if serr := c.sendNow(ctx, rec); serr != nil {
			err = errors.Join(err, fmt.Errorf("nexjob: cancel job %s: its caller %s is told when its message comes: %w", rec.ID, rec.Caller, serr))
		}
	}
	err = errors.Join(err, c.CancelChildren(ctx, rec, retention))
	if err != nil {
		// What failed is the worker's to finish, now: its message, due at
		// once, finds the job ended and does it again until it succeeds
		// (a caller told of its child's end, its children cancelled),
		// rather than when its own message comes (a sleeping job's, maybe
		// after its caller's wait ended, or its children's own ends).
		err = errors.Join(err, c.sendNow(ctx, rec))
	}
	if err == nil && ledger.Millis(rec.RunAt).Sub(c.store.Now()) > c.farAfter {
		c.unschedule(ctx, rec.ID, rec.RunAt) // it was far: its message waits in a schedule
	}
	return rec, err
}

// cancelTurns bounds Cancel's turns between a withdrawal and a request to
// stop, each taken because the job's run moved it meanwhile.
const cancelTurns = 8

// unschedule removes the one-time schedule of a job's run at runAt (Unix
// ms), if Far is set: best effort, as one that fires anyway finds the job
// no longer waiting and does nothing. It names that run only: a delete
// that lands late (a slow request) cannot remove a later run's schedule
// (a requeued run's far retry), which has a name of its own.
func (c *Client) unschedule(ctx context.Context, jobID string, runAt int64) {
	if c.far == nil || runAt == 0 {
		return
	}
	if err := c.far.Unschedule(ctx, onetime.Name(jobID, ledger.Millis(runAt))); err != nil {
		c.log.WarnContext(ctx, "nexjob: could not remove a one-time schedule; when it fires it finds the job ended", "job_id", jobID, "err", err)
	}
}

// CancelRequestedError: Cancel of a running job. It is asked to stop: its
// next step's record (handler.Step) is refused and the run fails for good
// with the reason; a run with no step left ends as it would have. With a
// steps table the run reads its record before a step's function at most
// once per ledger.CancelLook (2 s): a run that records its steps faster
// than that sees the cancel at its first step after that time, or not at
// all if it ends first (docs/durable-jobs.md).
type CancelRequestedError struct{ JobID string }

func (e *CancelRequestedError) Error() string {
	return fmt.Sprintf("nexjob: job %s is running; it is asked to stop at its next step", e.JobID)
}

// NotCancellableError: Cancel of a job that already ended.
type NotCancellableError struct {
	JobID string
	State ledger.State
}

func (e *NotCancellableError) Error() string {
	return fmt.Sprintf("nexjob: job %s is %s; only Enqueued or Scheduled jobs can be cancelled", e.JobID, e.State)
}

// Delete removes a job's record; a keyed job's key is free at once.
// Deleting a job that does not exist is not an error. An active job's
// message, if any, is then acknowledged by the worker without running.
//
// Its continuations still waiting are settled first, by the rule its end
// would have applied: released (and sent) if it Succeeded, else ended
// Failed ("parent job … was deleted"), down the whole tree as
// CancelContinuations does, keyed ones freeing their keys. An active job
// is ended before that (Failed, marked cancelled, "deleted by an
// operator": one more update), so that no continuation links to it
// meanwhile and a run of it going on is fenced off. A crash in between
// leaves it Failed and cancelled, its continuations ended by its message
// if it has one: Delete it again. If they cannot all be settled the error
// says so and the record stays, for a Delete again; a job that was itself
// a waiting continuation has no message, and its parent's end, meeting
// it ended, sends it so that its continuations end then.
//
// Cost: a read, then one DeleteItem per place the job may live; an
// active job one update more; per waiting continuation one update (and a
// send for one released, or with continuations of its own).
func (c *Client) Delete(ctx context.Context, jobID string) error {
	var rec, old ledger.Record
	for try := 0; ; try++ {
		cur, err := c.store.Get(ctx, jobID)
		switch {
		case err == nil:
			rec = cur
			if err := c.settleChildren(ctx, rec); err != nil {
				return err
			}
		case errors.Is(err, ledger.ErrNotFound) && try == 0:
			return nil
		case errors.Is(err, ledger.ErrNotFound):
			// Our delete applied, its reply lost: rec is the job as read.
		default:
			return c.missing(err)
		}
		if err != nil {
			break
		}
		if old, err = c.store.Delete(ctx, jobID); err != nil {
			return c.missing(err)
		}
		if old.ID != "" || try == maxLinkTries {
			break
		}
		// Nothing removed although the job was there: it is active again
		// (a requeue between its end and the delete, which removes only
		// an ended job) or gone meanwhile: read it again (10k-style race
		// found by an attack on completion events: a Delete that read a
		// Failed job removed it after a requeue made it Enqueued, and the
		// job never ran nor ended).
	}
	if rec.ID != "" {
		old = rec // as read before settling ended it: a far run waits in its schedule
	}
	if old.State == ledger.Scheduled && ledger.Millis(old.RunAt).Sub(c.store.Now()) > c.farAfter {
		c.unschedule(ctx, jobID, old.RunAt)
	}
	return nil
}

// settleChildren ends the job rec if it is active and settles its
// waiting continuations as its end says (see Delete).
func (c *Client) settleChildren(ctx context.Context, rec ledger.Record) error {
	if rec.State.Active() {
		ended, _, err := c.store.EndActive(ctx, rec.ID, "deleted by an operator", c.store.ExpiresAfter(c.retention.Failed))
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			return nil
		case err != nil:
			return c.missing(err)
		}
		rec = ended // ended now, by this or by its own run meanwhile
	}
	if len(rec.Children) == 0 {
		return nil
	}
	if rec.State == ledger.Succeeded {
		return c.ReleaseContinuations(ctx, rec)
	}
	return c.CancelContinuations(ctx, rec, fmt.Sprintf("parent job %s was deleted", rec.ID), c.retention.Failed)
}
