package handler

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Throttle limits how often a kind's jobs start, per key: in any window of
// Period, at most Limit runs of one key start (a sliding log of slots in
// the key's own DynamoDB item, ledger.Store.Reserve). A job over the limit
// waits for the next free slot, never dropped and with no attempt spent:
// a slot at most ThrottleWait away is waited for in the run's goroutine
// (out of its lease), a later one reschedules the job to ThrottleWait
// before it (its message is re-sent with that delay) and waits the rest
// when it comes back. Keys are independent, so one busy key delays only its own jobs.
// A retry is a new start and takes a new slot; a redelivery of the same
// attempt gets its slot back. A run starts at most slotTolerance after its
// slot: one whose message comes back later takes a new slot, and one
// deferred for want of a concurrency slot gives its throttle slot up. A
// slot beyond the longest schedule is reached in deferrals of at most
// that (no message names a run further ahead).
//
// Cost: each start takes one consistent read and one conditional PutItem
// of the key's item, under 1 KB at every accepted Limit: 1 read unit and
// 1 write unit (a Limit over 16 is kept on counts per 1/24 of the
// Period: a slot may come up to Period/24 later than an exact log's). A
// job sent to a later slot pays one more claim and one more finish (2
// write units), a send, and its message's receive and delete, once,
// whatever the wait. A key takes at most ledger.KeyWriteCeiling starts a
// second (DynamoDB's write ceiling for one partition); a kind throttled
// as a whole (Key nil) has one key for all its jobs.
type Throttle struct {
	// Key names the job's throttle key from its record; nil throttles
	// the kind as a whole, "" leaves the job unthrottled. ArgsKey builds
	// one from the args type. The key is hashed (Store.HashKey) before
	// it is stored.
	Key    func(rec ledger.Record) string
	Limit  int           // starts per Period, 1 to ledger.MaxRateLimit (1000)
	Period time.Duration // ledger.MinRatePeriod to ledger.MaxRatePeriod
}

// ThrottleWait is the longest a run waits in its goroutine for its
// throttle slot; a later slot reschedules the job.
const ThrottleWait = time.Second

// Concurrency limits how many of a kind's jobs run at once, per key (one
// tenant at most Limit at a time). A run holds one of the key's slots
// from its claim until its end is recorded; the slot is leased with the
// claim, so a crashed worker's slot frees itself when its lease ends. A
// job that finds no slot free goes back to the queue with no attempt
// spent and comes again after a backoff (1 s, doubling per deferral in a
// row, at most MaxBackoff, and never after the first held lease ends).
//
// Cost: a run takes one consistent read and one conditional PutItem of
// the key's item to take its slot and one UpdateItem to free it (the
// item stays under 1 KB up to the largest Limit: 1 write unit each, so a
// key takes at most ledger.KeyWriteCeiling/2 runs a second); each
// deferral costs a claim, a finish, the read, a send, and its receive and
// delete.
type Concurrency struct {
	// Key as for Throttle: nil limits the kind as a whole, "" leaves the
	// job unlimited.
	Key   func(rec ledger.Record) string
	Limit int // runs at once, 1 to ledger.MaxConcurrency (40)
	// MaxBackoff caps the wait of a job that found no slot. Defaults to
	// DefaultMaxBackoff; at least minConcurrencyBackoff.
	MaxBackoff time.Duration
}

// DefaultMaxBackoff is Concurrency.MaxBackoff's default.
const DefaultMaxBackoff = 30 * time.Second

// minConcurrencyBackoff is a deferral's first wait.
const minConcurrencyBackoff = time.Second

// ArgsKey returns a Key function for Throttle or Concurrency that decodes
// the job's args as T and calls key. Args that do not decode give "" (no
// limit): the run itself then fails with an *ArgsError.
func ArgsKey[T any](key func(args T) string) func(rec ledger.Record) string {
	return func(rec ledger.Record) string {
		var args T
		if err := json.Unmarshal([]byte(rec.Args), &args); err != nil {
			return ""
		}
		return key(args)
	}
}

// checkFlow panics on a kind's flow options that cannot work, as AddWorker
// does on every other programming error.
func checkFlow(kind string, o KindOptions) {
	if t := o.Throttle; t != nil {
		if msg := (ledger.Rate{Limit: t.Limit, Period: t.Period}).Valid(); msg != "" {
			panic(fmt.Sprintf("nexjob: kind %q Throttle: %s", kind, msg))
		}
	}
	if c := o.Concurrency; c != nil && (c.Limit < 1 || c.Limit > ledger.MaxConcurrency) {
		panic(fmt.Sprintf("nexjob: kind %q Concurrency: Limit %d is outside 1 to %d", kind, c.Limit, ledger.MaxConcurrency))
	}
}

// flowKey is the name rec's flow-control key is hashed from, or "" for
// a job not limited. The key function is user code: a panic in it is a
// *PanicError, and the run fails as a worker's panic fails it (the
// attempt is spent, the job retried), never escaping Handle with the job
// claimed.
func flowKey(key func(ledger.Record) string, rec ledger.Record) (name string, err error) {
	if key == nil {
		return flowName(rec.Kind, ""), nil
	}
	defer func() {
		if v := recover(); v != nil {
			name, err = "", &PanicError{Value: fmt.Sprintf("flow-control key function: %v", v)}
		}
	}()
	if k := key(rec); k != "" {
		return flowName(rec.Kind, k), nil
	}
	return "", nil
}

// flowName: a key function's key, or the kind's own for a kind limited
// as a whole. Always scoped to the kind: two kinds keyed by one tenant
// keep two logs and two holder sets, each under its own Limit. A kind
// has no NUL byte, so no kind and key pair names another's item.
func flowName(kind, key string) string {
	if key == "" {
		return "kind:" + kind
	}
	return "key:" + kind + "\x00" + key
}

// slotTolerance is how late a run may start after its throttle slot. A
// deferred job whose message comes back later than that (workers down,
// the event source at its MaxConcurrency, a concurrency deferral) takes a
// new slot instead of starting on a stale one, so a backlog of late
// messages never starts together: the starts of one key keep the rate
// within slotTolerance (any Limit+1 starts span at least Period less
// slotTolerance).
const slotTolerance = ThrottleWait

// admit applies the kind's flow control to a claimed run before it
// starts. It returns the time to defer the job to (zero: run it now), the
// throttle slot the attempt holds (kept on the record when it is
// deferred), and the function that frees the run's concurrency slot once
// its end is recorded (never nil). err is a key function's panic: the run
// fails with it.
func (h *Handler) admit(ctx context.Context, e *entry, rec ledger.Record) (deferTo, slot time.Time, release func(), err error) {
	release = func() {}
	if t := e.opts.Throttle; t != nil {
		key, err := flowKey(t.Key, rec)
		if err != nil {
			return time.Time{}, time.Time{}, release, err
		}
		if key != "" {
			if deferTo, slot = h.throttle(ctx, t, key, rec); !deferTo.IsZero() {
				return deferTo, slot, release, nil
			}
		}
	}
	if c := e.opts.Concurrency; c != nil {
		key, err := flowKey(c.Key, rec)
		if err != nil {
			return time.Time{}, time.Time{}, release, err
		}
		if key != "" {
			hash, holder := h.store.HashKey(key), ledger.Holder(rec)
			ok, freeAt, err := h.store.Acquire(ctx, hash, holder, c.Limit, ledger.Millis(rec.LeaseUntil))
			now := h.store.Now()
			if err != nil {
				h.log.ErrorContext(ctx, "nexjob: concurrency slot failed; the job is deferred", "job_id", rec.ID, "err", err)
				// Its put may have applied: free it rather than hold it until the lease ends.
				_ = h.store.ReleaseSlot(context.WithoutCancel(ctx), hash, holder)
				return now.Add(minConcurrencyBackoff), time.Time{}, release, nil
			}
			if !ok {
				wait := min(minConcurrencyBackoff<<min(rec.Defers, 10), max(cmp.Or(c.MaxBackoff, DefaultMaxBackoff), minConcurrencyBackoff))
				wait = wait/2 + rand.N(wait/2+1) // jitter, so the waiters of a key spread out
				if until := freeAt.Sub(now); until > 0 && until < wait {
					wait = until
				}
				// The throttle slot is not kept: the job did not start on
				// it, and one kept past its time would start beside the
				// next job's slot. It takes a new one when it comes back.
				return now.Add(wait), time.Time{}, release, nil
			}
			id := rec.ID // not rec: a closure over it moved every admit's record to the heap
			release = func() {
				if err := h.store.ReleaseSlot(context.WithoutCancel(ctx), hash, holder); err != nil {
					// The slot frees itself when the claim's lease ends.
					h.log.WarnContext(ctx, "nexjob: freeing the concurrency slot failed", "job_id", id, "err", err)
				}
			}
		}
	}
	return time.Time{}, slot, release, nil
}

// throttle takes (or finds) the run's throttle slot under key and waits
// for it when it is near: deferTo is non-zero when the job must come back
// later, holding slot.
func (h *Handler) throttle(ctx context.Context, t *Throttle, key string, rec ledger.Record) (deferTo, slot time.Time) {
	if rec.Slot != 0 && h.store.Now().Sub(ledger.Millis(rec.Slot)) <= slotTolerance {
		// Taken by this attempt before it was deferred: the log keeps
		// only the last Limit slots, so it is on the record (10 waiting
		// jobs of a Limit of 1 took each other's slots, for ever).
		slot = ledger.Millis(rec.Slot)
	} else {
		// A new slot; a stale one (its message came back too late) is
		// left unused. The tag names the attempt and its deferrals, so a
		// redelivery of this very message gets its slot back.
		tag := ledger.RateTag(rec.ID + "." + strconv.Itoa(rec.Attempt) + "." + strconv.Itoa(rec.Defers))
		var err error
		slot, _, err = h.store.Reserve(ctx, h.store.HashKey(key), tag, ledger.Rate{Limit: t.Limit, Period: t.Period}, true)
		if err != nil {
			h.log.ErrorContext(ctx, "nexjob: throttle slot failed; the job is deferred", "job_id", rec.ID, "err", err)
			return h.store.Now().Add(minConcurrencyBackoff), time.Time{}
		}
	}
	if wait := slot.Sub(h.store.Now()); wait > ThrottleWait {
		// Its message comes back within ThrottleWait before the slot (an
		// SQS delay is whole seconds, rounded up), and the run waits the
		// rest: it starts on its slot. A slot beyond the longest schedule
		// is reached in steps (finish clamps the run time).
		return slot.Add(-ThrottleWait), slot
	} else if wait > 0 {
		if err := sleepCtx(ctx, wait); err != nil {
			return slot, slot
		}
	}
	return time.Time{}, slot
}

// sleepCtx waits d, or less if ctx ends first (its error then).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Holding lists the runs holding concurrency slots of a kind's key (the
// key its Concurrency.Key returns; "" for a kind limited as a whole),
// each by its ledger.HolderTag (of ledger.Holder(rec)) with the end of
// its lease: one consistent read.
func (h *Handler) Holding(ctx context.Context, kind, key string) (map[string]time.Time, error) {
	return h.store.SlotHolders(ctx, h.store.HashKey(flowName(kind, key)))
}
