package handler

import (
	"errors"
	"fmt"
	"time"
)

// PermanentError fails a job at once, whatever attempts are left. Return it
// from Work through Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying.
func Permanent(err error) error { return &PermanentError{Err: err} }

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

// ErrOrphaned is the last error of a job whose worker died (or timed out)
// on every attempt: the lease ran out with no result. Dead-letter hooks see
// it in the record's LastError; match a Go error with errors.Is.
var ErrOrphaned = errors.New("nexjob: orphaned job: the worker stopped without a result and no attempts are left")

// ErrUnknownKind is the last error of a job whose kind has no worker here.
var ErrUnknownKind = errors.New("nexjob: no worker registered for the job's kind")

// PanicError is a worker panic, turned into a failed attempt.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return fmt.Sprintf("worker panicked: %v", e.Value) }
