package enqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nexjob/nexjob-aws/internal/caller"
	"github.com/nexjob/nexjob-aws/ledger"
)

// childKeyPrefix begins a child job's idempotency key (its caller's id
// and name follow): the package's own, refused to any other enqueue.
const childKeyPrefix = "nexjob-child:"

// argsKeyPrefix begins the key a kind's Defaults.KeyByArgs gives a job
// (its kind and a hash of its args follow): the package's own, refused
// as a key of the caller's.
const argsKeyPrefix = "nexjob-args:"

// Child jobs: the producer's half of handler.Invoke. See ledger's
// ChildEnded for how a child's end reaches its caller.

// EnqueueChild enqueues args as a child of caller under the caller's name
// for it (handler.InvokeAsync calls it inside a step): its idempotency key
// is the caller's id and the name, so a run that enqueued it and died
// before recording the step finds the same child again (the key's
// holder, active or ended: the policy is RejectAlways, and the ended
// holder is returned, not refused). opts' key and policy are the
// package's; its other fields apply as to Enqueue. The child's record
// names caller (Record.Caller): its end is recorded in the caller's steps
// and wakes it.
//
// Only the caller's run can call it: a caller.Caller is made by package
// handler, and by no code outside this module (the zero one is refused),
// so nobody who can enqueue can name another's job as a child's caller.
// Keys beginning "nexjob-child:" are refused to every other enqueue.
func (c *Client) EnqueueChild(ctx context.Context, from caller.Caller, name string, args JobArgs, opts *Opts) (Result, error) {
	if c.store.StepsTable() == "" {
		return Result{}, ledger.ErrNoStepsTable
	}
	caller := from.Record()
	if caller.ID == "" {
		return Result{}, invalid("caller", "no job: a child is started by its caller's run (handler.InvokeAsync)")
	}
	o := effective(args, opts)
	if o.Debounce != nil {
		return Result{}, invalid("Debounce", "a child job is not debounced")
	}
	o.IdempotencyKey = childKeyPrefix + caller.ID + ":" + name
	o.DuplicatePolicy, o.RequestID, o.RequestTime, o.ReplaceEnded = RejectAlways, "", time.Time{}, false
	rec, err := c.newRecord(args, &o, viaChild)
	if err != nil {
		return Result{}, err
	}
	rec.Caller = caller.ID
	res, err := c.submit(ctx, rec, &o, viaChild)
	var dup *DuplicateJobError
	if errors.As(err, &dup) {
		// The child this name started before, ended: it is the child.
		return Result{ID: dup.ExistingJobID, Kind: dup.ExistingKind, State: dup.ExistingState, Duplicate: true}, nil
	}
	return res, err
}

// ChildEnded tells ended child's caller (Record.Caller) of its end: the
// outcome recorded in the caller's steps (ledger.Store.ChildEnded), and
// the caller woken when it sleeps in a wait for children (its message sent
// at once). A caller that is gone is no error. Called again after an error
// (the worker's message comes back), it adds nothing twice.
func (c *Client) ChildEnded(ctx context.Context, child ledger.Record) error {
	caller, err := c.store.ChildEnded(ctx, child)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return c.wakeForChildren(ctx, caller)
}

// wakeForChildren makes rec due now and sends it, if it sleeps in a wait
// for children.
func (c *Client) wakeForChildren(ctx context.Context, rec ledger.Record) error {
	if !c.store.WaitingChildren(rec) {
		return nil
	}
	out, ok, err := c.store.Wake(ctx, rec)
	if err != nil {
		return fmt.Errorf("nexjob: wake job %s for its children: %w", rec.ID, err)
	}
	if !ok {
		return nil // it moved on: whatever moved it sends it
	}
	return c.sendNow(ctx, out)
}

// CancelChildren cancels the children rec started (handler.InvokeAsync)
// whose end its steps do not hold: a job cancelled, or stopped by a
// cancel at a step, takes its unfinished children with it (each with
// Cancel: a running one is asked to stop at its next step, and their own
// children follow them). One Query of rec's steps, and a Cancel per child
// still going. Children that ended meanwhile are no error.
func (c *Client) CancelChildren(ctx context.Context, rec ledger.Record, retention time.Duration) error {
	if c.store.StepsTable() == "" {
		return nil
	}
	off, err := c.store.LoadSteps(ctx, rec)
	if err != nil {
		return err
	}
	var errs []error
	for name, v := range off.Values {
		if _, ok := ledger.IsInvokeStep(name); !ok {
			continue
		}
		var id string
		if json.Unmarshal([]byte(v), &id) != nil || id == "" {
			continue
		}
		if _, ended := off.Values[ledger.ChildStep(id)]; ended {
			continue
		}
		_, err := c.Cancel(ctx, id, "its caller "+rec.ID+" was cancelled", retention)
		var notNow *NotCancellableError
		var asked *CancelRequestedError
		if err != nil && !errors.As(err, &notNow) && !errors.As(err, &asked) && !errors.Is(err, ledger.ErrNotFound) {
			errs = append(errs, fmt.Errorf("nexjob: cancel child %s of job %s: %w", id, rec.ID, err))
		}
	}
	return errors.Join(errs...)
}
