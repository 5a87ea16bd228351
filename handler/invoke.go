package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/caller"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Child jobs.
//
// A run starts another job as its child (InvokeAsync, or Invoke to start
// and await it in one call) and awaits its result durably (Await,
// AwaitAll): the run ends in a sleep (no compute held, no attempt spent)
// and the child's end wakes the job, whose next run replays its steps and
// reads the child's outcome from its own steps. The child is any job: any
// kind, any queue, with its own attempts, retries, steps and children.
//
// Exactly once: the child is enqueued under a key made of the caller's id
// and the name (a run that enqueued it and died before its step was
// recorded finds the same child), and its start is a step; its outcome is
// recorded once in the caller's steps (the first write wins), so every run
// of the caller reads the same result. A wait that times out records its
// timeout in the child's place: a child that ends after that is not read
// (its outcome is the timeout for ever) and goes on to its own end.
//
// Policies. A child's failure is the caller's error to handle (a
// *ChildFailedError), not a failure of the caller. Cancelling a job
// (enqueue.Client.Cancel, or a cancel seen at a step of a running job)
// cancels the children it started that have not ended, and theirs. A
// caller that fails for good or whose wait times out leaves its children
// running: their ends are recorded and read by nobody. Deleting a child
// (enqueue.Client.Delete) tells its caller nothing: the caller's wait
// times out.
//
// Cost: a child is an enqueue (its key's item and its record, one send)
// and its start step; its end is one transaction of two items in its
// caller's steps table partition and record (4 write units), two reads
// of the caller, and a wake (one update and one send) when the caller
// sleeps in the wait; the caller's run that begins a wait reads its
// record once more after its sleep. Child jobs need the steps table
// (ledger.ErrNoStepsTable).

// Child is a job a run started (InvokeAsync).
type Child struct {
	ID   string // the child's job id
	Name string // the caller's name for it
}

// InvokeOptions are a child's enqueue options (Queue, MaxAttempts, Delay,
// Deadline...; the idempotency key and its policy are the package's) and,
// for Invoke, how long the caller waits for it.
type InvokeOptions struct {
	Enqueue enqueue.Opts
	// Timeout bounds Invoke's wait for the child: MaxWait when zero. The
	// wait's end is recorded by the run that first meets it.
	Timeout time.Duration
}

// ChildFailedError is a child's end other than success, as its caller
// reads it: Failed (its attempts spent, or cancelled) or Expired.
type ChildFailedError struct {
	Child     Child
	State     ledger.State
	Err       string // the child's last error
	Cancelled bool
}

func (e *ChildFailedError) Error() string {
	return fmt.Sprintf("nexjob: child %q (job %s) ended %s: %s", e.Child.Name, e.Child.ID, e.State, e.Err)
}

// ChildTimeoutError: the caller's wait for the child ended before the
// child did. The child goes on; its outcome is not read.
type ChildTimeoutError struct {
	Child   Child
	Timeout time.Duration
}

func (e *ChildTimeoutError) Error() string {
	return fmt.Sprintf("nexjob: child %q (job %s) did not end within %s", e.Child.Name, e.Child.ID, e.Timeout)
}

// Invoke starts args as a child job under name and waits up to o.Timeout
// for its result: InvokeAsync, then Await. The run ends in a sleep the
// first time it meets an unfinished child: the worker must return
// Invoke's error (as Sleep's).
func Invoke[T any](ctx context.Context, name string, args enqueue.JobArgs, o *InvokeOptions) (T, error) {
	var zero T
	c, err := InvokeAsync(ctx, name, args, o)
	if err != nil {
		return zero, err
	}
	timeout := MaxWait
	if o != nil && o.Timeout > 0 {
		timeout = o.Timeout
	}
	return Await[T](ctx, c, timeout)
}

// InvokeAsync starts args as a child job under name, once per job: a
// step (name 1 to 128 bytes, not beginning "nexjob:") whose first run
// enqueues the child, and whose replays return the same child. Awaiting it
// is up to the caller (Await, AwaitAll), or not at all: a child nobody
// awaits runs to its end all the same.
func InvokeAsync(ctx context.Context, name string, args enqueue.JobArgs, o *InvokeOptions) (Child, error) {
	if err := checkUserName(name); err != nil {
		return Child{}, err
	}
	s := stepsOf(ctx)
	if s == nil {
		return Child{}, ErrNotInRun
	}
	var opts *enqueue.Opts
	if o != nil {
		opts = &o.Enqueue
	}
	id, err := step(ctx, ledger.InvokeStep(name), func(ctx context.Context) (string, error) {
		client, err := ClientFrom(ctx) // only to start it: a replay of a started child needs none
		if err != nil {
			return "", err
		}
		res, err := client.EnqueueChild(ctx, caller.Of(s.rec), name, args, opts)
		var de *enqueue.DispatchError
		if errors.As(err, &de) {
			// Recorded, not sent: the dispatch guard sends it; the child
			// is started.
			return res.ID, nil
		}
		if errors.Is(err, enqueue.ErrInvalidInput) || errors.Is(err, ledger.ErrNoStepsTable) {
			return "", Permanent(err) // every run would refuse it again
		}
		return res.ID, err
	})
	if err != nil {
		return Child{}, err
	}
	return Child{ID: id, Name: name}, nil
}

// checkUserName refuses a user's name (a child's, a compensation's,
// a condition's, a patch's) that a step's name could not carry.
func checkUserName(name string) error {
	switch {
	case strings.HasPrefix(name, "nexjob:"):
		return Permanent(&ledger.StepError{Name: name, Reason: `names beginning "nexjob:" are the package's own`})
	case name == "" || len(name) > ledger.MaxStepName || !utf8.ValidString(name):
		return Permanent(&ledger.StepError{Name: name, Reason: fmt.Sprintf("a child's name is 1 to %d bytes of UTF-8", ledger.MaxStepName)})
	}
	return nil
}

// Await waits up to timeout (at most MaxWait; zero or less: MaxWait) for
// child c's end and returns its result decoded as T: a *ChildFailedError
// when it failed or expired, a *ChildTimeoutError when the wait ended
// first. A timeout over MaxWait is a permanent *WaitTooLongError. Until
// it ends, the run ends in a sleep: the worker must return Await's error.
func Await[T any](ctx context.Context, c Child, timeout time.Duration) (T, error) {
	out, err := AwaitAll[T](ctx, []Child{c}, timeout)
	if err != nil {
		var all *ChildrenError
		if errors.As(err, &all) && len(all.Errs) == 1 {
			err = all.Errs[0]
		}
		var zero T
		return zero, err
	}
	return out[0], nil
}

// ChildrenError is AwaitAll's error when some children did not succeed:
// each one's *ChildFailedError or *ChildTimeoutError, in the children's
// order.
type ChildrenError struct{ Errs []error }

func (e *ChildrenError) Error() string {
	return fmt.Sprintf("nexjob: %d children did not succeed; the first: %v", len(e.Errs), e.Errs[0])
}

func (e *ChildrenError) Unwrap() []error { return e.Errs }

// AwaitAll waits up to timeout for every child in cs and returns their
// results in cs's order (each call its own timeout, kept under every
// child in cs): the run sleeps until the last of them ends (each
// end wakes it; a run that finds some still going sleeps again), or the
// wait's end, when each child still going is a *ChildTimeoutError. The
// results of the children that succeeded are set whatever the others
// did; a *ChildrenError lists the others.
func AwaitAll[T any](ctx context.Context, cs []Child, timeout time.Duration) ([]T, error) {
	s := stepsOf(ctx)
	if s == nil {
		return nil, ErrNotInRun
	}
	if len(cs) == 0 {
		return nil, nil
	}
	if timeout <= 0 {
		timeout = MaxWait // no bound given: the longest, as InvokeOptions.Timeout's zero
	}
	if timeout > MaxWait {
		return nil, Permanent(&WaitTooLongError{Name: cs[0].Name, Wait: timeout, Children: true})
	}
	if s.store.StepsTable() == "" {
		return nil, Permanent(ledger.ErrNoStepsTable)
	}
	// The wait's end, recorded by the run that first meets it.
	name, err := awaitName(ctx, s, cs)
	if err != nil {
		return nil, err
	}
	end, err := step(ctx, name, func(context.Context) (int64, error) {
		return s.store.Now().Add(timeout).UnixMilli(), nil
	})
	if err != nil {
		return nil, err
	}
	due := s.store.Now().UnixMilli() >= end
	outcomes := make([]string, len(cs))
	going := false
	for i, c := range cs {
		v, ok, err := s.childOutcome(ctx, c.ID)
		switch {
		case err != nil:
			return nil, err
		case !ok && due:
			// The wait ended first: its timeout takes the child's place,
			// unless the child's end landed just before (first write wins).
			if v, err = s.record(ctx, ledger.ChildStep(c.ID), ledger.TimedOutOutcome); err != nil {
				return nil, err
			}
		case !ok:
			going = true
		}
		outcomes[i] = v
	}
	if going {
		return nil, s.sleep(&sleepError{name: cs[0].Name, until: ledger.Millis(end), children: true})
	}
	out := make([]T, len(cs))
	var errs []error
	for i, c := range cs {
		if err := decodeOutcome(ctx, s, c, outcomes[i], timeout, &out[i]); err != nil {
			var bad *ChildFailedError
			var late *ChildTimeoutError
			if !errors.As(err, &bad) && !errors.As(err, &late) {
				return nil, err
			}
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return out, &ChildrenError{Errs: errs}
	}
	return out, nil
}

// awaitName is the step that keeps the end of a wait for cs: named by
// every child awaited, so two waits of one job for sets that share their
// first child and their count (AwaitAll of a and b, then of a and c) are
// two waits, each with its own timeout. A wait for one child is named by
// it. A wait for several begun before this naming (its first child and
// the count, which such sets shared) keeps the end it recorded.
func awaitName(ctx context.Context, s *steps, cs []Child) (string, error) {
	old := ledger.AwaitStep(cs[0].ID + "+" + strconv.Itoa(len(cs)))
	if len(cs) == 1 {
		return old, nil
	}
	s.mu.Lock()
	_, begun, err := s.value(ctx, old)
	s.mu.Unlock()
	switch {
	case err != nil:
		return "", err // the job's steps unread: the run ends, and the next reads them
	case begun:
		return old, nil
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return old + "+" + shortHash(strings.Join(ids, "\x00"), 10), nil
}

// childOutcome is child id's outcome in the job's steps, if recorded.
func (s *steps) childOutcome(ctx context.Context, id string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.value(ctx, ledger.ChildStep(id))
}

// decodeOutcome sets *v from child c's recorded outcome, or says why not.
func decodeOutcome[T any](ctx context.Context, s *steps, c Child, raw string, timeout time.Duration, v *T) error {
	var o ledger.ChildOutcome
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		return Permanent(fmt.Errorf("nexjob: child %q (job %s): its recorded outcome does not decode: %w", c.Name, c.ID, err))
	}
	switch o.State {
	case ledger.Succeeded:
	case ledger.TimedOutState:
		return &ChildTimeoutError{Child: c, Timeout: timeout}
	default:
		return &ChildFailedError{Child: c, State: o.State, Err: o.Error, Cancelled: o.Cancelled}
	}
	result := o.Result
	if o.Big {
		// Over what a step holds (ledger.MaxStepValueBytes): read from
		// the child's record, by every replay, while the child's
		// retention keeps it (one read each).
		rec, err := s.store.Get(ctx, c.ID)
		if err != nil {
			return fmt.Errorf("nexjob: read the result of child %q (job %s): %w", c.Name, c.ID, err)
		}
		r, err := s.store.ResultOf(ctx, rec) // on the record, or in the blob bucket
		if err != nil {
			return fmt.Errorf("nexjob: read the result of child %q (job %s): %w", c.Name, c.ID, err)
		}
		result = json.RawMessage(r)
	}
	if len(result) == 0 {
		return nil // a child with no result: T's zero value
	}
	if err := json.Unmarshal(result, v); err != nil {
		return Permanent(fmt.Errorf("nexjob: child %q (job %s): its result does not decode as %T: %w", c.Name, c.ID, *v, err))
	}
	return nil
}
