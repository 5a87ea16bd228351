package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Outcome is what a bulk action did to one job.
type Outcome struct {
	ID  string
	Err error // nil: done, or skipped
	// Skipped says why a job was left as it is though nothing failed
	// (Redrive: a stray copy of a job that Succeeded or was cancelled).
	Skipped string
}

// Report is a bulk action's result, one Outcome per job it tried.
type Report struct {
	Outcomes []Outcome
	// Hidden (Redrive) counts the DLQ messages this run could not see:
	// the queue's depth after it, less what it left there itself. They
	// are in flight, received by someone else (a consumer, a peek from an
	// older version) and visible again when their visibility timeout ends.
	Hidden int
}

// Done counts the jobs the action succeeded on (not the skipped ones).
func (r Report) Done() int {
	n := 0
	for _, o := range r.Outcomes {
		if o.Err == nil && o.Skipped == "" {
			n++
		}
	}
	return n
}

// Skipped counts the jobs the action left alone, each with its reason.
func (r Report) Skipped() int {
	n := 0
	for _, o := range r.Outcomes {
		if o.Skipped != "" {
			n++
		}
	}
	return n
}

// Err joins the failures, each naming its job; nil if there were none.
func (r Report) Err() error {
	var errs []error
	for _, o := range r.Outcomes {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("job %s: %w", o.ID, o.Err))
		}
	}
	return errors.Join(errs...)
}

// Progress is told after each job of a bulk action: done of total tried.
type Progress func(done, total int)

// RequeueAll requeues every job Find(f) returns (f.State must be terminal;
// f.Limit caps how many, 0 for all), telling progress after each. It first
// collects the ids, so the jobs it requeues do not come back into its own
// listing, then requeues them one by one.
//
// Continuations follow enqueue.Client.Requeue's rule: they run only after
// every parent Succeeded. A listed continuation refused because a parent
// of it Failed or Expired (*enqueue.ParentNotSucceededError) is tried
// again after the rest when that parent is listed too: requeued, the
// parent is active, and the continuation then waits for it. One that a
// parent's requeue already put back to waiting is reported skipped
// ("waiting for its parents again"). None runs before its parents.
func (a *Admin) RequeueAll(ctx context.Context, f ledger.Filter, progress Progress) (Report, error) {
	if !f.State.Terminal() {
		return Report{}, fmt.Errorf("nexjob: only terminal jobs can be requeued, not %s ones", f.State)
	}
	max := f.Limit
	var ids []string
	for {
		f.Limit = 100
		if max > 0 && max-len(ids) < f.Limit {
			f.Limit = max - len(ids)
		}
		recs, next, err := a.store.Find(ctx, f)
		if err != nil {
			return Report{}, err
		}
		for _, r := range recs {
			if r.Kind != ledger.DeadLetterKind {
				ids = append(ids, r.ID)
			}
		}
		if next == "" || (max > 0 && len(ids) >= max) {
			break
		}
		f.Cursor = next
	}
	listed := map[string]bool{}
	for _, id := range ids {
		listed[id] = true
	}
	var rep Report
	tried := map[string]bool{} // its requeue's outcome is in rep
	for pending := ids; len(pending) > 0 && ctx.Err() == nil; {
		var later []string
		refused := map[string]error{}
		for _, id := range pending {
			// Only if still as listed: another operator may have requeued
			// it, and it may have Succeeded since.
			_, err := a.client.RequeueFrom(ctx, id, f.State)
			var pns *enqueue.ParentNotSucceededError
			if errors.As(err, &pns) && listed[pns.ParentID] && !tried[pns.ParentID] {
				later, refused[id] = append(later, id), err // after its parent
				continue
			}
			tried[id] = true
			rep.Outcomes = append(rep.Outcomes, requeued(id, err))
			if progress != nil {
				progress(len(rep.Outcomes), len(ids))
			}
			if ctx.Err() != nil {
				break
			}
		}
		if len(later) == len(pending) { // no parent of theirs can come back now
			for _, id := range later {
				rep.Outcomes = append(rep.Outcomes, requeued(id, refused[id]))
			}
			break
		}
		pending = later
	}
	return rep, nil
}

// requeued is the outcome of a bulk requeue of id that returned err: a
// continuation found waiting again (its parent's requeue brought it
// back) is skipped, not failed.
func requeued(id string, err error) Outcome {
	var nt *enqueue.NotTerminalError
	if errors.As(err, &nt) && nt.State == ledger.AwaitingContinuation {
		return Outcome{ID: id, Skipped: "waiting for its parents again: a parent's requeue brought it back"}
	}
	return Outcome{ID: id, Err: err}
}
