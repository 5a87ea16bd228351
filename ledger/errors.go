package ledger

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNotFound: no job has this id, or its record is past its retention.
	ErrNotFound = errors.New("nexjob: job not found")
	// ErrBadID: the string cannot be a job id; nothing was read.
	ErrBadID = errors.New("nexjob: malformed job id")
	// ErrItemTooLarge: the record would exceed DynamoDB's 400 KB item limit.
	ErrItemTooLarge = errors.New("nexjob: job record over DynamoDB's item size limit")
	// ErrContention: a write lost its condition to concurrent writers more
	// times than it retries. Nothing of this call was written; retry it.
	ErrContention = errors.New("nexjob: too much contention on the idempotency key")
)

// DuplicateJobError is returned when the DuplicatePolicy rejects an enqueue
// because a job with the same idempotency key is in a terminal state.
// Nothing was written. Match it with errors.As.
//
// Its message never contains the key itself (keys may hold personal data);
// the Key field is for the caller's own use.
type DuplicateJobError struct {
	ExistingJobID string          // the job that holds the key
	Policy        DuplicatePolicy // the policy that rejected the enqueue
	ExistingState State           // the existing job's terminal state
	ExistingKind  string          // the existing job's kind
	Key           string          // the idempotency key as the caller gave it
	KeyHash       string          // the key's stored hash
}

func (e *DuplicateJobError) Error() string {
	return fmt.Sprintf("nexjob: duplicate job rejected by %s: job %s is %s", e.Policy, e.ExistingJobID, e.ExistingState)
}

// UnknownOutcomeError: Insert's write failed in a way that does not say
// whether DynamoDB applied it (a timeout, a cancelled context, server
// errors or throttles through the SDK's retries, which may follow an
// attempt that was applied). ID is the job the write would have created:
// Get it to know. Err is the write's error. Nonce, for an update of a job
// (a claim), is the nonce that write stamps: Unclaim undoes a claim of
// unknown outcome by it.
type UnknownOutcomeError struct {
	ID    string
	Err   error
	Nonce string
}

func (e *UnknownOutcomeError) Error() string {
	what := "job"
	if strings.Contains(e.ID, "#") { // a call's record ("i#…", "<prefix>#…"), not a job's id
		what = "record"
	}
	return fmt.Sprintf("%v (%s %s may have been written)", e.Err, what, e.ID)
}

func (e *UnknownOutcomeError) Unwrap() error { return e.Err }
