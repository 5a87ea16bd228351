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
// unknown one, ledger.ErrNotFound. Its recorded steps are kept (the run
// replays them; RequeueFresh drops them), but a wait that timed out opens
// again: the requeue's own update marks the job (Record.ReopenWaits), and
// its next run's worker removes the timed-out waits with the mark
// (ledger.Store.ReopenTimedOutWaits, one more UpdateItem): the requeued
// run waits afresh, for its full timeout, and a late approver's signal is
// taken.
//
// Continuations, one rule for a single parent's and a fan-in child: a
// continuation runs only after every parent of it Succeeded. Requeued
// itself, its parents decide (one read each): all Succeeded (or gone),
// it is requeued and runs; one still active, it goes back to
// AwaitingContinuation (Result.State says so) with the parents that
// Succeeded counted, linked again to the active ones in the same
// transaction, and runs once they Succeed; one Failed or Expired, the
// requeue is refused with a *ParentNotSucceededError naming it, nothing
// written (requeue that parent). Requeueing a parent puts back to waiting
// its children that its end ended without a run (Failed or Expired as it
// did): a single parent's with one update, a fan-in child with its other
// parents read, unless one of them Failed or Expired too (that one's
// requeue brings it back), before the parent's message is sent. Runs a
// job already made stay in its history.
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
	if errors.As(err, &nc) && nc.Current.Continues() && slices.Contains(from, nc.Current.State) {
		// A continuation: its parents decide (a read each, only here).
		var done bool
		var res Result
		if res, done, err = c.requeueChild(ctx, nc.Current, from); done {
			return res, err
		}
		rec, err = c.store.RequeueContinuation(ctx, jobID, from...)
	}
	if errors.Is(err, ledger.ErrDeadLetterRecord) {
		return Result{}, err
	}
	if errors.As(err, &nc) {
		return Result{}, notRequeued(jobID, from, nc.Current)
	}
	if err != nil {
		return Result{}, c.missing(err)
	}
	res := Result{ID: rec.ID, Kind: rec.Kind, State: rec.State}
	// Its children that its end ended without a run wait for it again,
	// before it is sent: once it Succeeds it releases them. A crash here
	// leaves it Enqueued unsent (the dispatch guard sends it) and those
	// children ended, to be requeued (they wait for it then).
	rewaitErr := c.rewaitChildren(ctx, rec)
	if err := c.Dispatch(ctx, rec); err != nil {
		return res, &DispatchError{JobID: rec.ID, Err: c.missing(err)}
	}
	c.log.InfoContext(ctx, "nexjob: requeued", "job_id", rec.ID, "kind", rec.Kind)
	return res, rewaitErr
}

// notRequeued is the error of a requeue whose condition found cur.
func notRequeued(jobID string, from []ledger.State, cur ledger.Record) error {
	switch {
	case cur.ID != jobID || (cur.State.Terminal() && slices.Contains(from, cur.State) && cur.KeyHash != ""):
		return ledger.ErrKeyReused
	case cur.State.Terminal():
		return &StateChangedError{JobID: jobID, Want: from, State: cur.State}
	}
	return &NotTerminalError{JobID: jobID, State: cur.State}
}

// requeueChild handles the requeue of the continuation cur (see
// Requeue): every parent Succeeded or gone, it is requeued as any job
// (done false); one Failed or Expired, a *ParentNotSucceededError,
// nothing written; else it waits again (WaitAgain: one transaction of the
// child and a link per active parent; a parent that changed meanwhile is
// read again). Cost: a read per parent.
func (c *Client) requeueChild(ctx context.Context, cur ledger.Record, from []ledger.State) (Result, bool, error) {
	for range maxLinkTries {
		released, waiting, err := c.parentsOf(ctx, cur, "")
		if err != nil {
			return Result{}, true, err
		}
		if len(waiting) == 0 {
			return Result{}, false, nil
		}
		err = c.store.WaitAgain(ctx, cur, from, false, released, waiting, "waiting again for its parents: requeued")
		var refused *ledger.LinkRefusedError
		var nc *ledger.NotClaimableError
		switch {
		case errors.As(err, &refused):
			continue // a parent moved on meanwhile: read them again
		case errors.As(err, &nc):
			return Result{}, true, notRequeued(cur.ID, from, nc.Current)
		case err != nil:
			return Result{}, true, c.missing(err)
		}
		c.log.InfoContext(ctx, "nexjob: requeued continuation waits for its parents", "job_id", cur.ID, "waiting_for", len(waiting))
		return Result{ID: cur.ID, Kind: cur.Kind, State: ledger.AwaitingContinuation}, true, nil
	}
	return Result{}, true, ledger.ErrContention
}

// parentsOf reads the parents of the continuation cur but skip: those
// that Succeeded or are gone (released), and those still active
// (waiting). One that Failed or Expired is a *ParentNotSucceededError.
func (c *Client) parentsOf(ctx context.Context, cur ledger.Record, skip string) (released []string, waiting []ledger.Record, err error) {
	for _, id := range cur.ParentIDs() {
		if id == skip {
			continue
		}
		p, err := c.store.Get(ctx, id)
		switch {
		case errors.Is(err, ledger.ErrNotFound) || p.State == ledger.Succeeded:
			released = append(released, id)
		case err != nil:
			return nil, nil, c.missing(err)
		case p.State.Terminal():
			return nil, nil, &ParentNotSucceededError{JobID: cur.ID, ParentID: id, ParentState: p.State}
		default:
			waiting = append(waiting, p)
		}
	}
	return released, waiting, nil
}

// rewaitChildren puts back to waiting the parent's children that its end
// ended without a run: a single parent's by one update (Rewait); a
// fan-in child, read then, by rewaitFanIn.
func (c *Client) rewaitChildren(ctx context.Context, parent ledger.Record) error {
	var errs []error
	for _, id := range parent.Children {
		cur, ok, err := c.store.Rewait(ctx, id, parent.ID)
		switch {
		case errors.Is(err, ledger.ErrNotFound) || ok:
			continue
		case err != nil:
			errs = append(errs, err)
		case slices.Contains(cur.Parents, parent.ID) && endedUnrun(cur):
			if err := c.rewaitFanIn(ctx, cur, parent); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nexjob: requeued %s, but some of its ended continuations stay ended: %w", parent.ID, errors.Join(errs...))
	}
	return nil
}

// rewaitFanIn puts the fan-in child cur, ended unrun, back to waiting
// for the requeued parent and its other parents still active (the ones
// that Succeeded counted), in one transaction with their links. One of
// them Failed or Expired: it stays ended (that parent's requeue brings
// it back).
func (c *Client) rewaitFanIn(ctx context.Context, cur, parent ledger.Record) error {
	for range maxLinkTries {
		released, waiting, err := c.parentsOf(ctx, cur, parent.ID)
		var pns *ParentNotSucceededError
		if errors.As(err, &pns) {
			return nil
		}
		if err != nil {
			return err
		}
		err = c.store.WaitAgain(ctx, cur, []ledger.State{ledger.Failed, ledger.Expired}, true, released, append(waiting, parent),
			"waiting again: its parent "+parent.ID+" was requeued")
		var refused *ledger.LinkRefusedError
		var nc *ledger.NotClaimableError
		switch {
		case errors.As(err, &refused):
			continue
		case errors.As(err, &nc) || errors.Is(err, ledger.ErrNotFound):
			return nil // it moved on meanwhile (another requeue brought it back)
		}
		return err
	}
	return ledger.ErrContention
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

// RequeueFresh is Requeue of a job whose recorded steps (handler.Step)
// are dropped first, so its next run calls every step again: for a job
// whose steps' results are stale (a payment reversed by hand). Requeue
// keeps them. Two writes: the steps' removal, conditional on the job
// being ended (an active job gives a *NotTerminalError and nothing is
// written), then the requeue; a failure between leaves the job ended with
// no steps, and calling RequeueFresh again finishes it.
func (c *Client) RequeueFresh(ctx context.Context, jobID string) (Result, error) {
	if err := c.store.ForgetSteps(ctx, jobID); err != nil {
		var nc *ledger.NotClaimableError
		if errors.As(err, &nc) {
			return Result{ID: jobID}, &NotTerminalError{JobID: jobID, State: nc.Current.State}
		}
		return Result{ID: jobID}, fmt.Errorf("nexjob: forget the steps of job %s: %w", jobID, err)
	}
	return c.Requeue(ctx, jobID)
}
