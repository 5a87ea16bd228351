package handler

import (
	"context"
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
// after the step it undoes returned.
func Compensate(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	if err := checkUserName(name); err != nil {
		return err
	}
	s := stepsOf(ctx)
	if s == nil {
		return ErrNotInRun
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
	o := &StepOptions{MaxAttempts: CompensationTries, Backoff: func(n int) time.Duration { return time.Duration(n) * 200 * time.Millisecond }}
	for i := len(comps) - 1; i >= 0; i-- {
		c := comps[i]
		_, err := stepWith(ctx, ledger.CompensationStep(c.name), o, func(ctx context.Context) (bool, error) { return true, c.fn(ctx) })
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
