package enqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// CancelContinuations ends every child still waiting on parent as the
// parent ended (Failed or Expired; Failed for a parent in any other
// state), with the reason (a reason of "" names the parent and its
// state); the record is kept for retention. A child already released or
// ended is left alone, so a replay cancels nothing twice.
//
// The ending goes down the whole tree: a child it ends that has
// continuations of its own (a fan-in child, a keyed child holding its
// key, any depth) is sent its message, and the worker that receives it
// finds it ended with children and ends them in turn, as it does for the
// replay of any ended parent. Each message ends one level of one job, at
// most ledger.MaxChildren updates and sends, whatever the tree's size. A
// crash mid-way is resumed by the parent's message coming back: a child
// found ended unrun with children of its own is sent its message again
// (a second one is harmless: its children are ended once).
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
		if err := c.endChild(ctx, id, as, reason, exp); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nexjob: end the continuations of %s: %w", parent.ID, errors.Join(errs...))
	}
	return nil
}

// endChild ends the waiting continuation id as as (Cancel) and, if it
// has continuations of its own, sends its message so that a worker ends
// them (see CancelContinuations). A child found ended without a run
// (Failed or Expired at attempt 0) with children is sent again: the
// earlier ending's send may be the one a crash cut off.
func (c *Client) endChild(ctx context.Context, id string, as ledger.State, reason string, exp time.Time) error {
	rec, _, err := c.store.Cancel(ctx, id, as, reason, exp)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return nil
	case err != nil:
		return err
	case !endedUnrun(rec) || len(rec.Children) == 0:
		return nil // released, running or ran, or nothing below it
	}
	if err := c.Dispatch(ctx, rec); err != nil {
		return fmt.Errorf("nexjob: hand the ending of %s on to its continuations: %w", rec.ID, c.missing(err))
	}
	return nil
}

// endedUnrun: the job ended Failed or Expired before any run (a parent's
// end, an operator's cancel, a deadline).
func endedUnrun(rec ledger.Record) bool {
	return (rec.State == ledger.Failed || rec.State == ledger.Expired) && rec.Attempt == 0
}
