package handler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Compensations.
//
// A run declares a compensation after the step it undoes completed (a
// refund after the charge): Compensate(ctx, "refund", fn). When the job
// then ends Failed for good (a Permanent error, its attempts spent, or a
// cancel), the compensations declared so far run in reverse order, each
// once: each is a step of the job ("nexjob:comp:<name>"), called up to
// three times (StepOptions' retries) and recorded, so a run that dies
// among them runs only the rest the next time. A job that succeeds runs
// none. Declaring is replayed as the code is: the run that ends the job
// knows every compensation whose step completed, in any run before.
//
// Cancel. A running job is asked to stop at its next step (as every job);
// its compensations then run. A job that declared a compensation and
// waits (asleep, in a wait for a signal or for children) is not
// withdrawn, which would end it with no run: enqueue.Client.Cancel asks
// it to stop (ledger.Store.RequestCompensation) and sends it; its next
// run replays the steps that completed (declaring their compensations),
// records nothing new (a new step, a sleep or a wait is refused with
// ledger.ErrCancelRequested, its function not called), runs the
// compensations and ends Failed, marked Cancelled.
//
// How it fails. A compensation still failing after its three calls is
// kept in the job's last error ("compensation %q failed: ..."); the
// others still run, and the job ends Failed all the same (its dead-letter
// hook sees the error). A job whose last attempt's worker died (an orphan
// out of attempts) is failed without a run: its compensations do not run;
// give compensable kinds attempts to spare. A wait that timed out is the
// worker's to answer: return Permanent(err) to end the job and
// compensate. Compensations need the steps table (ledger.ErrNoStepsTable).
//
// Cost: the first declaration of a job marks its record (one UpdateItem,
// once a job); each compensation that runs is a step (one PutItem).

// CompensateInStepError refuses Compensate called inside a step's
// function (a Step's, a Map item's): a replay that replays the step does
// not call its function, so the compensation would not be declared in
// the run that ends the job, and would never run. Declare it after the
// step returned (after Map returned, one per item that needs one).
type CompensateInStepError struct {
	Name string // the compensation's
	Step string // the step whose function it was called in
}

func (e *CompensateInStepError) Error() string {
	return fmt.Sprintf("nexjob: compensation %q declared inside step %q's function: a replay does not call it, and would not declare it; declare it after the step returned", e.Name, e.Step)
}

// compensation is a declared compensation.
type compensation struct {
	name string
	fn   func(context.Context) error
}

// CompensationTries is how many times a compensation's fn is called
// before its error is kept.
const CompensationTries = 3

// Compensate declares fn as the compensation of what the run did before
// it, under name (1 to 128 bytes, not beginning "nexjob:", once a run):
// fn runs once if the job then fails for good or is cancelled. Call it
// after the step it undoes returned, in the worker's own code: inside a
// step's or a Map item's function it is refused
// (*CompensateInStepError, permanent).
func Compensate(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	if err := checkUserName(name); err != nil {
		return err
	}
	s := stepsOf(ctx)
	if s == nil {
		return ErrNotInRun
	}
	if in, ok := ctx.Value(inStepKey{}).(string); ok {
		return Permanent(&CompensateInStepError{Name: name, Step: in})
	}
	if s.store.StepsTable() == "" {
		return Permanent(ledger.ErrNoStepsTable)
	}
	if p := s.pending(); p != nil {
		return p
	}
	s.mu.Lock()
	for _, c := range s.comps {
		if c.name == name {
			s.mu.Unlock()
			return Permanent(fmt.Errorf("%w: compensation %q", ErrStepRepeated, name))
		}
	}
	s.comps = append(s.comps, compensation{name: name, fn: fn})
	mark := !s.rec.Compensable && !s.marked && s.replay == nil
	s.marked = true
	s.mu.Unlock()
	if mark {
		if _, err := s.store.MarkCompensable(ctx, s.rec); err != nil {
			s.mu.Lock()
			s.marked = false
			s.mu.Unlock()
			return err
		}
	}
	return nil
}

// compensate runs the run's declared compensations, last first, and
// returns cause with each one's failure added.
func (h *Handler) compensate(ctx context.Context, rec ledger.Record, cause string) string {
	r := runOf(ctx)
	if r == nil || r.steps == nil {
		return cause // no run: nothing declared
	}
	s := r.steps
	s.mu.Lock()
	comps := slices.Clone(s.comps)
	s.compensating = true
	s.mu.Unlock()
	if len(comps) == 0 {
		return cause
	}
	backoff := func(n int) time.Duration { return time.Duration(n) * 200 * time.Millisecond }
	o := &StepOptions{MaxAttempts: CompensationTries, Backoff: backoff}
	for i := len(comps) - 1; i >= 0; i-- {
		c := comps[i]
		if i < len(comps)-1 {
			// Still the job's run? A run whose lease a newer run took
			// (it compensates too, from the records) stops here: each
			// compensation once (one GetItem per compensation after the
			// first).
			if err := s.store.Look(ctx, rec); errors.Is(err, ledger.ErrFenced) {
				h.log.WarnContext(ctx, "nexjob: a newer run took the job while it compensated; it compensates the rest", "job_id", rec.ID, "kind", rec.Kind)
				return cause
			}
		}
		step := ledger.CompensationStep(c.name)
		ran := false
		_, err := stepWith(ctx, step, o, func(ctx context.Context) (bool, error) {
			err := c.fn(ctx)
			ran = err == nil
			return true, err
		})
		for try := 1; err != nil && ran && try < CompensationTries && !errors.Is(err, ledger.ErrFenced); try++ {
			// It ran; its record failed (a throttle past the SDK's
			// retries): the record is written again, fn not called.
			time.Sleep(backoff(try))
			_, err = s.record(ctx, step, "true")
		}
		if err != nil && ran {
			h.log.ErrorContext(ctx, "nexjob: compensation ran, and its record could not be written", "job_id", rec.ID, "kind", rec.Kind, "compensation", c.name, "err", err)
			cause = fmt.Sprintf("%s; compensation %q ran and its record failed (it may run again): %v", cause, c.name, err)
			continue
		}
		if err != nil {
			h.log.ErrorContext(ctx, "nexjob: compensation failed", "job_id", rec.ID, "kind", rec.Kind, "compensation", c.name, "err", err)
			cause = fmt.Sprintf("%s; compensation %q failed: %v", cause, c.name, err)
			continue
		}
		h.log.InfoContext(ctx, "nexjob: compensated", "job_id", rec.ID, "kind", rec.Kind, "compensation", c.name)
	}
	return cause
}

// stopRefusal is what a run asked to stop and compensate answers to
// anything new (a step's call, a sleep, a wait).
func (s *steps) stopRefusal() error {
	s.stopped = true
	return Permanent(fmt.Errorf("%w: %s", ledger.ErrCancelRequested, s.rec.CancelReq))
}

// stopping reports whether the run was asked to stop and compensate (a
// cancel of a compensable job while it waited) and is not compensating.
func (s *steps) stopping() bool {
	return s.rec.CancelReq != "" && s.rec.Compensable && !s.compensating
}
