package enqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"

	"github.com/nexjob/nexjob-aws/ledger"
)

// ContinueWith adds a job that runs once the parent job succeeds. The child
// waits as AwaitingContinuation and is released (Enqueued and sent) when the
// parent succeeds; if the parent already succeeded it is enqueued at once.
// When the parent fails or expires, its dead-letter hook may release them
// (ReleaseContinuations); the worker then ends every child still waiting
// as the parent ended (Failed or Expired, naming the parent), and their
// own continuations after them, down the whole tree (CancelContinuations),
// so no child waits forever holding its key.
//
// The child and its link (its id in the parent's Children, which the
// parent's completing write returns) are written in one transaction
// (ledger.Store.InsertContinuation): a producer killed at any point leaves
// either both or neither, never a child that no parent counts.
//
// Children take idempotency keys like any job; a waiting child is active, so
// a duplicate returns it. Delay, RunAt and Debounce are refused: a
// continuation runs when its parent is done. A RateLimit takes its slot
// (after the parent is read) as Enqueue does: over it, a
// *RateLimitedError and no child written. An unknown parent is an
// *InputError. A parent
// that already Failed or Expired, or that ends before the transaction,
// gives a *ParentEndedError and nothing is written; one that Succeeds
// before it makes the child Enqueued at once. A parent with
// ledger.MaxChildren children gives ledger.ErrTooManyChildren (in an
// *InputError), nothing written.
//
// Cost: one read of the parent, one TransactWriteItems of two items (the
// child and the link: 4 write units, where two plain writes cost 2).
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
		return c.submit(ctx, rec, &o, viaContinue) // admitted there
	case ledger.Failed, ledger.Expired:
		return Result{}, &ParentEndedError{ParentID: parentID, State: parent.State}
	}
	if err := c.admit(ctx, rec, &o); err != nil {
		return Result{}, err
	}
	rec.State, rec.ParentID = ledger.AwaitingContinuation, parentID
	res, err := c.addContinuation(ctx, rec, &o, []ledger.Record{parent}, "parentID")
	if err == nil {
		c.log.InfoContext(ctx, "nexjob: continuation added", "job_id", res.ID, "parent_id", parentID, "state", res.State, "duplicate", res.Duplicate)
	}
	return res, err
}

// ContinueWhenAll adds a fan-in continuation: a job that runs once after
// every one of parents (2 to ledger.MaxParents distinct job ids) Succeeded,
// and ends as the first parent that Failed or Expired did otherwise. Each
// parent's success is counted once in the child's record (a set), so a
// parent whose completion is replayed or whose reply was lost counts
// once. Parents that already Succeeded count at once (the child is
// written with them counted; with every parent done, it is enqueued at
// once); one that already Failed or Expired gives a *ParentEndedError
// and nothing is written; an unknown one an *InputError. Opts as for
// ContinueWith (a RateLimit takes its slot, Debounce is refused). The child and
// its links to the parents still running are written in one transaction,
// as for ContinueWith. Requeueing a parent brings back a fan-in child its
// failure ended, once none of its other parents Failed or Expired (see
// Requeue).
//
// Cost: one read per parent, one TransactWriteItems (the child and a link
// per parent not done: 2 write units each), and per parent's success one
// update of the child (a failed conditional release and the set's
// update; the last one moves it to Enqueued: one more).
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
	var waiting []ledger.Record // parents still to succeed
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
			rec.Released = append(rec.Released, id)
		default:
			waiting = append(waiting, p)
		}
	}
	if err := c.admit(ctx, rec, &o); err != nil {
		return Result{}, err
	}
	rec.State, rec.Parents = ledger.AwaitingContinuation, slices.Clone(parents)
	res, err := c.addContinuation(ctx, rec, &o, waiting, "parents")
	if err == nil {
		c.log.InfoContext(ctx, "nexjob: fan-in continuation added", "job_id", res.ID, "parents", len(parents), "state", res.State, "duplicate", res.Duplicate)
	}
	return res, err
}

// addContinuation writes the waiting child rec with its links to the
// parents in waiting, in one transaction (InsertContinuation), and
// answers a parent's refusal by reading it: one that Succeeded meanwhile
// counts at once (and with none left to wait for, the child is enqueued
// and sent now), one that ended otherwise is a *ParentEndedError, a full
// one ledger.ErrTooManyChildren, a gone one an *InputError on field. In
// none of those was anything written. A duplicate (an active job holds
// the key) is the result it is.
func (c *Client) addContinuation(ctx context.Context, rec ledger.Record, o *Opts, waiting []ledger.Record, field string) (Result, error) {
	waiting = slices.Clone(waiting)
	for range maxLinkTries {
		if len(waiting) == 0 { // every parent Succeeded
			rec.State = ledger.Enqueued
			return c.submit(ctx, rec, o, viaContinue)
		}
		got, created, err := c.store.InsertContinuation(ctx, rec, o.IdempotencyKey, o.DuplicatePolicy, waiting)
		var refused *ledger.LinkRefusedError
		if !errors.As(err, &refused) {
			if got, created, err = c.inserted(ctx, rec, got, created, err); err != nil {
				return Result{}, err
			}
			return Result{ID: got.ID, Kind: got.Kind, State: got.State, Duplicate: !created}, nil
		}
		i := slices.IndexFunc(waiting, func(p ledger.Record) bool { return p.ID == refused.ParentID })
		p, err := c.store.Get(ctx, refused.ParentID)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			return Result{}, &InputError{Field: field, Reason: "no such job", Err: err}
		case err != nil:
			return Result{}, c.missing(err)
		case p.State == ledger.Failed || p.State == ledger.Expired:
			return Result{}, &ParentEndedError{ParentID: p.ID, State: p.State}
		case p.State == ledger.Succeeded:
			waiting = slices.Delete(waiting, i, i+1)
			if len(rec.Parents) > 0 {
				rec.Released = append(rec.Released, p.ID)
			}
		case len(p.Children) >= ledger.MaxChildren:
			return Result{}, &InputError{Field: field, Reason: ledger.ErrTooManyChildren.Error(), Err: ledger.ErrTooManyChildren}
		default:
			waiting[i] = p // changed since it was read (moved, its key re-used): as it is now
		}
	}
	return Result{}, ledger.ErrContention
}

// maxLinkTries bounds addContinuation's rounds: each one after the first
// follows a parent that Succeeded or changed meanwhile.
const maxLinkTries = ledger.MaxParents + 4

// ReleaseContinuations enqueues and sends every child waiting on parent.
// Each child is released by one conditional update, so replaying a
// release (a parent's completion retried) releases nothing twice; a child
// already released but never started is sent again, which is harmless.
//
// A child found ended before any run with continuations of its own (an
// operator's Delete ended it while it waited, and ending its own
// continuations failed) is sent too: no other message names it, and its
// message ends them (as CancelContinuations hands an ending on). Without
// it they waited for good (the short soak, seed 2).
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
		case !released && endedUnrun(rec) && len(rec.Children) > 0:
			// Ended while it waited: hand the ending on, below.
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

func parentEnded(parent ledger.Record) string {
	return fmt.Sprintf("parent job %s ended %s", parent.ID, parent.State)
}
