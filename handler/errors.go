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
