package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nexjob/nexjob-aws/ledger"
)

// DefaultMapConcurrency is MapOptions.MaxConcurrency's default.
const DefaultMapConcurrency = 10

// MapOptions tune Map. nil takes every default.
type MapOptions struct {
	// MaxConcurrency is how many items run at once. Defaults to
	// DefaultMapConcurrency.
	MaxConcurrency int
	// Completion says when the map is done. The zero value is every item
	// succeeding: the first failure ends the map with its error (items
	// running finish, none more starts).
	Completion Completion
}

// Completion is a Map's completion policy.
type Completion struct {
	// AllSettled runs every item whatever fails: the map's error is nil,
	// each item's own in MapResult.Errs.
	AllSettled bool
	// FirstSuccess ends the map at the first item that succeeds (none
	// more starts; those running are cancelled and their outcome
	// dropped); it fails when every item failed. The winner is recorded
	// (the step name#first): a replay returns it, whatever finishes
	// first then.
	FirstSuccess bool
	// ToleratedFailures and ToleratedShare let that many items, or that
	// share of them (0 to 1), fail before the map fails; the map fails
	// as soon as either one set is passed (0: not set; both 0, none).
	ToleratedFailures int
	ToleratedShare    float64
}

// MapResult is what Map's items returned, by index.
type MapResult[R any] struct {
	Values []R     // an item's result; zero where it failed or did not run
	Errs   []error // an item's error (a *MapItemError); nil where it succeeded or did not run
	Done   []bool  // the item ran to an outcome (success or a failure the map kept)
}

// MapItemError is an item's failure: its index and its error's text
// (recorded: a replay returns the text, not the error's type).
type MapItemError struct {
	Map   string
	Index int
	Err   string
}

func (e *MapItemError) Error() string {
	return fmt.Sprintf("nexjob: map %q item %d: %s", e.Map, e.Index, e.Err)
}

// MapFailedError ends a map whose completion policy failed: the failures
// (in index order) that passed it.
type MapFailedError struct {
	Map      string
	Failures []*MapItemError
}

func (e *MapFailedError) Error() string {
	return fmt.Sprintf("nexjob: map %q failed: %d items failed, the first: %v", e.Map, len(e.Failures), e.Failures[0])
}

func (e *MapFailedError) Unwrap() []error {
	out := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		out[i] = f
	}
	return out
}

// mapOutcome is an item's step: its value, or its failure's text.
type mapOutcome struct {
	V json.RawMessage `json:"v,omitempty"`
	E string          `json:"e,omitempty"`
}

// Map runs fn over items, at most MaxConcurrency at once, each item a
// step of its own (named name#index): the first time an item succeeds
// its result is recorded, and every later run of the job gets it back
// without calling fn, so a retry replays the items that finished and
// runs only the rest. Results are in the items' order.
//
// The completion policy (MapOptions.Completion) says when the map is
// done; when it fails, the items running finish (and are recorded) and
// none more starts. A failure the map keeps (AllSettled, or within the tolerated
// failures) is recorded too, once the map is done, so a later run sees
// the same outcome; a failure that fails the map is not, and the job's
// retry runs that item again. With the steps table
// (ledger.Options.StepsTable) a job holds up to ledger.MaxJobSteps
// items; on the record, ledger.MaxSteps in all.
//
// fn may call Step with names of its own, unique across the items: two
// items that take one name in one run end it with ErrStepRepeated, which
// fails the job for good as outside a map (so does the code's own fault
// in an item: a value over its limit, a recorded type that no longer
// decodes), whatever the completion policy; a Sleep or a wait in an item ends the run once the
// running items return, and the woken run replays the finished items.
// Goroutines of a worker's own may call Step too: a run's steps are safe
// for concurrent use.
//
// Cost: per item, a step's (one PutItem with the steps table); a
// replayed item nothing.
func Map[T, R any](ctx context.Context, name string, items []T, fn func(ctx context.Context, i int, item T) (R, error), o *MapOptions) (MapResult[R], error) {
	res := newMapResult[R](len(items))
	if stepsOf(ctx) == nil {
		return res, ErrNotInRun
	}
	if name == "" || strings.HasPrefix(name, "nexjob:") || strings.Contains(name, "#") {
		return res, Permanent(&ledger.StepError{Name: name, Reason: `a map's name is not empty, does not begin "nexjob:" and has no "#"`})
	}
	var opts MapOptions
	if o != nil {
		opts = *o
	}
	c := opts.Completion
	if opts.MaxConcurrency <= 0 {
		opts.MaxConcurrency = DefaultMapConcurrency
	}
	if c.ToleratedFailures < 0 || c.ToleratedShare < 0 || c.ToleratedShare > 1 {
		return res, Permanent(fmt.Errorf("nexjob: map %q: tolerated failures %d and share %g: want 0 or more, and a share from 0 to 1", name, c.ToleratedFailures, c.ToleratedShare))
	}
	tolerated := func(failed int) bool {
		switch {
		case c.AllSettled:
			return true
		case c.FirstSuccess:
			return failed < len(items)
		}
		ok := true
		if c.ToleratedFailures > 0 || c.ToleratedShare == 0 { // a count, or no limit set: none tolerated
			ok = failed <= c.ToleratedFailures
		}
		if c.ToleratedShare > 0 {
			// An exact share is tolerated: 0.29 of 100 is 28.999999999999996
			// in floating point, and 29 failures are 0.29 of them.
			ok = ok && float64(failed) <= c.ToleratedShare*float64(len(items))*(1+1e-9)
		}
		return ok
	}
	if c.FirstSuccess {
		// The winner, once chosen, is the map's on every run: items
		// running at once may finish in another order on a replay.
		s := stepsOf(ctx)
		raw, ok, err := s.recorded(ctx, name+"#first")
		if err != nil {
			return res, err
		}
		if ok {
			i, err := strconv.Atoi(raw)
			if err != nil || i < 0 || i >= len(items) {
				return res, Permanent(fmt.Errorf("nexjob: map %q: its recorded winner %q is not an item", name, raw))
			}
			v, err := step(ctx, name+"#"+raw, func(context.Context) (mapOutcome, error) {
				return mapOutcome{}, Permanent(fmt.Errorf("nexjob: map %q: its winner's result is not recorded", name))
			})
			if err != nil {
				return res, err
			}
			if err := json.Unmarshal(v.V, &res.Values[i]); err != nil {
				return res, Permanent(fmt.Errorf("nexjob: map %q item %d: its recorded result does not decode: %w", name, i, err))
			}
			res.Done[i] = true
			return res, nil
		}
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		failed   []*MapItemError
		fresh    = map[int]bool{} // failures of this run, not yet recorded
		won      = -1
		stop     bool
		runErr   error // a run's own end (a sleep, a fence, a limit): not an item's failure
		wg       sync.WaitGroup
		sem      = make(chan struct{}, opts.MaxConcurrency)
		itemName = func(i int) string { return name + "#" + strconv.Itoa(i) }
	)
	for i := range items {
		sem <- struct{}{} // a running item's end frees its place
		mu.Lock()
		done := stop
		mu.Unlock()
		if done || mctx.Err() != nil {
			<-sem
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			var v R
			out, err := step(mctx, itemName(i), func(ctx context.Context) (mapOutcome, error) {
				r, err := fn(ctx, i, items[i])
				if err != nil && runFault(err) {
					return mapOutcome{}, err // the code's own fault: every run would meet it
				}
				if err != nil {
					return mapOutcome{}, &itemFailed{err: err}
				}
				b, err := json.Marshal(r)
				if err != nil {
					return mapOutcome{}, Permanent(fmt.Errorf("nexjob: map %q item %d: its result does not encode: %w", name, i, err))
				}
				return mapOutcome{V: b}, nil
			})
			var f *itemFailed
			switch {
			case errors.As(err, &f) && mctx.Err() != nil && errors.Is(f.err, context.Canceled):
				return // cancelled by the map's end: no outcome
			case errors.As(err, &f):
				out.E = f.err.Error()
				mu.Lock()
				fresh[i] = true
				mu.Unlock()
			case err != nil:
				// The run ends in it (a record throttled past the retries, a
				// sleep, a fence): none more starts, and the items running
				// finish and are recorded (not cancelled: a cancelled item's
				// record is lost and its function runs again on the retry;
				// the 20-item attack at -count=20 called four twice).
				mu.Lock()
				if runErr == nil && (mctx.Err() == nil || !errors.Is(err, context.Canceled)) {
					runErr = err
				}
				stop = true
				mu.Unlock()
				return
			case out.E == "" && len(out.V) > 0:
				if err := json.Unmarshal(out.V, &v); err != nil {
					mu.Lock()
					runErr, stop = Permanent(fmt.Errorf("nexjob: map %q item %d: its recorded result does not decode: %w", name, i, err)), true
					mu.Unlock()
					cancel()
					return
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if out.E != "" {
				ie := &MapItemError{Map: name, Index: i, Err: out.E}
				res.Errs[i] = ie
				failed = append(failed, ie)
				if !tolerated(len(failed)) {
					stop = true // none more starts; those running finish, and are recorded
				}
				return
			}
			res.Values[i], res.Done[i] = v, true
			if c.FirstSuccess && won < 0 {
				won, stop = i, true
				cancel()
			}
		})
	}
	wg.Wait()
	if runErr != nil {
		return res, runErr
	}
	if c.FirstSuccess && won >= 0 {
		for i := range res.Done { // the winner alone: the others were cancelled
			if i != won {
				var zero R
				res.Values[i], res.Errs[i], res.Done[i] = zero, nil, false
			}
		}
		if _, err := stepsOf(ctx).record(ctx, name+"#first", strconv.Itoa(won)); err != nil {
			return res, err
		}
		return res, nil
	}
	if !tolerated(len(failed)) || c.FirstSuccess {
		slices.SortFunc(failed, func(a, b *MapItemError) int { return a.Index - b.Index })
		return res, &MapFailedError{Map: name, Failures: failed}
	}
	// The map is done with these failures: kept, so a replay sees them.
	s := stepsOf(ctx)
	for _, f := range failed {
		if fresh[f.Index] {
			b, err := json.Marshal(mapOutcome{E: f.Err})
			if err == nil {
				_, err = s.record(ctx, itemName(f.Index), string(b))
			}
			if err != nil {
				return res, err
			}
		}
		res.Done[f.Index] = true
	}
	return res, nil
}

// itemFailed carries an item's own error out of its step, unrecorded.
type itemFailed struct{ err error }

func (e *itemFailed) Error() string { return e.err.Error() }

// newMapResult is the result of n items, none done.
func newMapResult[R any](n int) MapResult[R] {
	return MapResult[R]{Values: make([]R, n), Errs: make([]error, n), Done: make([]bool, n)}
}

// Parallel runs branches, functions of their own, concurrently: it is Map
// over the branches (each branch the step name#index, at most
// MaxConcurrency at once, the same completion policies, results in the
// branches' order), so a retry replays the branches that finished and
// runs only the rest. A branch may take steps of its own (names unique
// across the branches): they are recorded as they succeed, so a branch
// that failed after two of its steps replays them on its next call and
// goes on from there. Branches of different result types share one R: a
// struct with a field per branch, or json.RawMessage, since a replayed
// branch is not called and only its recorded result comes back.
//
// A nil branch is refused before any runs, with a permanent error.
func Parallel[R any](ctx context.Context, name string, branches []func(ctx context.Context) (R, error), o *MapOptions) (MapResult[R], error) {
	for i, b := range branches {
		if b == nil {
			return newMapResult[R](len(branches)), Permanent(fmt.Errorf("nexjob: parallel %q: branch %d is nil", name, i))
		}
	}
	return Map(ctx, name, branches, func(ctx context.Context, _ int, b func(context.Context) (R, error)) (R, error) {
		return b(ctx)
	}, o)
}

// runFault reports whether an item's error is the code's own fault that
// every run of the job would meet (a step name two items share, a value
// over a limit, a recorded type that no longer decodes, a compensation
// declared in a step): it ends the run for good, as it would outside a
// map, rather than being the item's failure, which a completion policy
// could tolerate and a retry would hand to the other item's record.
func runFault(err error) bool {
	var se *ledger.StepError
	var rt *ResultTypeError
	var cs *CompensateInStepError
	return errors.Is(err, ErrStepRepeated) || errors.As(err, &se) || errors.As(err, &rt) || errors.As(err, &cs)
}
