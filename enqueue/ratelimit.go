package enqueue

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// RateLimit drops instead of waiting: at most Limit enqueues with one Key
// are accepted in any window of Period (a sliding log of slots in the
// key's own DynamoDB item, ledger.Store.Reserve); one over the limit is
// refused with a *RateLimitedError and writes no job. The key is hashed
// before it is stored, as idempotency keys are. An enqueue with an
// IdempotencyKey first reads the key's record: an active holder means the
// enqueue is a duplicate, and it takes no slot; otherwise its slot is
// tagged with the key and the ended holder it follows, so a retry of the
// same call (a lost reply) counts once (while the slot is among the key's
// last 16), and a new job after that one ended counts again. One without
// a key takes a new slot each call. The slot is taken before the job's
// write: an enqueue
// that then fails for another reason (a duplicate, a rejection, a
// throttle) has still spent it. Every entry point takes it: Enqueue (a
// debounced enqueue that folds too: it is accepted), EnqueueMany's
// items, EnqueueTx, ContinueWith and ContinueWhenAll.
//
// A Limit over 16 is kept on counts per 1/24 of the Period (the key's
// item stays under 1 KB): a refusal may then come when the limit is
// reached within the Period and 1/24 more.
//
// Cost: one consistent read and one conditional PutItem of the key's item
// (1 read unit, 1 write unit, at every accepted Limit) per accepted
// enqueue, the read alone for a refused one; a keyed one one consistent
// read of the key's record more. A key takes at most
// ledger.KeyWriteCeiling accepted enqueues a second.
type RateLimit struct {
	Key    string        // 1 to ledger.MaxKeyLen bytes of UTF-8
	Limit  int           // 1 to ledger.MaxRateLimit
	Period time.Duration // ledger.MinRatePeriod to ledger.MaxRatePeriod
}

func (r *RateLimit) check() error {
	switch {
	case r == nil:
		return nil
	case r.Key == "" || len(r.Key) > ledger.MaxKeyLen || !utf8.ValidString(r.Key):
		return invalid("RateLimit.Key", fmt.Sprintf("must be 1 to %d bytes of UTF-8", ledger.MaxKeyLen))
	}
	if msg := (ledger.Rate{Limit: r.Limit, Period: r.Period}).Valid(); msg != "" {
		return invalid("RateLimit", msg)
	}
	return nil
}

// RateLimitedError refuses an enqueue over its RateLimit. Nothing was
// written and nothing sent; the same enqueue is accepted at RetryAt at
// the earliest.
type RateLimitedError struct {
	Kind    string
	RetryAt time.Time
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("nexjob: %s enqueue over its rate limit; a slot frees at %s", e.Kind, e.RetryAt.UTC().Format(time.RFC3339Nano))
}

// admit takes the enqueue's rate-limit slot, if it has a RateLimit.
func (c *Client) admit(ctx context.Context, rec ledger.Record, o *Opts) error {
	if o.RateLimit == nil {
		return nil
	}
	tag := ledger.RateTag(ledger.NewNonce()) // this call's own (the job's id comes with its write)
	if o.IdempotencyKey != "" {
		holder, err := c.store.GetByKey(ctx, o.IdempotencyKey)
		switch {
		case err == nil && !holder.State.Terminal():
			return nil // a duplicate: no new job, no slot (a retry of the call that made it counts once)
		case err != nil && !errors.Is(err, ledger.ErrNotFound):
			return c.missing(err)
		}
		// The slot of the job that follows the key's ended holder (none:
		// ""): a retry of this call finds it, the job after this one
		// ended takes its own (a job a Period after its predecessor's
		// end was let through uncounted).
		tag = ledger.RateTag("key:" + c.store.HashKey(o.IdempotencyKey) + "/" + holder.ID)
	}
	r := ledger.Rate{Limit: o.RateLimit.Limit, Period: o.RateLimit.Period}
	slot, taken, err := c.store.Reserve(ctx, c.store.HashKey("rate:"+o.RateLimit.Key), tag, r, false)
	if err != nil {
		return c.missing(err)
	}
	if !taken {
		c.metrics.Count(metrics.Rejected, rec.Kind, rec.ID)
		return &RateLimitedError{Kind: rec.Kind, RetryAt: slot}
	}
	return nil
}
