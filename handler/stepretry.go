package handler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// StepOptions are a step's own retry policy and timeout (StepWith). The
// zero value (or nil) is Step: one call of fn, its error the run's.
type StepOptions struct {
	// MaxAttempts is how many times fn may be called in one of the job's
	// attempts: 1 (the default) retries nothing. Once they are spent,
	// fn's last error is the run's (the job's own retry policy decides
	// then, and its next attempt gives the step MaxAttempts again).
	MaxAttempts int
	// Backoff is the pause after fn's n-th failed call (n from 1).
	// Defaults to DefaultStepBackoff.
	Backoff func(n int) time.Duration
	// Retryable says whether fn's error is worth another call. Defaults
	// to every error but a Permanent one (never retried) and the run's
	// own end (its context done).
	Retryable func(error) bool
	// Timeout bounds each call of fn: its context ends then, and the call
	// fails with a *StepTimeoutError (retried as any error). Zero: no
	// bound but the run's.
	Timeout time.Duration
	// Aliases are the names this step was recorded under before it was
	// renamed in code: a job that recorded it under one of them gets that
	// result back, its function not called again (a rename never repeats
	// a side effect). Keep handing the provider StepKey of the first name,
	// so a call whose record was lost is recognised too. Defaults to none.
	Aliases []string
	// WaitInRun: a pause up to this long is waited in the run; a longer
	// one ends the run in a durable sleep (no compute held, no attempt of
	// the job spent) and the run that wakes calls fn again. Defaults to
	// DefaultStepWaitInRun.
	WaitInRun time.Duration
}

// DefaultStepWaitInRun is StepOptions.WaitInRun's default.
const DefaultStepWaitInRun = 10 * time.Second

// DefaultStepBackoff is StepOptions.Backoff's default: 1 s after the
// first failure, doubling, at most an hour.
func DefaultStepBackoff(n int) time.Duration {
	return min(time.Second<<min(max(n-1, 0), 12), time.Hour)
}

// StepTimeoutError: a call of a step's fn outlasted StepOptions.Timeout.
type StepTimeoutError struct {
	Name    string
	Timeout time.Duration
	Err     error // what fn returned
}

func (e *StepTimeoutError) Error() string {
	return fmt.Sprintf("nexjob: step %q: a call outlasted its timeout %s: %v", e.Name, e.Timeout, e.Err)
}

func (e *StepTimeoutError) Unwrap() error { return e.Err }

// StepWith is Step with a retry policy and a timeout of the step's own
// (o; nil is Step). A failing call of fn is retried under the policy
// without failing the run or spending one of the job's attempts: after a
// short pause (up to WaitInRun) in the run, after a longer one in a
// durable sleep. Each failure is recorded on the job before its retry
// (a step of the package's own, named "nexjob:try:…", with the error's
// text cut to 512 bytes: counted in the steps' limits), so a run that
// dies or sleeps between two calls resumes the count where it was, and an
// operator sees each one. The step's result is recorded as Step records
// it, once fn succeeds; a step whose result is recorded is never called
// again, whatever its policy.
//
// Cost: Step's, and per retry one UpdateItem (its failure), and for a
// durable pause the sleep's (its step, the run's end and the woken run's
// claim, and a send).
func StepWith[T any](ctx context.Context, name string, o *StepOptions, fn func(ctx context.Context) (T, error)) (T, error) {
	if strings.HasPrefix(name, "nexjob:") {
		var zero T
		return zero, Permanent(&ledger.StepError{Name: name, Reason: `names beginning "nexjob:" are the package's own (signals, waits, retries)`})
	}
	return stepWith(ctx, name, o, fn)
}

// callStep calls fn under o's policy for the step name (see StepWith).
func callStep[T any](ctx context.Context, s *steps, name string, o *StepOptions, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if o == nil {
		return fn(ctx)
	}
	tries := max(o.MaxAttempts, 1)
	wait := cmp.Or(o.WaitInRun, DefaultStepWaitInRun)
	backoff := o.Backoff
	if backoff == nil {
		backoff = DefaultStepBackoff
	}
	job := s.rec.Attempt
	n, err := s.failures(ctx, job, name)
	if err != nil {
		return zero, err
	}
	if n > 0 && backoff(n) > wait {
		// Woken from the pause after failure n (or come back early: it
		// sleeps again to the recorded end).
		if err := sleepUntil(ctx, retryName("retry", job, n, name), s.store.Now().Add(backoff(n))); err != nil {
			return zero, err
		}
	}
	for {
		n++
		v, err := callOnce(ctx, name, o.Timeout, fn)
		if err == nil {
			return v, nil
		}
		if n >= tries || !retryable(ctx, o, err) {
			return zero, err
		}
		text := err.Error()
		if len(text) > maxTryError {
			text = strings.ToValidUTF8(text[:maxTryError], "")
		}
		if _, rerr := step(ctx, retryName("try", job, n, name), func(context.Context) (string, error) { return text, nil }); rerr != nil {
			return zero, rerr
		}
		d := backoff(n)
		log := Logger(ctx)
		log.InfoContext(ctx, "nexjob: step failed; it is retried", "step", name, "try", n, "of", tries, "retry_in", d, "err", err)
		if d > wait {
			if err := sleepUntil(ctx, retryName("retry", job, n, name), s.store.Now().Add(d)); err != nil {
				return zero, err // the run ends in the pause; the woken run calls fn again
			}
			continue
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return zero, err
		case <-t.C:
		}
	}
}

// maxTryError bounds a failure's recorded text, in bytes.
const maxTryError = 512

// callOnce is one call of fn, bounded by timeout (0: not).
func callOnce[T any](ctx context.Context, name string, timeout time.Duration, fn func(context.Context) (T, error)) (T, error) {
	if timeout <= 0 {
		return fn(ctx)
	}
	cause := &StepTimeoutError{Name: name, Timeout: timeout}
	cctx, cancel := context.WithTimeoutCause(ctx, timeout, cause)
	defer cancel()
	v, err := fn(cctx)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), cause) {
		cause.Err = err
		return v, cause
	}
	return v, err
}

// retryable reports whether err, fn's, is worth another call.
func retryable(ctx context.Context, o *StepOptions, err error) bool {
	var perm *PermanentError
	var sleep *sleepError
	switch {
	case errors.As(err, &perm), errors.As(err, &sleep), ctx.Err() != nil:
		return false
	case o.Retryable != nil:
		return o.Retryable(err)
	}
	return true
}

// failures counts the recorded failures of step name in the job's
// attempt job.
func (s *steps) failures(ctx context.Context, job int, name string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < 1<<16 {
		_, ok, err := s.value(ctx, retryName("try", job, n+1, name))
		if err != nil || !ok {
			return n, err
		}
		n++
	}
	return n, nil
}

// retryName is the package's own step that keeps a step's n-th failure
// (kind "try") or the pause after it ("retry") in the job's attempt job:
// the step's name hashed, so any name the ledger takes fits.
func retryName(kind string, job, n int, name string) string {
	return "nexjob:" + kind + ":" + strconv.Itoa(job) + ":" + strconv.Itoa(n) + ":" + shortHash(name, 10)
}
