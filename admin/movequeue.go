package admin

import (
	"context"
	"errors"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// activeStates are the states whose jobs MoveQueue lists: every active one
// (a running job is listed, to be reported, and left to its run).
var activeStates = []ledger.State{ledger.Enqueued, ledger.Scheduled, ledger.Processing, ledger.AwaitingContinuation}

// JobsOnQueue lists the active jobs (Enqueued, Scheduled, Processing,
// AwaitingContinuation) whose records name the named queue: a Scan of the
// whole table, every record billed (see ledger.Store.FindOnQueue).
func (a *Admin) JobsOnQueue(ctx context.Context, queue string) ([]ledger.Record, error) {
	var all []ledger.Record
	cursor := ""
	for {
		recs, next, err := a.store.FindOnQueue(ctx, queue, activeStates, cursor)
		if err != nil {
			return nil, err
		}
		all = append(all, recs...)
		if next == "" {
			return all, nil
		}
		cursor = next
	}
}

// MoveQueue moves every active job on the named queue from onto to (""
// the job queue): the way out for a queue taken out of NEXJOB_QUEUES
// while jobs named it (or to empty one before it goes). It lists them
// first (JobsOnQueue), then moves them one by one with
// enqueue.Client.MoveQueue, telling progress after each: a waiting job is
// sent to to and its record moved; a continuation still waiting is moved
// (its release sends it); an orphan whose lease ran out is sent and moved,
// and a worker takes it over. A job left alone (running under a live
// lease, ended or moved meanwhile) is reported skipped with why; a
// failure is reported with its job and the rest go on.
//
// Running it again is safe and moves what is left: the ledger lists only
// the jobs still on from, and a job moves by a conditional write on its
// state and fencing token, so none runs twice for it. Messages left on
// from are harmless: a worker that reads one runs the job only if its
// claim succeeds. An unknown to, or from "" or equal to to, is an
// *enqueue.InputError before anything is read.
func (a *Admin) MoveQueue(ctx context.Context, from, to string, progress Progress) (Report, error) {
	if err := a.client.CheckMove(from, to); err != nil {
		return Report{}, err
	}
	recs, err := a.JobsOnQueue(ctx, from)
	if err != nil {
		return Report{}, err
	}
	var rep Report
	for _, r := range recs {
		if ctx.Err() != nil {
			break
		}
		_, err := a.client.MoveQueue(ctx, r.ID, from, to)
		o := Outcome{ID: r.ID, Err: err}
		var nm *enqueue.NotMovedError
		if errors.As(err, &nm) {
			o = Outcome{ID: r.ID, Skipped: nm.Reason()}
		}
		rep.Outcomes = append(rep.Outcomes, o)
		if progress != nil {
			progress(len(rep.Outcomes), len(recs))
		}
	}
	return rep, nil
}
