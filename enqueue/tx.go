package enqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// TxJob is a job prepared for the caller's own DynamoDB transaction
// (EnqueueTx). Put Items into the same TransactWriteItems as your own
// writes, commit, then call Settle with the commit's error.
type TxJob struct {
	// Items create the job (empty for a duplicate): add them to your
	// TransactWriteItems. The transaction takes at most 100 items.
	Items []types.TransactWriteItem
	// Result is the job as it will be once committed: its id, kind and
	// state, or the active duplicate holding the key.
	Result Result
	rec    ledger.Record
	opts   Opts
}

// ErrTxNotCommitted: Settle found the transaction did not commit (the
// job's record is not there). When its cause is a cancelled transaction
// because the key changed hands, EnqueueTx again and retry.
var ErrTxNotCommitted = errors.New("nexjob: the transaction did not commit; the job was not created")

// TxUnknownError: after a commit of unknown outcome, Settle could not read
// the job to tell (the read failed too). The job may exist. Call Settle
// again with the same tx and commit error; do not prepare it again.
type TxUnknownError struct {
	JobID  string
	Commit error // the caller's commit error
	Read   error // Settle's read of the job
}

func (e *TxUnknownError) Error() string {
	return fmt.Sprintf("nexjob: cannot tell whether the transaction committed job %s (commit: %v; reading the job: %v): call Settle again", e.JobID, e.Commit, e.Read)
}

// Unwrap gives both errors to errors.Is and errors.As.
func (e *TxUnknownError) Unwrap() []error { return []error{e.Commit, e.Read} }

// EnqueueTx prepares a job to commit in the caller's own DynamoDB
// transaction, so the job exists if and only if the caller's writes do
// (River's InsertTx). The key's holder is read once and the policy matrix
// applied as Enqueue does: a duplicate is a result (tx.Result.Duplicate,
// no items); a protected terminal holder gives a *DuplicateJobError; the
// items' conditions make the commit fail if the key changes hands in
// between. Bad input is an *InputError; nothing is written before the
// caller commits. A RateLimit takes its slot here, before the commit (a
// transaction that then does not commit has spent it, as an enqueue
// that fails after taking its slot has): over the limit, a
// *RateLimitedError and no items. Debounce is refused (an *InputError):
// a transaction commits a new job, and a fold into a pending one is no
// part of it; so is ReplaceEnded (the transaction moves an ended holder
// aside under its id, it does not overwrite it).
//
//	tx, err := client.EnqueueTx(ctx, Receipt{OrderID: id}, &enqueue.Opts{IdempotencyKey: "receipt-" + id})
//	items := append([]types.TransactWriteItem{orderPut}, tx.Items...)
//	_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
//	res, err := client.Settle(ctx, tx, err)
//
// A crash between the commit and Settle's send leaves the job recorded and
// unsent: the dispatch guard sends it after GuardAfter (and a caller
// retrying its key re-sends it), as for Enqueue.
func (c *Client) EnqueueTx(ctx context.Context, args JobArgs, opts *Opts) (*TxJob, error) {
	o := effective(args, opts)
	rec, err := c.newRecord(args, &o, viaEnqueueTx)
	if err != nil {
		return nil, err
	}
	if err := c.admit(ctx, rec, &o); err != nil {
		return nil, err
	}
	return c.prepareTx(ctx, rec, o)
}

// prepareTx prepares rec, admitted, for a transaction (EnqueueTx, a flow's
// first job): the key's holder read once and the policy matrix applied.
func (c *Client) prepareTx(ctx context.Context, rec ledger.Record, o Opts) (*TxJob, error) {
	p, err := c.store.Prepare(ctx, rec, o.IdempotencyKey, o.DuplicatePolicy)
	var dup *ledger.DuplicateJobError
	switch {
	case errors.As(err, &dup):
		c.metrics.Count(metrics.Rejected, rec.Kind, dup.ExistingJobID)
		return nil, duplicateFrom(dup)
	case errors.Is(err, ledger.ErrItemTooLarge):
		return nil, &InputError{Field: "args", Reason: "too large for a job record", Err: err}
	case err != nil:
		return nil, c.missing(err)
	}
	tx := &TxJob{Items: p.Items, rec: p.Record, opts: o,
		Result: Result{ID: p.Record.ID, Kind: p.Record.Kind, State: p.Record.State, Duplicate: p.Duplicate}}
	if p.Duplicate {
		if err := checkHolder(rec, p.Record, &o); err != nil {
			return nil, err
		}
	}
	return tx, nil
}

// Settle finishes an EnqueueTx after the caller's commit, given the
// commit's error: it sends the job (a duplicate only if it looks unsent).
// A commit error that does not say whether the transaction was applied
// (a lost reply, a timeout) is settled by reading the job: found, it
// committed and is sent. Not found, the error wraps ErrTxNotCommitted
// and the commit's error. When that read fails too, the outcome is still
// unknown: a *TxUnknownError, never ErrTxNotCommitted (re-preparing then
// could make two jobs of one intent); call Settle again with the same
// arguments. A send that fails is a *DispatchError, the job recorded and
// marked, as for Enqueue.
//
// A duplicate's transaction holds no item of nexjob (the key's active
// job exists already), so the commit's error says nothing about the job:
// Settle returns the duplicate whatever commitErr is, and whether the
// caller's own writes committed is for commitErr alone to tell.
func (c *Client) Settle(ctx context.Context, tx *TxJob, commitErr error) (Result, error) {
	if tx == nil {
		return Result{}, invalid("tx", "nil")
	}
	if tx.Result.Duplicate {
		r := ItemResult{Result: tx.Result, Recorded: true, Sent: true}
		c.metrics.Count(metrics.Deduplicated, tx.rec.Kind, tx.rec.ID)
		if c.unsent(tx.rec) {
			r.Redispatched = true
			c.sent(ctx, tx.rec, &r, c.Dispatch(ctx, tx.rec))
		}
		return r.Result, r.Err
	}
	got := tx.rec
	if commitErr != nil {
		bctx, cancel := bookkeeping(ctx)
		defer cancel()
		rec, err := c.store.Get(bctx, tx.rec.ID)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			return Result{}, fmt.Errorf("%w: %w", ErrTxNotCommitted, commitErr)
		case err != nil:
			return Result{}, &TxUnknownError{JobID: tx.rec.ID, Commit: commitErr, Read: err}
		}
		got = rec
	}
	r := ItemResult{Result: tx.Result, Recorded: true}
	c.sent(ctx, got, &r, c.Dispatch(ctx, got))
	return r.Result, r.Err
}
