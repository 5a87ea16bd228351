package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attributes of a concurrency item's queue of waiters (AcquireQueued).
const (
	AttrNextTicket = "qnext" // the next ticket to give
	AttrWokeTicket = "qwoke" // tickets below it have been woken (a slot reserved for each)
	attrWaiterJob  = "job"   // a waiter item's job id
	attrWoken      = "woken" // true on a waiter item once its slot was reserved
)

// waiterPrefix names a waiter item: "w#<key hash>#<ticket>", the job
// that holds the ticket.
const waiterPrefix = "w#"

// queuedTTL is how long a concurrency item lives past its last write
// while tickets wait: its counters must outlive every waiting ticket.
const queuedTTL = 90 * 24 * time.Hour

// slots is a concurrency item as AcquireQueued and PassOn change it.
type slots struct {
	held       map[string]types.AttributeValue // live holders and reservations: tag to end (unix ms)
	next, woke int64
}

// readSlots decodes a concurrency item, dropping ended leases. An item
// with no queue yet starts its tickets at now's Unix ms times 1000, so a
// ticket of an item that expired is never taken for one of its successor.
func readSlots(item map[string]types.AttributeValue, now time.Time) slots {
	q := slots{held: map[string]types.AttributeValue{}}
	if m, ok := item[AttrHolders].(*types.AttributeValueMemberM); ok {
		for h, av := range m.Value {
			if end, err := num(av); err == nil && end > now.UnixMilli() {
				q.held[h] = av
			}
		}
	}
	next, err1 := num(item[AttrNextTicket])
	woke, err2 := num(item[AttrWokeTicket])
	if err1 != nil || err2 != nil || woke > next {
		next, woke = now.UnixMilli()*1000, now.UnixMilli()*1000
	}
	q.next, q.woke = next, woke
	return q
}

// reservation is the holder tag of the slot reserved for ticket.
func reservation(ticket int64) string { return HolderTag("ticket:" + strconv.FormatInt(ticket, 10)) }

// reserve gives each free slot to the earliest ticket waiting, until
// until, and returns the tickets it reserved for.
func (q *slots) reserve(limit int, until time.Time) []int64 {
	var woke []int64
	for len(q.held) < limit && q.woke < q.next {
		q.held[reservation(q.woke)] = millis(until)
		woke = append(woke, q.woke)
		q.woke++
	}
	return woke
}

// firstEnd is when the first held slot frees itself (zero: none held).
func (q *slots) firstEnd() time.Time {
	var first time.Time
	for _, av := range q.held {
		if end, err := num(av); err == nil && (first.IsZero() || Millis(end).Before(first)) {
			first = Millis(end)
		}
	}
	return first
}

// item is the concurrency item to put. It expires an hour after its last
// lease, or queuedTTL after now while tickets wait.
func (q *slots) item(now time.Time) map[string]types.AttributeValue {
	latest := now
	for _, av := range q.held {
		if end, err := num(av); err == nil && Millis(end).After(latest) {
			latest = Millis(end)
		}
	}
	expires := latest.Add(time.Hour)
	if q.woke < q.next {
		expires = now.Add(queuedTTL)
	}
	return map[string]types.AttributeValue{
		AttrHolders:    &types.AttributeValueMemberM{Value: q.held},
		AttrNextTicket: &types.AttributeValueMemberN{Value: strconv.FormatInt(q.next, 10)},
		AttrWokeTicket: &types.AttributeValueMemberN{Value: strconv.FormatInt(q.woke, 10)},
		AttrExpiresAt:  &types.AttributeValueMemberN{Value: strconv.FormatInt(TTL(expires), 10)},
	}
}

func waiterKey(keyHash string, ticket int64) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: waiterPrefix + keyHash + "#" + strconv.FormatInt(ticket, 10)}}
}

// PutWaiter records that job jobID holds ticket of keyHash, until
// expires, and reports whether the ticket was woken already (a waker
// came before the record: MarkWoken found no job, and the waiter wakes
// itself). One UpdateItem of the ticket's own item.
func (s *Store) PutWaiter(ctx context.Context, keyHash string, ticket int64, jobID string, expires time.Time) (woken bool, err error) {
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       waiterKey(keyHash, ticket),
		UpdateExpression:          aws.String("SET #job = :job, #exp = :exp"),
		ExpressionAttributeNames:  map[string]string{"#job": attrWaiterJob, "#exp": AttrExpiresAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{":job": &types.AttributeValueMemberS{Value: jobID}, ":exp": &types.AttributeValueMemberN{Value: strconv.FormatInt(TTL(expires), 10)}},
		ReturnValues:              types.ReturnValueAllNew,
	})
	if err != nil {
		return false, fmt.Errorf("nexjob: record a concurrency waiter in %s: %w", s.table, err)
	}
	v, ok := out.Attributes[attrWoken].(*types.AttributeValueMemberBOOL)
	return ok && v.Value, nil
}

// MarkWoken marks ticket of keyHash woken and returns the job holding it
// ("" when its waiter has not recorded it yet: the waiter then finds the
// mark, Woken, and wakes itself). One UpdateItem; a resend is the same
// write.
func (s *Store) MarkWoken(ctx context.Context, keyHash string, ticket int64) (jobID string, err error) {
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       waiterKey(keyHash, ticket),
		UpdateExpression:          aws.String("SET #woken = :t, #exp = if_not_exists(#exp, :exp)"),
		ExpressionAttributeNames:  map[string]string{"#woken": attrWoken, "#exp": AttrExpiresAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}, ":exp": &types.AttributeValueMemberN{Value: strconv.FormatInt(TTL(s.now().Add(queuedTTL)), 10)}},
		ReturnValues:              types.ReturnValueAllNew,
	})
	if err != nil {
		return "", fmt.Errorf("nexjob: mark a concurrency waiter woken in %s: %w", s.table, err)
	}
	if v, ok := out.Attributes[attrWaiterJob].(*types.AttributeValueMemberS); ok {
		return v.Value, nil
	}
	return "", nil
}

// ErrNotWaiting: WakeWaiter found the job not waiting on the ticket
// (running, ended, cancelled, deferred again with another ticket). The
// *NotClaimableError it wraps carries the record.
var ErrNotWaiting = errors.New("nexjob: job is not waiting on this ticket")

// WakeWaiter makes job id, Scheduled and waiting on ticket, due now: one
// conditional UpdateItem. The caller then sends its message. A job not
// waiting on the ticket is an error wrapping ErrNotWaiting and a
// *NotClaimableError with its record; a job gone is ErrNotFound.
func (s *Store) WakeWaiter(ctx context.Context, id string, ticket int64) (Record, error) {
	rec, err := s.updateByID(ctx, id, scheduled(id).And(onTicket(ticket)), dueNow(s.now()))
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return Record{}, fmt.Errorf("%w: %w", ErrNotWaiting, err)
	}
	return rec, err
}

// WaiterJob is the job holding ticket of keyHash ("" when none recorded
// it): one eventually consistent GetItem.
func (s *Store) WaiterJob(ctx context.Context, keyHash string, ticket int64) (string, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.table), Key: waiterKey(keyHash, ticket)})
	if err != nil {
		return "", fmt.Errorf("nexjob: read a concurrency waiter in %s: %w", s.table, err)
	}
	if v, ok := out.Item[attrWaiterJob].(*types.AttributeValueMemberS); ok {
		return v.Value, nil
	}
	return "", nil
}

// ArmWaiter brings the run time of job id, Scheduled and waiting on
// ticket, forward to at when it is later: one conditional UpdateItem; ok
// false when the job does not wait on the ticket or is due sooner. The
// caller sends its message.
func (s *Store) ArmWaiter(ctx context.Context, id string, ticket int64, at time.Time) (Record, bool, error) {
	cond := scheduled(id).And(onTicket(ticket)).And(expression.Name(AttrRunAt).GreaterThan(expression.Value(at.UnixMilli())))
	rec, err := s.updateByID(ctx, id, cond, expression.Set(expression.Name(AttrRunAt), expression.Value(at.UnixMilli())))
	var nc *NotClaimableError
	if errors.As(err, &nc) || errors.Is(err, ErrNotFound) {
		return Record{}, false, nil
	}
	return rec, err == nil, err
}

// scheduled is the condition that the item is job id, Scheduled: what a
// wake or an arming of a waiting job writes on.
func scheduled(id string) expression.ConditionBuilder {
	return isJob(id).And(expression.Name(AttrState).Equal(expression.Value(string(Scheduled))))
}

// onTicket: the job waits on ticket of its concurrency key.
func onTicket(ticket int64) expression.ConditionBuilder {
	return expression.Name(AttrTicket).Equal(expression.Value(ticket))
}

// dueNow makes a job due at now (a wake).
func dueNow(now time.Time) expression.UpdateBuilder {
	ms := now.UnixMilli()
	return expression.Set(expression.Name(AttrRunAt), expression.Value(ms)).Set(expression.Name(AttrUpdatedAt), expression.Value(ms))
}
