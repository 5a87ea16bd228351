package handler

import (
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

// PermanentError fails a job at once, whatever attempts are left. Return it
// from Work through Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent: (no error)"
	}
	return "permanent: " + e.Err.Error()
}
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying. Permanent(nil) is nil (as
// with fmt.Errorf's %w and errors.Join): `return handler.Permanent(err)`
// with a nil err ends the run in success.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// RetryAfterError asks for the next attempt after Delay instead of the
// backoff. It spends an attempt like any failure.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter asks for the next attempt after d.
func RetryAfter(d time.Duration, err error) error { return &RetryAfterError{Delay: d, Err: err} }

// ErrOrphaned is the cause a dead-letter hook receives (errors.Is) for a
// job whose worker stopped without reporting a result: it died or timed
// out on its last attempt, or its message reached the DLQ because the
// worker crashed on every receive. The record's LastError says which.
var ErrOrphaned = errors.New("nexjob: orphaned job: the worker stopped without reporting a result")

// ErrUnknownKind is the last error of a job whose kind has no worker here.
var ErrUnknownKind = errors.New("nexjob: no worker registered for the job's kind")

// PanicError is a worker panic, turned into a failed attempt.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return fmt.Sprintf("worker panicked: %v", e.Value) }

// ErrNeverStarted is the cause a dead-letter hook receives (errors.Is) for
// a job whose message kept reaching the DLQ although no run of it ever
// started (its claims failed, or every receive came too near the end of
// an invocation), after Options.MaxReturns returns. The record's LastError
// says so; it is not a poison job.
var ErrNeverStarted = errors.New("nexjob: the job never started: its message reached the dead-letter queue before any run of it began")

// TimeoutError is the cause of a run's context ending at the kind's
// Timeout (or, with no deadline and no Timeout, at the end of the lease).
// The run counts as a failed attempt.
type TimeoutError struct{ Timeout time.Duration }

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("nexjob: run timed out after %s", e.Timeout)
}

// transient reports whether an AWS call failed for a passing reason: a
// throttle or a server error that outlasted the SDK's retries, the
// retryer's quota, a timeout. Such a call may be tried again later.
func transient(err error) bool {
	var mae *retry.MaxAttemptsError
	var quota ratelimit.QuotaExceededError
	var timeout interface{ Timeout() bool }
	return errors.As(err, &mae) || errors.As(err, &quota) ||
		errors.As(err, &timeout) && timeout.Timeout() ||
		retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err) == aws.TrueTernary ||
		retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
}

// ArgsError: a job's stored args do not decode into its worker's args
// type (the producer and the worker disagree on the type). The attempt
// fails permanently. Reason locates the fault (field, Go type, JSON kind,
// byte offset) and never quotes a value: the text is stored as the job's
// last error and shown by the CLI and the dashboard (package
// internal/redact).
type ArgsError struct {
	JobID  string
	Type   string // the worker's args type, e.g. "orders.Charge"
	Reason string
}

func (e *ArgsError) Error() string {
	return fmt.Sprintf("nexjob: args of job %s do not decode as %s: %s", e.JobID, e.Type, e.Reason)
}

// ResultError: a result worker's result does not encode as JSON (or its
// JSON is not UTF-8, which DynamoDB refuses). The run fails permanently
// and keeps no result. Reason locates the fault and, like ArgsError's,
// never quotes a value.
type ResultError struct {
	JobID  string
	Type   string // the result's Go type
	Reason string
}

func (e *ResultError) Error() string {
	return fmt.Sprintf("nexjob: the result of job %s (%s) cannot be kept: %s", e.JobID, e.Type, e.Reason)
}
