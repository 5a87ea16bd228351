package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// when it comes back. A slot beyond Options.FarAfter waits in a one-time
// schedule, which fires onetime.Lead (two minutes) before that and is
// carried the rest by an SQS delay: EventBridge Scheduler's precision of
// a minute never makes the start late, so it never costs the slot. Keys
// are independent, so one busy key delays only its own jobs.
// A retry is a new start and takes a new slot; a redelivery of the same
// attempt gets its slot back. A run starts at most slotTolerance after its
// slot: one whose message comes back later takes a new slot, and one
// deferred for want of a concurrency slot gives its throttle slot up. A
// job waiting in a Concurrency key's queue keeps its place there (its
// ticket) through a throttle deferral (see Concurrency). A slot beyond
// the longest schedule is reached in deferrals of at most that (no
// message names a run further ahead).
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
// spent and a ticket: waiters start in the order they came. A run that
// ends hands its slot to the first waiter (reserved for it for one
// lease) and wakes it: the waiter's job is made due and sent at once.
// Each wake also brings the next waiter's own return forward to one
// lease from then. Should a wake be lost (a worker killed between the
// release and the send, a holder killed in its run, a woken job that
// never comes), the queue is held up one lease at most: the next waiter
// comes back, finds the reserved slot's lease ended and takes its turn.
// Every waiter also comes back by itself when its turn would be due if
// every run ahead of it took its whole lease (the first Limit waiters:
// when the first held lease ends), or after MaxBackoff if that is sooner;
// a slot found free with waiters queued is handed to them by any claim
// of the key.
//
// Under a Throttle too, the throttle is asked first. A waiter that its
// throttle defers keeps its ticket. One woken to a freed slot that its
// throttle sends to a throttle slot at most one lease away keeps the
// slot reserved until it comes back on its throttle slot, and starts
// then: the queue waits for its first waiter, as long as its throttle
// makes it wait (a Concurrency key shared by several Throttle keys: at
// most a lease). One sent further gives the slot up at once to the next
// waiter, and takes its turn again when it comes back: no slot waits a
// lease for a job that cannot start in it.
//
// Cost: a run takes one consistent read and one conditional PutItem of
// the key's item to take its slot and one UpdateItem to free it (the
// item stays under 1 KB up to the largest Limit: 1 write unit each, so a
// key takes at most ledger.KeyWriteCeiling/2 runs a second). Waiting is
// linear in the waiters: each costs one deferral (a claim, a finish, the
// slot's read and put, its ticket's item, a send, and its message's
// receive and delete), one wake (a read and put of the key's item, the
// ticket's update, the job's update and a send), one arming (the
// ticket's read, the job's update, a send), and its own messages come
// back once or twice more to find the job done (a receive, a refused
// claim, a delete each), whatever the length of the queue and the wait.
// A waiter's throttle deferral adds a consistent read of the key's item,
// and a put when a slot was reserved for it (the hold, or the hand-over
// to the next waiter and its wake).
type Concurrency struct {
	// Key as for Throttle: nil limits the kind as a whole, "" leaves the
	// job unlimited.
	Key   func(rec ledger.Record) string
	Limit int // runs at once, 1 to ledger.MaxConcurrency (40)
	// MaxBackoff caps how long a waiter waits before it looks again by
	// itself (each look a deferral more). Zero, the default: no cap
	// beyond its estimated turn.
	MaxBackoff time.Duration
}

// minConcurrencyBackoff is the shortest wait of a deferral.
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
func (h *Handler) flowKey(ctx context.Context, key func(ledger.Record) string, rec ledger.Record) (name string, err error) {
	if key == nil {
		return flowName(rec.Kind, ""), nil
	}
	if rec.ArgsBlob != "" {
		// The key function reads the args (ArgsKey): those kept in the
		// blob bucket are read first, into a copy (one GetObject).
		if rec.Args, err = h.store.ArgsOf(ctx, rec, false); err != nil {
			return "", err
		}
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
// the event source at its MaxConcurrency, a concurrency deferral, a
// schedule's firing more than onetime.Lead late) takes a new slot
// instead of starting on a stale one, so a backlog of late
// messages never starts together: the starts of one key keep the rate
// within slotTolerance (any Limit+1 starts span at least Period less
// slotTolerance).
const slotTolerance = ThrottleWait

// admission is admit's decision on a claimed run.
type admission struct {
	// deferTo, when non-zero, is when the job must come back, holding
	// the throttle slot slot and the concurrency ticket ticket.
	deferTo, slot time.Time
	ticket        int64
	// release frees the run's concurrency slot once its end is recorded
	// (never nil); waiter records a deferral's ticket once the deferral is
	// recorded, and wakes the job if its slot came meanwhile (nil when the
	// deferral holds no ticket).
	release, waiter func()
}

// admit applies the kind's flow control to a claimed run before it
// starts. err is a key function's panic: the run fails with it.
func (h *Handler) admit(ctx context.Context, e *entry, rec ledger.Record) (a admission, err error) {
	a.release = func() {}
	if t := e.opts.Throttle; t != nil {
		key, err := h.flowKey(ctx, t.Key, rec)
		if err != nil {
			return a, err
		}
		if key != "" {
			if a.deferTo, a.slot = h.throttle(ctx, t, key, rec); !a.deferTo.IsZero() {
				return h.keepTurn(ctx, e.opts.Concurrency, rec, a)
			}
		}
	}
	if c := e.opts.Concurrency; c != nil {
		key, err := h.flowKey(ctx, c.Key, rec)
		if err != nil {
			return a, err
		}
		if key != "" {
			return h.concurrency(ctx, c, h.store.HashKey(key), rec, a.slot), nil
		}
	}
	return a, nil
}

// concurrency takes a slot of the key hashed hash for the run of rec, or
// queues it.
func (h *Handler) concurrency(ctx context.Context, c *Concurrency, hash string, rec ledger.Record, slot time.Time) admission {
	holder, now := ledger.Holder(rec), h.store.Now()
	q := slotQueue{h: h, hash: hash, limit: c.Limit, grace: max(ledger.Millis(rec.LeaseUntil).Sub(now), minConcurrencyBackoff)}
	a, err := h.store.AcquireQueued(ctx, hash, holder, c.Limit, ledger.Millis(rec.LeaseUntil), ledger.Waiting{Ticket: rec.Ticket, Grace: q.grace})
	if err != nil {
		h.log.ErrorContext(ctx, "nexjob: concurrency slot failed; the job is deferred", "job_id", rec.ID, "err", err)
		// Its put may have applied: free it rather than hold it until the lease ends.
		q.release(context.WithoutCancel(ctx), holder, rec.ID)
		return admission{deferTo: now.Add(minConcurrencyBackoff), release: func() {}}
	}
	// Free slots found with waiters queued are handed to them after this
	// run's end is recorded (or its deferral is): never on the way to the
	// run, whose invocation the wakes' requests would eat into (the 10k
	// soak, seed 1796517429524512631: a run started after its deadline).
	if a.OK {
		id := rec.ID // not rec: a closure over it moved every admit's record to the heap
		return admission{slot: slot, release: func() {
			ctx := context.WithoutCancel(ctx)
			q.release(ctx, holder, id)
			q.wake(ctx, a.Wake)
		}}
	}
	// Its turn if every run ahead takes its whole lease; one of the first
	// Limit waiters looks again when the first held slot frees itself.
	wait := time.Duration(a.Ahead/int64(c.Limit)+1) * q.grace
	if until := a.FreeAt.Sub(now); a.Ahead < int64(c.Limit) && until > 0 {
		wait = min(wait, until)
	}
	if c.MaxBackoff > 0 {
		wait = min(wait, c.MaxBackoff)
	}
	deferTo := now.Add(max(wait, minConcurrencyBackoff))
	// The throttle slot is not kept: the job did not start on it, and
	// one kept past its time would start beside the next job's slot. It
	// takes a new one when it comes back.
	return admission{deferTo: deferTo, ticket: a.Ticket, release: func() {}, waiter: func() {
		ctx := context.WithoutCancel(ctx)
		q.waiting(ctx, a.Ticket, rec.ID, deferTo)
		q.wake(ctx, a.Wake)
	}}
}

// keepTurn is a throttle deferral a of rec that holds a ticket of its
// concurrency key (c): the deferral keeps the ticket, so the job keeps
// its place in the key's queue. A waiter woken to a freed slot (the
// slot reserved for its ticket) that its throttle sends to a throttle
// slot within one lease keeps that slot reserved until it comes back on
// its throttle slot, and starts then; one sent further gives the slot
// up at once to the next waiter (no slot waits a lease for a job that
// cannot start). Before, the deferral dropped the ticket: the reserved
// slot stayed for no one until its reservation ended, a lease on, and
// the waiters deferred each other meanwhile.
func (h *Handler) keepTurn(ctx context.Context, c *Concurrency, rec ledger.Record, a admission) (admission, error) {
	if c == nil || rec.Ticket == 0 {
		return a, nil
	}
	key, err := h.flowKey(ctx, c.Key, rec)
	if err != nil || key == "" {
		return a, err
	}
	now := h.store.Now()
	q := slotQueue{h: h, hash: h.store.HashKey(key), limit: c.Limit, grace: max(ledger.Millis(rec.LeaseUntil).Sub(now), minConcurrencyBackoff)}
	ticket, id, slot, back := rec.Ticket, rec.ID, a.slot, a.deferTo
	a.ticket = ticket
	a.waiter = func() {
		ctx := context.WithoutCancel(ctx)
		if slot.Sub(now) <= q.grace {
			if _, err := h.store.HoldReservation(ctx, q.hash, ticket, back.Add(q.grace)); err != nil {
				// Its reservation ends by itself, and the slot passes on then.
				h.log.WarnContext(ctx, "nexjob: holding a throttled waiter's concurrency slot failed", "job_id", id, "err", err)
			}
			return
		}
		wake, err := h.store.PassOn(ctx, q.hash, ticket, q.limit, q.grace)
		if err != nil {
			h.log.WarnContext(ctx, "nexjob: passing a throttled waiter's concurrency slot on failed", "job_id", id, "err", err)
		}
		q.wake(ctx, wake)
	}
	return a, nil
}

// slotQueue wakes the waiters of one concurrency key.
type slotQueue struct {
	h     *Handler
	hash  string
	limit int
	grace time.Duration // how long a slot reserved for a woken waiter waits for it
}

// release frees holder's slot and wakes the waiter it is handed to.
func (q slotQueue) release(ctx context.Context, holder, id string) {
	wake, err := q.h.store.ReleaseSlot(ctx, q.hash, holder, q.limit, q.grace)
	if err != nil {
		// The slot frees itself when the claim's lease ends.
		q.h.log.WarnContext(ctx, "nexjob: freeing the concurrency slot failed", "job_id", id, "err", err)
	}
	q.wake(ctx, wake)
}

// waiting records that job id holds ticket, once its deferral is
// recorded, and wakes it if its slot was reserved meanwhile (its waker
// found no job to wake).
func (q slotQueue) waiting(ctx context.Context, ticket int64, id string, until time.Time) {
	woken, err := q.h.store.PutWaiter(ctx, q.hash, ticket, id, until.Add(time.Hour))
	if err != nil {
		// Its wake finds no job: it comes back by itself at until.
		q.h.log.WarnContext(ctx, "nexjob: recording a concurrency waiter failed", "job_id", id, "err", err)
	}
	if woken {
		q.wake(ctx, []int64{ticket})
	}
}

// arm brings the next waiter's own return forward to one grace from now,
// should the wake it is due lose its way (a worker killed between a
// release and the send, a holder killed in its run, a woken job that
// never came): whatever the queue's length, a lost wake holds the queue
// up for one lease at most, not until the next waiter's estimated turn.
// A read, an update and a send per wake; a ticket no job holds (the end
// of the queue, a waiter not recorded yet) is passed by.
func (q slotQueue) arm(ctx context.Context, ticket int64) {
	h := q.h
	id, err := h.store.WaiterJob(ctx, q.hash, ticket)
	if err != nil || id == "" {
		return
	}
	rec, ok, err := h.store.ArmWaiter(ctx, id, ticket, h.store.Now().Add(q.grace))
	if err != nil || !ok {
		return
	}
	if err := h.producer.Dispatch(ctx, rec); err != nil {
		h.log.WarnContext(ctx, "nexjob: sending an armed waiter failed; it comes back at its own time", "job_id", id, "err", err)
	}
}

// maxWakes bounds the waiters one call passes over; the rest come back
// by themselves.
const maxWakes = 16

// wake wakes the jobs of tickets, whose slots are reserved: each is made
// due and sent at once. A ticket whose job no longer waits on it has its
// slot passed on to the next.
func (q slotQueue) wake(ctx context.Context, tickets []int64) {
	for n := 0; len(tickets) > 0 && n < maxWakes; n++ {
		t := tickets[0]
		tickets = append(tickets[1:], q.wakeOne(ctx, t)...)
	}
}

// wakeOne wakes ticket's job and returns the tickets a pass-on reserved.
func (q slotQueue) wakeOne(ctx context.Context, ticket int64) []int64 {
	h := q.h
	id, err := h.store.MarkWoken(ctx, q.hash, ticket)
	if err != nil || id == "" {
		// Not recorded yet (its waiter finds the mark and wakes itself),
		// or the mark failed: the reservation ends by itself after grace,
		// and the waiter comes back at its own time.
		return nil
	}
	rec, err := h.store.WakeWaiter(ctx, id, ticket)
	var nc *ledger.NotClaimableError
	switch {
	case err == nil:
		if err := h.producer.Dispatch(ctx, rec); err != nil {
			h.log.WarnContext(ctx, "nexjob: sending a woken waiter failed; it comes back by itself", "job_id", id, "err", err)
		}
		q.arm(ctx, ticket+1)
		return nil
	case errors.As(err, &nc) && nc.Current.State == ledger.Processing && nc.Current.LeaseUntil > h.store.Now().UnixMilli():
		return nil // running on its slot, or about to record its deferral and find the mark
	case errors.As(err, &nc), errors.Is(err, ledger.ErrNotFound), errors.Is(err, ledger.ErrBadID):
		more, err := h.store.PassOn(ctx, q.hash, ticket, q.limit, q.grace)
		if err != nil {
			h.log.WarnContext(ctx, "nexjob: passing a concurrency slot on failed", "job_id", id, "err", err)
		}
		return more
	}
	h.log.WarnContext(ctx, "nexjob: waking a concurrency waiter failed; it comes back by itself", "job_id", id, "err", err)
	return nil
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
