package enqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// Debounce folds a burst of enqueues into one run: every enqueue with Key
// while its job is pending (Scheduled, never claimed) puts its args and
// its Deadline into that job and moves its run to Period after itself,
// but never later than MaxWait after the burst's first enqueue. The job
// runs once, with the last args. An enqueue that finds the job claimed
// (running, or ended) starts the next window: a new job. Result.Folded
// says an enqueue went into an existing job, Result.ID which. Enqueue and
// EnqueueMany debounce (a batch's items in their order, so its last item
// of a key is the last fold); EnqueueTx and the continuations refuse
// Debounce with an *InputError. A RateLimit takes its slot for a fold as
// for a new window: both are accepted enqueues.
//
// The key names a small pointer item (pk "d#<key hash>", hashed as
// idempotency keys are) that says which job is pending. A new window
// writes the pointer and its job in one transaction, so an enqueue never
// meets a pointer naming a job not written yet (and a producer that dies
// mid-way leaves neither). Lost replies: a fold is an update that
// recognises its own write; a window's transaction resent after it
// applied meets a pointer naming our job and reads as applied.
//
// Nothing lost: a fold into a job whose send failed (marked unsent, its
// enqueue returned a *DispatchError) sends it, as a keyed enqueue's retry
// re-sends its unsent job (Result.Redispatched); a job whose producer
// died before the send, and whose run a fold then moved later, is run by
// the dispatch guard's check, which comes back for the new run time when
// it finds the job not yet due.
//
// Deadline: the job takes the Deadline of the enqueue that last folded
// into it (none removes it), since the run it bounds is that enqueue's.
// An enqueue whose Deadline is not after its debounced run time (Period
// after it, or the window's end) would always expire: it is an
// *InputError on Deadline, and nothing is written.
//
// Cost: a fold is one consistent read of the pointer and one UpdateItem of
// the job (1 write unit, +2 index: the job is Scheduled); a new window is
// the read, a TransactWriteItems of the pointer and the job (4 write
// units, +2 index) and its send. The pending job's message is not re-sent
// by a fold: when it comes at the old run time it finds the run later and
// is carried forward, a failed claim (1 write unit) and a re-send
// (TestDebouncedBurstCosts: a burst of 5 to its run is 11 write units +
// 10 index, 5 read units, 2 sends).
type Debounce struct {
	Key     string        // 1 to ledger.MaxKeyLen bytes of UTF-8
	Period  time.Duration // 1 s to MaxScheduleAhead
	MaxWait time.Duration // 0: no bound (a burst that never pauses never runs); else 1 s to MaxScheduleAhead
}

func (d *Debounce) check(o *Opts) error {
	switch {
	case d == nil:
		return nil
	case d.Key == "" || len(d.Key) > ledger.MaxKeyLen || !utf8.ValidString(d.Key):
		return invalid("Debounce.Key", fmt.Sprintf("must be 1 to %d bytes of UTF-8", ledger.MaxKeyLen))
	case d.Period < time.Second || d.Period > MaxScheduleAhead:
		return invalid("Debounce.Period", fmt.Sprintf("%s is outside 1s to %s", d.Period, MaxScheduleAhead))
	case d.MaxWait != 0 && (d.MaxWait < time.Second || d.MaxWait > MaxScheduleAhead):
		return invalid("Debounce.MaxWait", fmt.Sprintf("%s is outside 1s to %s", d.MaxWait, MaxScheduleAhead))
	case o.IdempotencyKey != "" || o.Delay != 0 || !o.RunAt.IsZero():
		return invalid("Debounce", "the debounce key decides the job and its run time: IdempotencyKey, Delay and RunAt do not apply")
	}
	return nil
}

// errDebounceContended: enqueues with one key kept pointing it at new
// jobs faster than this one could fold into any (a burst racing a worker
// that claims each new job at once). Nothing was written.
var errDebounceContended = errors.New("nexjob: debounce key contended; try again")

// debounce folds rec into its key's pending job, or starts a window,
// and sends what is to be sent.
func (c *Client) debounce(ctx context.Context, rec ledger.Record, o *Opts) ItemResult {
	d := o.Debounce
	key := c.store.HashKey("debounce:" + d.Key)
	admitted := false
	// admit refuses a Deadline not after the run time runAt, then takes
	// the RateLimit's slot once (a fold is an accepted enqueue too), both
	// before the first write.
	admit := func(runAt time.Time) error {
		if err := deadlineAfter(o, runAt); err != nil {
			return err
		}
		if admitted {
			return nil
		}
		admitted = true
		return c.admit(ctx, rec, o)
	}
	for range 10 {
		id, until, ver, err := c.store.Debounced(ctx, key)
		if err != nil {
			return ItemResult{Err: c.missing(err)}
		}
		now := c.store.Now()
		if id != "" {
			runAt := now.Add(d.Period)
			if !until.IsZero() && until.Before(runAt) {
				runAt = until
			}
			if err := admit(maxTime(runAt, now)); err != nil {
				return ItemResult{Err: err}
			}
			got, folded, err := c.store.Fold(ctx, id, rec, runAt)
			switch {
			case errors.Is(err, ledger.ErrItemTooLarge):
				return ItemResult{Err: &InputError{Field: "args", Reason: "too large for a job record", Err: err}}
			case err != nil && !errors.Is(err, ledger.ErrNotFound):
				return ItemResult{Err: c.missing(err)}
			case folded:
				return c.folded(ctx, got)
			case err == nil && got.Kind != rec.Kind && got.State == ledger.Scheduled && got.Attempt == 0 && !got.Ran():
				return ItemResult{Err: &KeyKindError{ExistingJobID: got.ID, ExistingKind: got.Kind, Kind: rec.Kind}}
			}
		}
		// A new window: its job and the key's pointer to it, together.
		end := time.Time{}
		if d.MaxWait > 0 {
			end = now.Add(d.MaxWait)
		}
		rec.State, rec.RunAt = ledger.Scheduled, now.Add(min(d.Period, cmp.Or(d.MaxWait, d.Period))).UnixMilli()
		if err := admit(ledger.Millis(rec.RunAt)); err != nil {
			return ItemResult{Err: err}
		}
		got, ok, err := c.store.StartDebounce(ctx, key, rec, o.DuplicatePolicy, windowEnd(end, now), ver)
		switch {
		case errors.Is(err, ledger.ErrItemTooLarge):
			return ItemResult{Err: &InputError{Field: "args", Reason: "too large for a job record", Err: err}}
		case err != nil:
			return ItemResult{Err: c.missing(err)}
		case !ok:
			continue // another enqueue started the window: fold into its job
		}
		r := ItemResult{Result: Result{ID: got.ID, Kind: got.Kind, State: got.State}, Recorded: true}
		c.sent(ctx, got, &r, c.Dispatch(ctx, got))
		return r
	}
	return ItemResult{Err: errDebounceContended}
}

// deadlineAfter refuses an enqueue whose Deadline is not after its
// debounced run time runAt: the job would expire unrun.
func deadlineAfter(o *Opts, runAt time.Time) error {
	if o.Deadline.IsZero() || o.Deadline.After(runAt) {
		return nil
	}
	return invalid("Deadline", fmt.Sprintf("%s is not after the debounced run time %s: the job would expire unrun",
		o.Deadline.UTC().Format(time.RFC3339Nano), runAt.UTC().Format(time.RFC3339Nano)))
}

// folded is the result of a fold into got. A job marked unsent (its send
// failed) is sent now, as decide re-sends a keyed enqueue's unsent job:
// the fold is the caller's retry, or the burst's next enqueue, and no
// other message names the job.
func (c *Client) folded(ctx context.Context, got ledger.Record) ItemResult {
	c.log.InfoContext(ctx, "nexjob: enqueue folded into the debounced job", "job_id", got.ID, "kind", got.Kind)
	c.metrics.Count(metrics.Deduplicated, got.Kind, got.ID)
	r := ItemResult{Result: Result{ID: got.ID, Kind: got.Kind, State: got.State, Folded: true}, Recorded: true, Sent: true}
	if c.unsent(got) {
		r.Redispatched, r.Sent = true, false
		c.sent(ctx, got, &r, c.Dispatch(ctx, got))
	}
	return r
}

// windowEnd is the pointer's window end: MaxWait's, or (no bound) the
// longest schedule, which the pointer's TTL follows.
func windowEnd(end, now time.Time) time.Time {
	if end.IsZero() {
		return now.Add(MaxScheduleAhead)
	}
	return end
}
