package enqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.opentelemetry.io/otel/attribute"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Flow is a job and the jobs that continue it, enqueued together by
// EnqueueFlow (BullMQ's flows, River Pro's workflows): Then run once the
// job Succeeded, each a Flow of its own; Join, with two or more Then,
// runs once every one of them Succeeded (a fan-in, as ContinueWhenAll).
type Flow struct {
	Args JobArgs
	Opts *Opts
	Then []Flow
	Join *Flow
}

// FlowResult is what EnqueueFlow made: the flow's job, and each
// continuation as its Flow placed it. A duplicate (an active job held
// the first job's key) has no Then or Join: the flow is the one its
// holder was enqueued with.
type FlowResult struct {
	Result
	Then []FlowResult
	Join *FlowResult
}

// MaxFlowJobs bounds the jobs of one flow: one DynamoDB transaction
// writes them all (100 items, two of which may move aside the ended
// holder of the first job's key).
const MaxFlowJobs = 98

// EnqueueFlow writes a job and its continuations (Then, and Join's fan-in,
// to any depth) in one DynamoDB transaction, then sends the first job:
// none of them exists without the others, and no continuation can meet
// its parent ended, since the parent runs only after the transaction
// (a continuation added by a second call, ContinueWith, can: a fast
// worker's parent may have Failed first, a *ParentEndedError).
//
// The flow is idempotent by its first job's key, with that job's
// DuplicatePolicy: while its job is active, a repeat returns it as a
// duplicate and writes nothing; after it ended, the policy decides as
// for Enqueue. Continuations take no key of their own (the flow's is the
// first job's: an *InputError, a kind's KeyByArgs included), no Delay,
// RunAt or Debounce (they run when their parents are done); the first job
// takes every Opts but Debounce and ReplaceEnded (the transaction moves
// an ended holder aside). A RateLimit on any job takes its slot before
// the commit, except on a repeat whose first job is still active (its
// duplicate takes none). A flow whose jobs weigh more than MaxFlowBytes
// (DynamoDB's 4 MB per transaction) is an *InputError.
// Bad input is an *InputError and nothing is written; more than
// MaxFlowJobs jobs, or more than ledger.MaxChildren continuations of
// one job, or a Join with fewer than 2 or more than ledger.MaxParents
// parents, too.
//
// A commit of unknown outcome is read back (found: committed); a send
// that fails is a *DispatchError with the flow recorded, its first job
// marked unsent (the dispatch guard sends it), as for Enqueue.
//
// Cost: one TransactWriteItems of n items (2n write units; a keyed first
// job's key is read first, one read unit) and one send.
func (c *Client) EnqueueFlow(ctx context.Context, f Flow) (FlowResult, error) {
	ctx, span := c.startSpan(ctx, "enqueue_flow")
	res, err := c.enqueueFlow(ctx, f)
	span.SetAttributes(attribute.Int("nexjob.flow_jobs", countFlow(f)))
	endSpan(span, res.Result, err)
	return res, err
}

// flowNode is a job of a flow, its record built and its id chosen.
type flowNode struct {
	rec       ledger.Record
	opts      Opts
	res       *FlowResult
	underRoot bool // a continuation of the first job: its ParentID is the first job's, known at its Prepare
}

func countFlow(f Flow) int {
	n := 1
	for _, t := range f.Then {
		n += countFlow(t)
	}
	if f.Join != nil {
		n += countFlow(*f.Join)
	}
	return n
}

func (c *Client) enqueueFlow(ctx context.Context, f Flow) (FlowResult, error) {
	if n := countFlow(f); n > MaxFlowJobs {
		return FlowResult{}, invalid("Flow", fmt.Sprintf("%d jobs; a flow takes at most %d (one transaction)", n, MaxFlowJobs))
	}
	var out FlowResult
	var members []*flowNode
	root, err := c.flowNode(f, true, &out)
	if err != nil {
		return FlowResult{}, err
	}
	// Ids first: a parent's record names its children, a child its parents.
	if err := c.flowChildren(f, root, &members); err != nil {
		return FlowResult{}, err
	}
	if n := flowBytes(append([]*flowNode{root}, members...)); n > MaxFlowBytes {
		return FlowResult{}, invalid("Flow", fmt.Sprintf("its jobs weigh about %d bytes; one transaction takes at most %d", n, MaxFlowBytes))
	}
	held, err := c.flowHeld(ctx, root, members)
	if err != nil {
		return FlowResult{}, err
	}
	for _, n := range append([]*flowNode{root}, members...) {
		if held {
			break // a repeat of an active flow: its duplicate, no slot
		}
		if err := c.admit(ctx, n.rec, &n.opts); err != nil {
			return FlowResult{}, err
		}
	}
	for range maxLinkTries {
		tx, err := c.prepareTx(ctx, root.rec, root.opts)
		if err != nil {
			return FlowResult{}, err
		}
		if tx.Result.Duplicate {
			res, err := c.Settle(ctx, tx, nil)
			return FlowResult{Result: res}, err
		}
		// The first job's id is chosen by its Prepare (a keyed one's
		// carries its key): its children name it now.
		items := tx.Items[:len(tx.Items):len(tx.Items)]
		for _, m := range members {
			if m.underRoot {
				m.rec.ParentID = tx.rec.ID
			}
			p, err := c.store.PrepareAs(m.rec, m.rec.ID, m.opts.DuplicatePolicy)
			if err != nil {
				return FlowResult{}, c.flowInputError(err)
			}
			items = append(items, p.Items...)
		}
		err = c.store.Commit(ctx, items)
		var tce *types.TransactionCanceledException
		if errors.As(err, &tce) && keyMoved(tce, len(tx.Items)) {
			// The first job's key changed hands since it was read, or our
			// own commit applied and its resend (a lost reply) failed on
			// the first job's items alone (a flow of one job): its fresh
			// id tells. Found (or the read failed), Settle decides.
			if _, gerr := c.store.Get(ctx, tx.rec.ID); errors.Is(gerr, ledger.ErrNotFound) {
				continue // decide again
			}
		}
		res, err := c.Settle(ctx, tx, err)
		if errors.Is(err, ErrTxNotCommitted) {
			return FlowResult{}, err
		}
		out.Result = res
		if res.ID != "" {
			c.log.InfoContext(ctx, "nexjob: flow enqueued", "job_id", res.ID, "kind", res.Kind, "jobs", 1+len(members))
		}
		return out, err
	}
	return FlowResult{}, ledger.ErrContention
}

// MaxFlowBytes bounds a flow's items: DynamoDB refuses a transaction
// over 4 MB in all.
const MaxFlowBytes = 4_000_000

// flowRecordRoom is what a record weighs beyond its args, at most (its
// fixed fields, its links; ledger's reserve for a record's later writes
// is larger and not part of the insert).
const flowRecordRoom = 2 << 10

// flowBytes estimates a flow's transaction: each job's args and room for
// its fields (an ended holder moved aside weighs one more record, within
// the margin MaxFlowBytes leaves).
func flowBytes(nodes []*flowNode) int {
	n := 0
	for _, m := range nodes {
		n += len(m.rec.Args) + flowRecordRoom
	}
	return n
}

// flowHeld reports whether an active job holds the flow's first key, so
// that a repeat is its duplicate without taking the continuations' rate
// slots (a repeat refused by a continuation's limit was the flow's own
// retry refused). One read, only when a continuation is rate limited.
func (c *Client) flowHeld(ctx context.Context, root *flowNode, members []*flowNode) (bool, error) {
	if root.opts.IdempotencyKey == "" || !slices.ContainsFunc(members, func(m *flowNode) bool { return m.opts.RateLimit != nil }) {
		return false, nil
	}
	holder, err := c.store.GetByKey(ctx, root.opts.IdempotencyKey)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return false, nil
	case err != nil:
		return false, c.missing(err)
	}
	return !holder.State.Terminal(), nil
}

// keyMoved reports whether a cancelled flow transaction failed on its
// first job's items alone (n of them): its key's holder changed since it
// was read. Any other cancellation is the commit's error.
func keyMoved(tce *types.TransactionCanceledException, n int) bool {
	moved := false
	for i, r := range tce.CancellationReasons {
		switch code := aws.ToString(r.Code); {
		case code == "" || code == "None":
		case i < n && (code == "ConditionalCheckFailed" || code == "TransactionConflict"):
			moved = true
		default:
			return false
		}
	}
	return moved
}

func (c *Client) flowInputError(err error) error {
	if errors.Is(err, ledger.ErrItemTooLarge) {
		return &InputError{Field: "args", Reason: "too large for a job record", Err: err}
	}
	return c.missing(err)
}

// flowNode validates one job of a flow and builds its record. A
// continuation gets its id now (its parents' records name it).
func (c *Client) flowNode(f Flow, first bool, res *FlowResult) (*flowNode, error) {
	o := effective(f.Args, f.Opts)
	via := viaEnqueueTx // a transaction commits new jobs; a fold is no part of it
	if !first {
		switch {
		case o.IdempotencyKey != "":
			return nil, invalid("IdempotencyKey", "a flow's continuation takes no key of its own: the flow is idempotent by its first job's key")
		case o.Delay != 0 || !o.RunAt.IsZero():
			return nil, invalid("Delay", "a continuation runs when its parents are done; Delay and RunAt do not apply")
		}
		via = viaContinue
	}
	rec, err := c.newRecord(f.Args, &o, via)
	if err != nil {
		return nil, err
	}
	if !first && o.IdempotencyKey != "" { // its kind's KeyByArgs made one
		return nil, invalid("IdempotencyKey", "a flow's continuation takes no key of its own (its kind's Defaults.KeyByArgs made one): the flow is idempotent by its first job's key")
	}
	if !first {
		rec.State, rec.ID = ledger.AwaitingContinuation, ledger.NewJobID()
		res.ID, res.Kind, res.State = rec.ID, rec.Kind, rec.State
	}
	return &flowNode{rec: rec, opts: o, res: res}, nil
}

// flowChildren builds the continuations of parent (the job of f), depth
// first, linking each to its parents.
func (c *Client) flowChildren(f Flow, parent *flowNode, members *[]*flowNode) error {
	if len(f.Then) > ledger.MaxChildren {
		return invalid("Then", fmt.Sprintf("%d continuations; a job takes at most %d", len(f.Then), ledger.MaxChildren))
	}
	if f.Join != nil && (len(f.Then) < 2 || len(f.Then) > ledger.MaxParents) {
		return invalid("Join", fmt.Sprintf("a fan-in of %d jobs; Join needs 2 to %d Then", len(f.Then), ledger.MaxParents))
	}
	parent.res.Then = make([]FlowResult, len(f.Then))
	var then []*flowNode
	for i, t := range f.Then {
		n, err := c.flowNode(t, false, &parent.res.Then[i])
		if err != nil {
			return err
		}
		n.rec.ParentID, n.underRoot = parent.rec.ID, parent.rec.ID == ""
		then = append(then, n)
		*members = append(*members, n)
	}
	for _, n := range then {
		parent.rec.Children = append(parent.rec.Children, n.rec.ID)
	}
	if f.Join != nil {
		parent.res.Join = &FlowResult{}
		j, err := c.flowNode(*f.Join, false, parent.res.Join)
		if err != nil {
			return err
		}
		for _, n := range then {
			j.rec.Parents = append(j.rec.Parents, n.rec.ID)
			n.rec.Children = append(n.rec.Children, j.rec.ID)
		}
		*members = append(*members, j)
		if err := c.flowChildren(*f.Join, j, members); err != nil {
			return err
		}
	}
	for i, n := range then {
		if err := c.flowChildren(f.Then[i], n, members); err != nil {
			return err
		}
	}
	return nil
}
