package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// AttrHolders is a concurrency item's map of holder tag (HolderTag) to
// lease end (Unix ms); its pk is "c#<key hash>".
const AttrHolders = "hold"

const concurrencyPrefix = "c#"

// MaxConcurrency bounds a concurrency key's Limit: each holder is 21
// bytes of the key's item (its 8-byte tag, its lease end), so at 40 the
// item stays under 1 KB: one write unit to take a slot and one to free
// it, one read unit, at every accepted Limit.
const MaxConcurrency = 40

// Holder names one run in a concurrency key's holders: the job and the
// claim's fencing token, so a later run of the same job (its lease
// expired, a new claim) never reads the old run's slot as its own, and a
// zombie's release frees only its own.
func Holder(rec Record) string { return rec.ID + "." + strconv.FormatInt(rec.Token, 10) }

// HolderTag is what a concurrency key's item keeps of a holder: 8
// characters of its hash (48 bits), whatever the length of the job's id.
// Holding and SlotHolders name holders by it.
func HolderTag(holder string) string { return RateTag("hold:" + holder) }

// Acquire takes one of the limit slots of keyHash (a Store.HashKey value)
// for holder until the end of its lease, or reports that none is free and
// when the first held one's lease ends. It is AcquireQueued with no
// ticket: a refused holder is given a place in the key's queue.
func (s *Store) Acquire(ctx context.Context, keyHash, holder string, limit int, until time.Time) (ok bool, freeAt time.Time, err error) {
	a, err := s.AcquireQueued(ctx, keyHash, holder, limit, until, Waiting{})
	return a.OK, a.FreeAt, err
}

// Waiting is a holder's place in a concurrency key's queue of waiters.
type Waiting struct {
	// Ticket is the place an earlier refused Acquire gave (Admission.
	// Ticket, kept on the job's record as Record.Ticket); zero for none.
	Ticket int64
	// Grace is how long a slot reserved for a woken waiter waits for it
	// to come (its wake message, its claim) before it frees itself.
	Grace time.Duration
}

// Admission is what AcquireQueued decided.
type Admission struct {
	OK     bool
	FreeAt time.Time // refused: when the first held slot's lease (or reservation) ends
	Ticket int64     // refused: the holder's place in the queue, to keep on its record
	Ahead  int64     // refused: waiters before it not yet woken
	// Wake are the tickets this write reserved a free slot for: the
	// caller wakes their jobs (Store.MarkWoken, Store.WakeWaiter).
	Wake []int64
}

// AcquireQueued takes one of the limit slots of keyHash (a Store.HashKey
// value) for holder until the end of its lease, first come first served:
// the key's item keeps a queue of tickets, and a slot that frees while
// tickets wait is reserved for the earliest (for w.Grace), so a newcomer
// never overtakes a waiter. A refused holder gets a ticket (or keeps
// w.Ticket while it still waits) and, with it, its place; the waiter
// whose slot was reserved takes it with that ticket. Leases and
// reservations that ended are dropped as it writes, and free slots found
// with waiters queued (a holder that died without releasing) are
// reserved for them then (Admission.Wake): the queue heals at every
// acquire. A holder already holding a slot keeps it (a redelivery, or a
// resend whose first put applied and whose reply was lost: the resend
// fails its version condition and the read shows the holder; a refused
// resend may leave a ticket no job holds, which its waker passes over).
//
// One consistent read, and one conditional PutItem of the key's item
// when it changes it, on the key's own partition; ErrContended after 20
// lost races.
func (s *Store) AcquireQueued(ctx context.Context, keyHash, holder string, limit int, until time.Time, w Waiting) (Admission, error) {
	if limit < 1 || limit > MaxConcurrency {
		return Admission{}, fmt.Errorf("nexjob: concurrency limit %d is outside 1 to %d", limit, MaxConcurrency)
	}
	holder = HolderTag(holder)
	var a Admission
	err := s.versioned(ctx, concurrencyPrefix+keyHash, "concurrency slots", func(item map[string]types.AttributeValue, now time.Time) map[string]types.AttributeValue {
		q := readSlots(item, now)
		a = Admission{}
		if _, ok := q.held[holder]; ok {
			a.OK = true
			return nil
		}
		ticket, changed := w.Ticket, false
		if _, reserved := q.held[reservation(ticket)]; ticket == 0 || ticket >= q.next || ticket < q.woke && !reserved {
			// A newcomer, a waiter passed over (its wake found it not
			// yet waiting), or a ticket of the key's item before it
			// expired: to the back of the queue.
			ticket, changed = q.next, true
			q.next++
		}
		a.Wake = q.reserve(limit, now.Add(w.Grace))
		if res := reservation(ticket); q.held[res] != nil {
			delete(q.held, res)
			a.Wake = slices.DeleteFunc(a.Wake, func(t int64) bool { return t == ticket })
			q.held[holder] = millis(until)
			a.OK = true
			return q.item(now)
		}
		a.Ticket, a.Ahead, a.FreeAt = ticket, ticket-q.woke, q.firstEnd()
		if !changed && len(a.Wake) == 0 {
			return nil
		}
		return q.item(now)
	})
	if err != nil {
		return Admission{}, err
	}
	return a, nil
}

// SlotHolders lists the holders of keyHash's slots whose leases have not
// ended, by HolderTag, with their ends: one consistent read, for
// operators and tests.
func (s *Store) SlotHolders(ctx context.Context, keyHash string) (map[string]time.Time, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: concurrencyPrefix + keyHash}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("nexjob: read concurrency slots in %s: %w", s.table, err)
	}
	held := map[string]time.Time{}
	if m, ok := out.Item[AttrHolders].(*types.AttributeValueMemberM); ok {
		for h, av := range m.Value {
			if end, err := num(av); err == nil && end > s.now().UnixMilli() {
				held[h] = Millis(end)
			}
		}
	}
	return held, nil
}

// ReleaseSlot frees holder's slot of keyHash: one UpdateItem, and a no-op
// when the slot is not held (released already, its lease ended and
// another write dropped it, a resend of an applied release). It bumps the
// item's version, so an Acquire that read before it reads again. When
// tickets wait (limit is the key's), the freed slot is reserved for the
// earliest for grace, with one more consistent read and conditional put
// of the key's item, and wake names the tickets to wake (AcquireQueued).
func (s *Store) ReleaseSlot(ctx context.Context, keyHash, holder string, limit int, grace time.Duration) (wake []int64, err error) {
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: concurrencyPrefix + keyHash}},
		ConditionExpression:                 aws.String("attribute_exists(#hold.#me)"),
		UpdateExpression:                    aws.String("REMOVE #hold.#me ADD #ver :one"),
		ExpressionAttributeNames:            map[string]string{"#hold": AttrHolders, "#me": HolderTag(holder), "#ver": AttrItemVer},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var item map[string]types.AttributeValue
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		// Not held (a resend of an applied release, a lease that ended):
		// still, a slot may be free with waiters queued.
		item = ccf.Item
	case err != nil:
		return nil, fmt.Errorf("nexjob: release concurrency slot in %s: %w", s.table, err)
	default:
		item = out.Attributes
	}
	if q := readSlots(item, s.now()); q.woke >= q.next || len(q.held) >= limit {
		return nil, nil // no one waits, or no slot is free
	}
	return s.PassOn(ctx, keyHash, 0, limit, grace)
}

// PassOn gives up the slot reserved for ticket (its job no longer waits:
// ended, cancelled, gone) and reserves the free slots of keyHash for the
// earliest tickets waiting, for grace: one consistent read and, when
// anything changes, one conditional put. Ticket 0 gives up nothing.
func (s *Store) PassOn(ctx context.Context, keyHash string, ticket int64, limit int, grace time.Duration) (wake []int64, err error) {
	err = s.versioned(ctx, concurrencyPrefix+keyHash, "concurrency slots", func(item map[string]types.AttributeValue, now time.Time) map[string]types.AttributeValue {
		q := readSlots(item, now)
		_, had := q.held[reservation(ticket)]
		delete(q.held, reservation(ticket))
		if wake = q.reserve(limit, now.Add(grace)); len(wake) == 0 && !had {
			return nil
		}
		return q.item(now)
	})
	return wake, err
}

// HoldReservation keeps the slot of keyHash reserved for ticket until
// until, when one is reserved for it: a woken waiter that its throttle
// sent to a later throttle slot keeps its turn until it comes back on
// it. One consistent read and, when the reservation is there and ends
// sooner, one conditional put; held is false when none is reserved for
// ticket (not woken yet, or its reservation ended), and nothing is
// written.
func (s *Store) HoldReservation(ctx context.Context, keyHash string, ticket int64, until time.Time) (held bool, err error) {
	err = s.versioned(ctx, concurrencyPrefix+keyHash, "concurrency slots", func(item map[string]types.AttributeValue, now time.Time) map[string]types.AttributeValue {
		q := readSlots(item, now)
		res := reservation(ticket)
		av, ok := q.held[res]
		if held = ok; !ok {
			return nil
		}
		if end, err := num(av); err == nil && end >= until.UnixMilli() {
			return nil
		}
		q.held[res] = millis(until)
		return q.item(now)
	})
	return held, err
}
