package idempotency

import (
	"errors"
	"fmt"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// ErrNoKey: a call with an empty key (or an event its key expression finds
// nothing in). Nothing ran.
var ErrNoKey = errors.New("nexjob: idempotency key is empty")

// Sentinels the typed errors match with errors.Is.
var (
	ErrInProgress      = errors.New("nexjob: an earlier call with this key is in progress")
	ErrPayloadMismatch = errors.New("nexjob: the key was used with a different payload")
	ErrDuplicate       = errors.New("nexjob: the key's recorded outcome is protected by its policy")
	ErrResultTooLarge  = errors.New("nexjob: the call's result is too large to record")
	ErrNotRecorded     = errors.New("nexjob: the call ran but its outcome was not recorded")
)

// FunctionError: New was given a function name it may not use: one
// outside the kinds rule, or one that is not the name the deployment
// gives the function (Deployed, from NEXJOB_IDEMPOTENCY_FUNCTION): a
// function's records are reachable by its own grant only, so a store
// naming another function would write where that function reads.
type FunctionError struct {
	Function string
	Deployed string // "" unless the deployment names another
	Reason   string
}

func (e *FunctionError) Error() string {
	return fmt.Sprintf("nexjob: idempotency function name %q %s", e.Function, e.Reason)
}

// LayoutError: New was given options its Backend's Layout cannot keep
// (Powertools' layout: a policy other than RejectAlways, RecordErrors).
type LayoutError struct{ Err error }

func (e *LayoutError) Error() string {
	return "nexjob: idempotency: the Backend's record layout: " + e.Err.Error()
}

func (e *LayoutError) Unwrap() error { return e.Err }

// InProgressError: a repeat met the first call still holding the key.
// Nothing ran; retry after Until (a call's hold ends by then).
type InProgressError struct {
	KeyHash string
	Until   time.Time
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("nexjob: a call with key %s is in progress until %s", e.KeyHash, e.Until.UTC().Format(time.RFC3339Nano))
}

// Is matches ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// PayloadMismatchError: the key was used before with a different payload
// (CallOptions.Payload, HandlerOptions' payload expression). Nothing ran.
type PayloadMismatchError struct {
	KeyHash string
}

func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("nexjob: key %s was used with a different payload", e.KeyHash)
}

// Is matches ErrPayloadMismatch.
func (e *PayloadMismatchError) Is(target error) bool { return target == ErrPayloadMismatch }

// DuplicateError: the key's first call failed with its error recorded
// (Options.RecordErrors), and the policy protects that outcome (as at
// enqueue: RejectIfFailed, RejectAlways). Nothing ran; Message is the
// recorded error's text.
type DuplicateError struct {
	KeyHash string
	State   ledger.State
	Policy  ledger.DuplicatePolicy
	Message string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("nexjob: key %s already %s (policy %s): %s", e.KeyHash, e.State, e.Policy, e.Message)
}

// Is matches ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// ResultTooLargeError: the first call's result was over MaxResultBytes.
// The first caller gets its result with this error; the key is recorded
// as used without a result, and a repeat gets this error (Replayed) and
// does not run the function.
type ResultTooLargeError struct {
	KeyHash  string
	Bytes    int // 0 on a repeat: the size was not kept
	Limit    int
	Replayed bool
}

func (e *ResultTooLargeError) Error() string {
	if e.Replayed {
		return fmt.Sprintf("nexjob: key %s's first call had a result over %d bytes, not recorded", e.KeyHash, e.Limit)
	}
	return fmt.Sprintf("nexjob: key %s's result is %d bytes, over the %d recorded", e.KeyHash, e.Bytes, e.Limit)
}

// Is matches ErrResultTooLarge.
func (e *ResultTooLargeError) Is(target error) bool { return target == ErrResultTooLarge }

// NotRecordedError: the function ran (its value is returned beside this
// error) but its outcome could not be written, or may not have been: Err
// says why. Throttled past the SDK's retries (or any other write error):
// not recorded; the key stays held until the hold ends, and a repeat
// after that runs the function again. ledger.ErrCallTakenOver: when the
// write was answered, after the call's hold had ended, the key's record
// was no longer the call's, which means one of two things the table
// cannot tell apart: another call took the key after the hold
// ended and this outcome was not recorded (the usual case: a call that
// outran its hold); or this write had been applied, its reply lost, and
// later calls the policy let in replaced or released the outcome before
// the SDK's resend. Either way the key is not this call's now: a repeat
// is answered by whatever the record holds. (Met while the hold had not
// ended, that record can only be this call's own applied write, since
// replaced or released: the outcome was recorded and no error is
// returned.)
type NotRecordedError struct {
	KeyHash string
	Err     error
}

func (e *NotRecordedError) Error() string {
	if errors.Is(e.Err, ledger.ErrCallTakenOver) {
		return fmt.Sprintf("nexjob: key %s: the call ran; when its write was answered, after its hold had ended, the key's record was no longer its: either another call took the key and this outcome was not recorded, or this outcome was recorded (its reply lost) and later calls replaced or released it before the resend", e.KeyHash)
	}
	return fmt.Sprintf("nexjob: key %s: the call ran but its outcome was not recorded: %v", e.KeyHash, e.Err)
}

func (e *NotRecordedError) Unwrap() error { return e.Err }

// Is matches ErrNotRecorded.
func (e *NotRecordedError) Is(target error) bool { return target == ErrNotRecorded }

// UnencodableResultError: the first call's result has no JSON (a NaN, a
// channel, a value whose MarshalJSON fails). The first caller gets its
// result with this error (Err says why); the key is recorded as used
// without a result, and a repeat gets this error (Replayed) and does not
// run the function.
type UnencodableResultError struct {
	KeyHash  string
	Err      error // nil on a repeat
	Replayed bool
}

func (e *UnencodableResultError) Error() string {
	if e.Replayed {
		return fmt.Sprintf("nexjob: key %s's first call had a result with no JSON, not recorded", e.KeyHash)
	}
	return fmt.Sprintf("nexjob: key %s's result has no JSON, not recorded: %v", e.KeyHash, e.Err)
}

func (e *UnencodableResultError) Unwrap() error { return e.Err }

// The error texts a Succeeded record without its result carries.
const (
	tooLargeMark    = "nexjob: result over MaxResultBytes, not recorded"
	unencodableMark = "nexjob: result with no JSON, not recorded"
)
