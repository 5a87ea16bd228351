package enqueue

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Signal sends the job jobID its signal name with payload (encoded as
// JSON), for the worker's handler.WaitForSignal: recorded on the job, and
// the job woken when it sleeps in that wait (its message sent at once).
// The first signal of a name wins; the same signal sent again (the same
// payload) is no error and wakes the job if it still sleeps in the wait,
// so a caller retries a Signal that failed (a wake or a send throttled
// past the SDK's retries: the signal is recorded, the job not yet woken).
// Refusals are a *ledger.SignalRefusedError, nothing written: a second
// signal of the name with another payload (ledger.ErrSignalSent), a job that ended (ledger.ErrJobEnded), a
// wait that timed out (ledger.ErrSignalTooLate). A payload that does not
// encode, or is over ledger.MaxStepBytes, is an *InputError or a
// *ledger.StepError. An unknown job is ledger.ErrNotFound.
//
// The payload is the caller's data: it is never logged. Cost: one
// strongly consistent read and one UpdateItem, and one more and a send
// when it wakes the job.
func (c *Client) Signal(ctx context.Context, jobID, name string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return &InputError{Field: "payload", Reason: "does not encode as JSON", Err: err}
	}
	return c.wake(ctx, jobID, name, func() (ledger.Record, error) { return c.store.Signal(ctx, jobID, name, string(b)) })
}

// wake records a signal by record, then wakes its job if it sleeps in the
// wait for it.
func (c *Client) wake(ctx context.Context, jobID, name string, record func() (ledger.Record, error)) error {
	rec, err := record()
	if err != nil {
		return err
	}
	if !c.store.Waiting(rec, name) {
		return nil // it reads the signal when it waits, or wakes for it then
	}
	out, ok, err := c.store.Wake(ctx, rec)
	if err != nil {
		return fmt.Errorf("nexjob: wake job %s for its signal: %w", jobID, err)
	}
	if !ok {
		return nil
	}
	// Due now, whatever the run time the wake could set: a caller whose
	// clock runs ahead of the workers' leaves it at the wait's end (Wake),
	// and a message carrying that time would be carried forward to it
	// unread; one with none has the worker read the record and wake the
	// job by its own clock.
	return c.sendNow(ctx, out)
}

// SignalByKey is Signal to the job that holds idempotency key key (a
// webhook that knows the order's id signals "payment-1001"): one read
// more. No job holding the key is ledger.ErrNotFound.
func (c *Client) SignalByKey(ctx context.Context, key, name string, payload any) error {
	rec, err := c.store.GetByKey(ctx, key)
	if err != nil {
		return err
	}
	return c.Signal(ctx, rec.ID, name, payload)
}

// Complete completes the wait a callback token names (handler's
// CallbackToken) with payload: Signal to its job and name, once the
// token's MAC is checked under the key secret and its job is found to hold
// the token's nonce, which only a run of the job records (a forged,
// altered or made-up token is ledger.ErrBadCallbackToken; without a key
// secret, ledger.ErrNoKeySecret). A completed token is refused
// (ledger.ErrSignalSent), an expired one (its wait timed out) too
// (ledger.ErrSignalTooLate). Nothing is written when it is refused.
func (c *Client) Complete(ctx context.Context, token string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return &InputError{Field: "payload", Reason: "does not encode as JSON", Err: err}
	}
	id, name, _, err := c.store.ParseCallbackToken(token)
	if err != nil {
		return err
	}
	return c.wake(ctx, id, name, func() (ledger.Record, error) { return c.store.Complete(ctx, token, string(b)) })
}
