package enqueue

import (
	"errors"
	"fmt"

	"github.com/nexjob/nexjob-aws/ledger"
)

// DuplicateJobError is returned when the DuplicatePolicy rejects an enqueue
// because a job with the same key is in a terminal state. Nothing was
// written. Match it with errors.As.
//
// Its message never contains the key itself (keys may hold personal data);
// the Key field is for the caller's own use.
type DuplicateJobError struct {
	ExistingJobID string          // the job that holds the key
	ExistingState ledger.State    // its terminal state
	ExistingKind  string          // its kind
	Policy        DuplicatePolicy // the policy that rejected the enqueue
	Key           string          // the idempotency key as the caller gave it
	KeyHash       string          // the key's stored hash
}

func (e *DuplicateJobError) Error() string {
	return fmt.Sprintf("nexjob: duplicate job rejected by %s: job %s is %s", e.Policy, e.ExistingJobID, e.ExistingState)
}

// duplicateFrom converts the ledger's rejection.
func duplicateFrom(d *ledger.DuplicateJobError) *DuplicateJobError {
	return &DuplicateJobError{ExistingJobID: d.ExistingJobID, ExistingState: d.ExistingState, ExistingKind: d.ExistingKind, Policy: d.Policy, Key: d.Key, KeyHash: d.KeyHash}
}

// ErrUnknownQueue: a queue name that ClientOptions.Queues does not hold.
// Enqueue refuses it as an *InputError (Field "Queue"), nothing written.
var ErrUnknownQueue = errors.New("nexjob: unknown queue")

// ErrInvalidInput matches every *InputError with errors.Is.
var ErrInvalidInput = errors.New("nexjob: invalid input")

// InputError reports bad input to Enqueue. Nothing was written to DynamoDB
// and nothing was sent to SQS.
type InputError struct {
	Field  string // the option or argument at fault, e.g. "IdempotencyKey"
	Reason string
	Err    error // the underlying cause, if any
}

func (e *InputError) Error() string {
	return fmt.Sprintf("nexjob: invalid %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// Unwrap returns the underlying cause.
func (e *InputError) Unwrap() error { return e.Err }

func invalid(field, reason string) error { return &InputError{Field: field, Reason: reason} }

// DispatchError reports that the job was written to the ledger but its SQS
// message was not sent. The job exists (JobID) and is not lost: see the
// package documentation for how it is recovered.
type DispatchError struct {
	JobID string
	Err   error
}

func (e *DispatchError) Error() string {
	return fmt.Sprintf("nexjob: job %s recorded but not sent to SQS: %v", e.JobID, e.Err)
}

func (e *DispatchError) Unwrap() error { return e.Err }

// MissingResourceError reports that the ledger table or the job queue does
// not exist (or is not visible with these credentials and region).
type MissingResourceError struct {
	Resource string // table name or queue URL
	Err      error
}

func (e *MissingResourceError) Error() string {
	return fmt.Sprintf("nexjob: %s does not exist: %v", e.Resource, e.Err)
}

func (e *MissingResourceError) Unwrap() error { return e.Err }

// ParentEndedError: ContinueWith on a parent that Failed or Expired. Such a
// parent never succeeds, so a child of it could never run. Nothing was
// written.
type ParentEndedError struct {
	ParentID string
	State    ledger.State // Failed or Expired
}

func (e *ParentEndedError) Error() string {
	return fmt.Sprintf("nexjob: parent job %s is %s; a continuation of it would never run", e.ParentID, e.State)
}
