package enqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
)

// ContinueWith adds a job that runs once the parent job succeeds. The child
// waits as AwaitingContinuation and is released (Enqueued and sent) when the
// parent succeeds; if the parent already succeeded it is enqueued at once.
// When the parent fails or expires, its dead-letter hook may release them
// (ReleaseContinuations); the worker then ends every child still waiting
// as the parent ended (Failed or Expired, naming the parent), so no child
// waits forever holding its key.
//
// Children take idempotency keys like any job; a waiting child is active, so
// a duplicate returns it. Delay, RunAt and Debounce are refused: a
// continuation runs when its parent is done. A RateLimit takes its slot
// (after the parent is read) as Enqueue does: over it, a
// *RateLimitedError and no child written. An unknown parent is an
// *InputError. A parent
// that already Failed or Expired gives a *ParentEndedError and nothing is
// written; one that ends between the child's write and its link also
// gives it, and the child is removed (or, if it existed before this call,
// ended as the parent). A parent with ledger.MaxChildren children gives
// ledger.ErrTooManyChildren, and the child is removed.
//
// Cost: one read of the parent, one write for the child, one for the link.
func (c *Client) ContinueWith(ctx context.Context, parentID string, args JobArgs, opts *Opts) (Result, error) {
	ctx, span := c.startSpan(ctx, "continue_with", attribute.String("nexjob.parent_id", parentID))
	res, err := c.continueWith(ctx, parentID, args, opts)
	endSpan(span, res, err)
	return res, err
}

func (c *Client) continueWith(ctx context.Context, parentID string, args JobArgs, opts *Opts) (Result, error) {
	var o Opts
	if opts != nil {
		o = *opts
	}
	if o.Delay != 0 || !o.RunAt.IsZero() {
		return Result{}, invalid("Delay", "a continuation runs when its parent is done; Delay and RunAt do not apply")
	}
	rec, err := c.newRecord(args, &o, viaContinue)
	if err != nil {
		return Result{}, err
	}
	parent, err := c.store.Get(ctx, parentID)
	switch {
	case errors.Is(err, ledger.ErrBadID) || errors.Is(err, ledger.ErrNotFound):
		return Result{}, &InputError{Field: "parentID", Reason: "no such job", Err: err}
	case err != nil:
		return Result{}, c.missing(err)
	}
	switch parent.State {
	case ledger.Succeeded:
		return c.submit(ctx, rec, &o) // admitted there
	case ledger.Failed, ledger.Expired:
		return Result{}, &ParentEndedError{ParentID: parentID, State: parent.State}
	}
	if err := c.admit(ctx, rec, &o); err != nil {
		return Result{}, err
	}
	rec.State, rec.ParentID = ledger.AwaitingContinuation, parentID
	got, created, err := c.insert(ctx, rec, &o)
	if err != nil || (!created && (got.State != ledger.AwaitingContinuation || got.ParentID != parentID)) {
		return Result{ID: got.ID, State: got.State, Duplicate: !created}, err
	}
	// Link (again, for a duplicate: a caller retrying after a crash between
	// the two writes must not leave the child unlinked).
	succeeded, err := c.link(ctx, parentID, got, created, "parentID")
	if err != nil {
		return Result{}, err
	}
	res := Result{ID: got.ID, State: got.State, Duplicate: !created}
	if succeeded { // the parent succeeded meanwhile
		if err := c.releaseFrom(ctx, &res, parentID); err != nil {
			c.uncounted(ctx, got, created, parentID, err)
			return res, err
		}
	}
	c.log.InfoContext(ctx, "nexjob: continuation added", "job_id", got.ID, "parent_id", parentID, "state", res.State, "duplicate", res.Duplicate)
	return res, nil
}

// ContinueWhenAll adds a fan-in continuation: a job that runs once after
// every one of parents (2 to ledger.MaxParents distinct job ids) Succeeded,
// and ends as the first parent that Failed or Expired did otherwise. Each
// parent's success is counted once in the child's record (a set), so a
// parent whose completion is replayed or whose reply was lost counts
// once. Parents that already Succeeded count at once; one that already
// Failed or Expired gives a *ParentEndedError and nothing is written; an
// unknown one an *InputError. Opts as for ContinueWith (a RateLimit
// takes its slot, Debounce is refused). Requeueing a parent does not bring back a
// fan-in child its failure ended (requeue the child once every parent
// Succeeded).
//
// Cost: one read per parent, one write for the child, one link per
// parent, and per parent's success one update of the child (a failed
// conditional release and the set's update; the last one moves it to
// Enqueued: one more).
func (c *Client) ContinueWhenAll(ctx context.Context, parents []string, args JobArgs, opts *Opts) (Result, error) {
	ctx, span := c.startSpan(ctx, "continue_when_all", attribute.Int("nexjob.parents", len(parents)))
	res, err := c.continueWhenAll(ctx, parents, args, opts)
	endSpan(span, res, err)
	return res, err
}

func (c *Client) continueWhenAll(ctx context.Context, parents []string, args JobArgs, opts *Opts) (Result, error) {
	var o Opts
	if opts != nil {
		o = *opts
	}
	if o.Delay != 0 || !o.RunAt.IsZero() {
		return Result{}, invalid("Delay", "a continuation runs when its parents are done; Delay and RunAt do not apply")
	}
	if len(parents) < 2 || len(parents) > ledger.MaxParents {
		return Result{}, invalid("parents", fmt.Sprintf("%d parents; ContinueWhenAll takes 2 to %d (ContinueWith takes one)", len(parents), ledger.MaxParents))
	}
	if len(slices.Compact(slices.Sorted(slices.Values(parents)))) != len(parents) {
		return Result{}, invalid("parents", "a parent is named twice")
	}
	rec, err := c.newRecord(args, &o, viaContinue)
	if err != nil {
		return Result{}, err
	}
	if len(rec.Args) > ledger.MaxArgsBytes-2*len(parents)*64 {
		return Result{}, invalid("args", fmt.Sprintf("%d bytes encoded; with %d parents the limit is %d", len(rec.Args), len(parents), ledger.MaxArgsBytes-2*len(parents)*64))
	}
	var done []string // parents that Succeeded already
	for _, id := range parents {
		p, err := c.store.Get(ctx, id)
		switch {
		case errors.Is(err, ledger.ErrBadID) || errors.Is(err, ledger.ErrNotFound):
			return Result{}, &InputError{Field: "parents", Reason: "no such job", Err: err}
		case err != nil:
			return Result{}, c.missing(err)
		case p.State == ledger.Failed || p.State == ledger.Expired:
			return Result{}, &ParentEndedError{ParentID: id, State: p.State}
		case p.State == ledger.Succeeded:
			done = append(done, id)
		}
	}
	if err := c.admit(ctx, rec, &o); err != nil {
		return Result{}, err
	}
	rec.State, rec.Parents = ledger.AwaitingContinuation, slices.Clone(parents)
	got, created, err := c.insert(ctx, rec, &o)
	if err != nil || (!created && (got.State != ledger.AwaitingContinuation || !sameSet(got.Parents, rec.Parents))) {
		return Result{ID: got.ID, State: got.State, Duplicate: !created}, err
	}
	// Link to every parent not done (again, for a duplicate: a retry after
	// a crash between the writes must not leave a parent unlinked).
	for _, id := range parents {
		if slices.Contains(done, id) {
			continue
		}
		succeeded, err := c.link(ctx, id, got, created, "parents")
		if err != nil {
			return Result{}, err
		}
		if succeeded {
			done = append(done, id) // it succeeded meanwhile
		}
	}
	res := Result{ID: got.ID, State: got.State, Duplicate: !created}
	for _, id := range done {
		if err := c.releaseFrom(ctx, &res, id); err != nil {
			c.uncounted(ctx, got, created, id, err)
			return res, err
		}
	}
	c.log.InfoContext(ctx, "nexjob: fan-in continuation added", "job_id", got.ID, "parents", len(parents), "state", res.State, "duplicate", res.Duplicate)
	return res, nil
}

// ReleaseContinuations enqueues and sends every child waiting on parent.
// Each child is released by one conditional update, so replaying a
// release (a parent's completion retried) releases nothing twice; a child
// already released but never started is sent again, which is harmless.
func (c *Client) ReleaseContinuations(ctx context.Context, parent ledger.Record) error {
	var errs []error
	for _, id := range parent.Children {
		rec, released, err := c.store.ReleaseFrom(ctx, id, parent.ID)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		case !released && (rec.State != ledger.Enqueued || rec.Attempt > 0):
			continue
		}
		if err := c.Dispatch(ctx, rec); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nexjob: release continuations of %s: %w", parent.ID, errors.Join(errs...))
	}
	return nil
}

// link links child to parentID (Link). succeeded: the parent had
// Succeeded already, so the caller counts its release. A link that
// cannot be made undoes the child (unlink) and is the call's error: an
// *InputError on field for a parent gone or full, a *ParentEndedError
// for one that ended.
func (c *Client) link(ctx context.Context, parentID string, child ledger.Record, created bool, field string) (succeeded bool, err error) {
	cur, linked, err := c.store.Link(ctx, parentID, child.ID)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		c.unlink(ctx, child, created, ledger.Failed, "parent job vanished before the continuation was linked")
		return false, &InputError{Field: field, Reason: "no such job", Err: err}
	case errors.Is(err, ledger.ErrTooManyChildren):
		c.unlink(ctx, child, created, ledger.Failed, err.Error())
		return false, &InputError{Field: field, Reason: err.Error(), Err: err}
	case err != nil:
		// Not linked (throttled past the retries, say): a child this call
		// made would wait for ever on a parent that never counts it, and
		// the caller, told of an error, makes another. It ends Failed
		// with the reason, kept for the Failed retention (short soak, seed 2: an
		// unkeyed fan-in child stayed AwaitingContinuation for good). A
		// child found by a keyed retry is left for the next retry to link.
		if created {
			c.unlink(ctx, child, false, ledger.Failed, "its link to parent "+parentID+" failed; the call that made it returned an error")
		}
		return false, c.missing(err)
	case !linked && (cur.State == ledger.Failed || cur.State == ledger.Expired):
		c.unlink(ctx, child, created, cur.State, parentEnded(cur))
		return false, &ParentEndedError{ParentID: parentID, State: cur.State}
	}
	return !linked, nil
}

// releaseFrom counts parentID's success for the child res names
// (ReleaseFrom) and sends the child if that released it; res.State
// follows.
func (c *Client) releaseFrom(ctx context.Context, res *Result, parentID string) error {
	rel, ok, err := c.store.ReleaseFrom(ctx, res.ID, parentID)
	if err != nil {
		return c.missing(err)
	}
	res.State = rel.State
	if ok {
		if err := c.Dispatch(ctx, rel); err != nil {
			return &DispatchError{JobID: rel.ID, Err: c.missing(err)}
		}
	}
	return nil
}

// uncounted ends a child this call made whose count of a parent that
// already Succeeded failed: no one else will count that parent, so it
// would wait for ever. A count that did apply (its outcome left open)
// released it, the cancel then finds it Enqueued and leaves it, and the
// dispatch guard sends it. A child found by a keyed retry is left for the
// next retry.
func (c *Client) uncounted(ctx context.Context, child ledger.Record, created bool, parentID string, err error) {
	var de *DispatchError
	if !created || errors.As(err, &de) {
		return // released; only its send failed, and the job is marked unsent
	}
	c.unlink(ctx, child, false, ledger.Failed, "its count of parent "+parentID+" failed; the call that made it returned an error")
}

// unlink undoes a child whose link failed: a child this call created is
// removed (nothing half-written); one that existed before ends as as.
func (c *Client) unlink(ctx context.Context, child ledger.Record, created bool, as ledger.State, reason string) {
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	var err error
	if created {
		_, err = c.store.Delete(bctx, child.ID)
	} else {
		// Kept as long as a worker keeps a record that ended so.
		_, _, err = c.store.Cancel(bctx, child.ID, as, reason, c.store.ExpiresAfter(c.retention.For(as)))
	}
	if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		c.log.ErrorContext(ctx, "nexjob: could not undo an unlinked continuation", "job_id", child.ID, "err", err)
	}
}

func parentEnded(parent ledger.Record) string {
	return fmt.Sprintf("parent job %s ended %s", parent.ID, parent.State)
}

// CancelContinuations ends every child still waiting on parent as the
// parent ended (Failed or Expired; Failed for a parent in any other
// state), with the reason (a reason of "" names the parent and its
// state); the record is kept for retention. A child already released or
// ended is left alone, so a replay cancels nothing twice.
func (c *Client) CancelContinuations(ctx context.Context, parent ledger.Record, reason string, retention time.Duration) error {
	exp := c.store.ExpiresAfter(retention)
	as := parent.State
	if as != ledger.Expired {
		as = ledger.Failed
	}
	if reason == "" {
		reason = parentEnded(parent)
	}
	var errs []error
	for _, id := range parent.Children {
		if _, _, err := c.store.Cancel(ctx, id, as, reason, exp); err != nil && !errors.Is(err, ledger.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

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

// Cancel withdraws a job that has not started (Enqueued or Scheduled): its
// record becomes Failed, marked Cancelled, with the reason (default
// "cancelled by an operator") and kept for retention (0 keeps it until
// deleted); its continuations end Failed too. Its message, when it comes,
// is acknowledged without a run. Any other state gives a
// *NotCancellableError and nothing is written; an unknown job,
// ledger.ErrNotFound. Requeue runs a cancelled job after all.
//
// The record is kept, not deleted, so the operator's decision is visible
// and the key stays held as by any Failed job (RejectIfFailed refuses it).
func (c *Client) Cancel(ctx context.Context, jobID, reason string, retention time.Duration) (ledger.Record, error) {
	if reason == "" {
		reason = "cancelled by an operator"
	}
	rec, ok, err := c.store.Withdraw(ctx, jobID, reason, c.store.ExpiresAfter(retention))
	if err != nil {
		return ledger.Record{}, c.missing(err)
	}
	if !ok {
		return rec, &NotCancellableError{JobID: jobID, State: rec.State}
	}
	c.log.InfoContext(ctx, "nexjob: cancelled", "job_id", rec.ID, "kind", rec.Kind)
	if ledger.Millis(rec.RunAt).Sub(c.store.Now()) > c.farAfter {
		c.unschedule(ctx, rec.ID, rec.RunAt) // it was far: its message waits in a schedule
	}
	return rec, c.CancelContinuations(ctx, rec, "", retention)
}

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

// NotCancellableError: Cancel of a job that already started or ended.
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
func (c *Client) Delete(ctx context.Context, jobID string) error {
	old, err := c.store.Delete(ctx, jobID)
	if err != nil {
		return c.missing(err)
	}
	if old.State == ledger.Scheduled && ledger.Millis(old.RunAt).Sub(c.store.Now()) > c.farAfter {
		c.unschedule(ctx, jobID, old.RunAt) // its message waits in a schedule
	}
	return nil
}

// sameSet reports whether a and b hold the same strings (a DynamoDB set
// comes back in any order).
func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
