package enqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
)

// ErrNoResult: the job Succeeded and kept no result (its worker was
// added with handler.AddWorker, not AddWorkerResult).
var ErrNoResult = errors.New("nexjob: the job succeeded and kept no result")

// NotEndedError: the job has not ended (Enqueued, Scheduled, Processing
// or AwaitingContinuation as last read). From Wait, Err is why it stopped
// waiting (its context's error: errors.Is(err, context.DeadlineExceeded)
// holds).
type NotEndedError struct {
	JobID string
	State ledger.State
	Err   error
}

func (e *NotEndedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("nexjob: job %s has not ended (%s when last read): %v", e.JobID, e.State, e.Err)
	}
	return fmt.Sprintf("nexjob: job %s has not ended: it is %s", e.JobID, e.State)
}

func (e *NotEndedError) Unwrap() error { return e.Err }

// NotSucceededError: the job ended without success, Failed (Cancelled by
// an operator, or not) or Expired, with its last error.
type NotSucceededError struct {
	JobID     string
	State     ledger.State
	Cancelled bool
	LastError string
}

func (e *NotSucceededError) Error() string {
	return fmt.Sprintf("nexjob: job %s ended %s, not Succeeded: %s", e.JobID, e.State, e.LastError)
}

// Ended is how a job ended, as Wait returns it.
type Ended struct {
	ID        string
	State     ledger.State // Succeeded, Failed or Expired
	Cancelled bool         // Failed: an operator cancelled or deleted it
	LastError string       // Failed or Expired: why
	// Result is the JSON a result worker returned (Succeeded only; nil
	// when it kept none). Decode reads it typed.
	Result json.RawMessage
}

// Decode reads the job's result into v (a pointer), as Client.Result
// does: a *NotSucceededError for a job that did not succeed, ErrNoResult
// for one that kept no result, an error for a result that does not
// decode into v (saying where, never quoting it).
func (e Ended) Decode(v any) error {
	switch {
	case e.State != ledger.Succeeded:
		return &NotSucceededError{JobID: e.ID, State: e.State, Cancelled: e.Cancelled, LastError: e.LastError}
	case e.Result == nil:
		return ErrNoResult
	}
	if err := json.Unmarshal(e.Result, v); err != nil {
		return fmt.Errorf("nexjob: the result of job %s does not decode into %T: %s", e.ID, v, redact.JSON(err))
	}
	return nil
}

// endedOf is rec's end; ok=false while the job has not ended. A result
// over the record's room is read from the blob bucket (one GetObject).
func (c *Client) endedOf(ctx context.Context, rec ledger.Record) (Ended, bool, error) {
	if !rec.State.Terminal() {
		return Ended{}, false, nil
	}
	e := Ended{ID: rec.ID, State: rec.State, Cancelled: rec.Cancelled}
	r, err := c.store.ResultOf(ctx, rec)
	if err != nil {
		return Ended{}, true, err
	}
	if r != "" {
		e.Result = json.RawMessage(r)
	} else if rec.State != ledger.Succeeded {
		e.LastError = rec.LastError
	}
	return e, true, nil
}

// Result reads the result of the job with this id into v (a pointer):
// one strongly consistent GetItem (two for a keyed job whose key a newer
// job holds). The result is the JSON its handler.AddWorkerResult worker
// returned, kept by the write that made the job Succeeded.
//
// A job that has not ended is a *NotEndedError, one that ended without
// success a *NotSucceededError (its state and last error), one that
// Succeeded with no result ErrNoResult; an unknown id, or a job deleted
// or past its retention, ledger.ErrNotFound (ledger.ErrBadID for a string
// that is no id). AWS errors are wrapped.
func (c *Client) Result(ctx context.Context, id string, v any) error {
	rec, err := c.store.Get(ctx, id)
	if err != nil {
		return err
	}
	end, ok, err := c.endedOf(ctx, rec)
	switch {
	case err != nil:
		return err
	case !ok:
		return &NotEndedError{JobID: id, State: rec.State}
	}
	return end.Decode(v)
}

// WaitOptions tune Wait. The zero value takes the defaults.
type WaitOptions struct {
	// Interval is the pause after the first read, doubled after each
	// read up to MaxInterval. Defaults to DefaultWaitInterval.
	Interval time.Duration
	// MaxInterval caps the pause. Defaults to DefaultMaxWaitInterval.
	MaxInterval time.Duration
}

// Wait's default polling: reads at once, then 250 ms later, doubling to
// one every 5 s.
const (
	DefaultWaitInterval    = 250 * time.Millisecond
	DefaultMaxWaitInterval = 5 * time.Second
)

// Wait returns once the job with this id has ended: Succeeded (with its
// result: Ended.Decode), Failed or Expired (with the last error). It
// polls the record, one eventually consistent GetItem a read (half a read
// unit per 4 KB of record; two reads for a keyed job whose key a newer
// job holds): at once, then after Interval, doubling up to MaxInterval.
// With the defaults a job that ends a minute after the first read is
// found by the 17th (reads at 0, 0.25, 0.75, 1.75, 3.75 and 7.75 s, then
// every 5 s: the 16th at 57.75 s, the 17th at 62.75 s), and each further
// minute costs 12. A job found missing is read once more, strongly
// consistent, before that counts (a job just enqueued may not be seen yet).
//
// The wait ends with the context: a *NotEndedError with the state last
// read, wrapping the context's error. An unknown id, a job deleted or
// past its retention meanwhile, is ledger.ErrNotFound; an AWS error (after
// the SDK's retries) ends the wait, wrapped.
func (c *Client) Wait(ctx context.Context, id string, opts *WaitOptions) (Ended, error) {
	pause, most := DefaultWaitInterval, DefaultMaxWaitInterval
	if opts != nil && opts.Interval > 0 {
		pause = opts.Interval
	}
	if opts != nil && opts.MaxInterval > 0 {
		most = opts.MaxInterval
	}
	pause = min(pause, most)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last ledger.State
	for {
		select {
		case <-ctx.Done():
			return Ended{}, &NotEndedError{JobID: id, State: last, Err: context.Cause(ctx)}
		case <-timer.C:
		}
		rec, err := c.peek(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return Ended{}, &NotEndedError{JobID: id, State: last, Err: context.Cause(ctx)}
			}
			return Ended{}, err
		}
		if end, ok, err := c.endedOf(ctx, rec); ok {
			return end, err
		}
		last = rec.State
		timer.Reset(pause)
		pause = min(2*pause, most)
	}
}

// peek reads the job eventually consistent, and once more strongly
// consistent when that finds nothing.
func (c *Client) peek(ctx context.Context, id string) (ledger.Record, error) {
	rec, err := c.store.Peek(ctx, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return c.store.Get(ctx, id)
	}
	return rec, err
}
