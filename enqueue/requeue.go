package enqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Requeue moves a terminal job (Succeeded, Failed, Expired) back to
// Enqueued with a fresh attempt budget and sends it: one conditional
// update and one send. The job is active again, so enqueues with its key
// deduplicate to it; its old deadline is cleared. An active job gives a
// *NotTerminalError; a job whose key a newer job took, ledger.ErrKeyReused;
// a record of a message that was not a job, ledger.ErrDeadLetterRecord; an
// unknown one, ledger.ErrNotFound.
//
// Continuations: the requeued job's children that its end ended without a
// run (Failed or Expired as their parent did) wait for it again, and run
// once it Succeeds. A continuation itself is requeued only once its
// parent Succeeded: while the parent is active it waits for it again,
// and after the parent Failed or Expired the requeue is refused with a
// *ParentNotSucceededError (requeue the parent). Runs it already made stay
// in its history.
func (c *Client) Requeue(ctx context.Context, jobID string) (Result, error) {
	return c.RequeueFrom(ctx, jobID, ledger.Succeeded, ledger.Failed, ledger.Expired)
}

// RequeueFrom is Requeue of a job still in one of the states from (all
// terminal), as a bulk requeue of listed jobs needs: a job found in
// another terminal state gives a *StateChangedError, an active one a
// *NotTerminalError, and nothing is written.
func (c *Client) RequeueFrom(ctx context.Context, jobID string, from ...ledger.State) (Result, error) {
	ctx, span := c.startSpan(ctx, "requeue")
	res, err := c.requeueFrom(ctx, jobID, from)
	if res.ID == "" {
		res.ID = jobID
	}
	endSpan(span, res, err)
	return res, err
}

func (c *Client) requeueFrom(ctx context.Context, jobID string, from []ledger.State) (Result, error) {
	rec, err := c.store.RequeueFrom(ctx, jobID, from...)
	var nc *ledger.NotClaimableError
	if errors.As(err, &nc) && nc.Current.ParentID != "" && slices.Contains(from, nc.Current.State) {
		// A continuation: its parent decides (one more read, only here).
		var done bool
		var res Result
		if res, done, err = c.requeueChild(ctx, nc.Current); done {
			return res, err
		}
		rec, err = c.store.RequeueContinuation(ctx, jobID, from...)
	}
	if errors.Is(err, ledger.ErrDeadLetterRecord) {
		return Result{}, err
	}
	switch {
	case errors.As(err, &nc) && nc.Current.State.Terminal():
		return Result{}, &StateChangedError{JobID: jobID, Want: from, State: nc.Current.State}
	case errors.As(err, &nc):
		return Result{}, &NotTerminalError{JobID: jobID, State: nc.Current.State}
	}
	if err != nil {
		return Result{}, c.missing(err)
	}
	res := Result{ID: rec.ID, State: rec.State}
	// Its children that its end ended without a run wait for it again,
	// before it is sent: once it Succeeds it releases them. A crash here
	// leaves it Enqueued unsent (the dispatch guard sends it) and those
	// children ended, to be requeued once it Succeeded.
	rewaitErr := c.rewaitChildren(ctx, rec)
	if err := c.Dispatch(ctx, rec); err != nil {
		return res, &DispatchError{JobID: rec.ID, Err: c.missing(err)}
	}
	c.log.InfoContext(ctx, "nexjob: requeued", "job_id", rec.ID, "kind", rec.Kind)
	return res, rewaitErr
}

// requeueChild handles the requeue of a continuation cur: its parent
// decides. Succeeded (or gone past its retention): requeued as any job
// (done false). Still active: the child waits for it again (done).
// Failed or Expired: a *ParentNotSucceededError, nothing written: requeue
// the parent, which brings its ended children back. Cost: the parent's
// read.
func (c *Client) requeueChild(ctx context.Context, cur ledger.Record) (Result, bool, error) {
	jobID := cur.ID
	parent, err := c.store.Get(ctx, cur.ParentID)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return Result{}, false, nil
	case err != nil:
		return Result{}, true, c.missing(err)
	case parent.State == ledger.Succeeded:
		return Result{}, false, nil
	case parent.State.Terminal():
		return Result{}, true, &ParentNotSucceededError{JobID: jobID, ParentID: parent.ID, ParentState: parent.State}
	}
	rec, ok, err := c.store.Rewait(ctx, jobID, parent.ID)
	if err != nil {
		return Result{}, true, c.missing(err)
	}
	if !ok {
		return Result{}, true, &NotTerminalError{JobID: jobID, State: rec.State}
	}
	if _, linked, err := c.store.Link(ctx, parent.ID, jobID); err != nil || !linked {
		// The parent ended meanwhile: end the child as it did, again.
		c.unlink(ctx, rec, false, ledger.Failed, parentEnded(parent))
		if err == nil {
			err = &ParentNotSucceededError{JobID: jobID, ParentID: parent.ID, ParentState: ledger.Failed}
		}
		return Result{}, true, err
	}
	return Result{ID: rec.ID, State: rec.State}, true, nil
}

// rewaitChildren puts back to waiting the parent's children that its end
// ended without a run.
func (c *Client) rewaitChildren(ctx context.Context, parent ledger.Record) error {
	var errs []error
	for _, id := range parent.Children {
		if _, _, err := c.store.Rewait(ctx, id, parent.ID); err != nil && !errors.Is(err, ledger.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nexjob: requeued %s, but some of its ended continuations stay ended: %w", parent.ID, errors.Join(errs...))
	}
	return nil
}

// ParentNotSucceededError: Requeue of a continuation whose parent ended
// without succeeding. Requeue the parent: its ended children wait for it
// again.
type ParentNotSucceededError struct {
	JobID, ParentID string
	ParentState     ledger.State
}

func (e *ParentNotSucceededError) Error() string {
	return fmt.Sprintf("nexjob: job %s continues job %s, which ended %s: requeue the parent (its ended continuations wait for it again)", e.JobID, e.ParentID, e.ParentState)
}

// StateChangedError: RequeueFrom of a job that is no longer in the state
// it was listed in (another operator requeued it, and it ended again).
type StateChangedError struct {
	JobID string
	Want  []ledger.State
	State ledger.State
}

func (e *StateChangedError) Error() string {
	return fmt.Sprintf("nexjob: job %s is %s now, not %v as listed; left alone", e.JobID, e.State, e.Want)
}

// NotTerminalError: Requeue of a job that is still active.
type NotTerminalError struct {
	JobID string
	State ledger.State
}

func (e *NotTerminalError) Error() string {
	return fmt.Sprintf("nexjob: job %s is %s; only terminal jobs can be requeued", e.JobID, e.State)
}
