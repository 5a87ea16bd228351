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

// A debounce key's pointer item (pk "d#<key hash>") names the job that
// the key's next enqueue folds into, and the end of its window.
const (
	AttrDebounceJob   = "djob"   // the pending job's id
	AttrDebounceUntil = "duntil" // unix ms: no fold moves its run later (MaxWait from the first)
)

const debouncePrefix = "d#"

// NewJobID returns a fresh id for an unkeyed job (InsertOptions.ID,
// PrepareAs: a flow's records name each other before they are built).
func NewJobID() string { return newID("") }

// Debounced reads a debounce key's pointer: the job enqueues fold into
// and its window's end, or "" when none was written; ver is the item's
// version for StartDebounce. One consistent read.
func (s *Store) Debounced(ctx context.Context, keyHash string) (jobID string, until time.Time, ver int64, err error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: debouncePrefix + keyHash}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return "", time.Time{}, 0, fmt.Errorf("nexjob: read debounce key in %s: %w", s.table, err)
	}
	if v, ok := out.Item[AttrItemVer].(*types.AttributeValueMemberN); ok {
		ver, _ = strconv.ParseInt(v.Value, 10, 64)
	}
	jobID, _ = str(out.Item[AttrDebounceJob])
	if ms, err := num(out.Item[AttrDebounceUntil]); err == nil {
		until = Millis(ms)
	}
	return jobID, until, ver, nil
}

// StartDebounce writes the job rec (a new unkeyed job: Insert stamps it
// the same way, with a fresh id) and points the debounce key at it, a
// new window ending at until, in one transaction: conditional on the
// key's item still being at version ver (0: no item) and on the job not
// existing. Neither is ever written without the other, so an enqueue
// never meets a pointer naming a job still to come (which it would take
// for a lost one and start a second window beside it), and a producer
// that dies mid-way leaves nothing behind.
//
// ok=false: another enqueue pointed the key first (read it again); the
// error is then nil and nothing was written. A resend whose first try
// applied (its reply lost), or a try whose outcome the error leaves
// open, is settled by reading the pointer: naming our job, it applied.
// The pointer expires (TTL) an hour after until.
//
// Cost: a two-item TransactWriteItems, 4 write units (+2 for the job's
// index entry), where a put of each would be 2: the price of the pair
// being atomic, paid once per window, not per fold.
func (s *Store) StartDebounce(ctx context.Context, keyHash string, rec Record, policy DuplicatePolicy, until time.Time, ver int64) (Record, bool, error) {
	if len(rec.Args) > MaxArgsBytes {
		return Record{}, false, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(rec.Args), MaxArgsBytes)
	}
	rec = s.stamp(rec, "", policy, s.now())
	cond, names, vals := "attribute_not_exists(#pk)", map[string]string{"#pk": AttrPK}, map[string]types.AttributeValue(nil)
	if ver > 0 {
		cond, names = "#ver = :old", map[string]string{"#ver": AttrItemVer}
		vals = map[string]types.AttributeValue{":old": &types.AttributeValueMemberN{Value: strconv.FormatInt(ver, 10)}}
	}
	pointer := types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(s.table),
		Item: map[string]types.AttributeValue{
			AttrPK:            &types.AttributeValueMemberS{Value: debouncePrefix + keyHash},
			AttrDebounceJob:   &types.AttributeValueMemberS{Value: rec.ID},
			AttrDebounceUntil: millis(until),
			AttrItemVer:       &types.AttributeValueMemberN{Value: strconv.FormatInt(ver+1, 10)},
			AttrExpiresAt:     &types.AttributeValueMemberN{Value: strconv.FormatInt(TTL(until.Add(time.Hour)), 10)},
		},
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: vals,
	}}
	_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: []types.TransactWriteItem{pointer, s.putItem(rec, absent())},
	})
	if err == nil {
		return rec, true, nil
	}
	var tce *types.TransactionCanceledException
	cancelled := errors.As(err, &tce)
	if cancelled {
		for _, r := range tce.CancellationReasons {
			switch aws.ToString(r.Code) {
			case "", "None", "ConditionalCheckFailed", "TransactionConflict":
			default:
				cancelled = false // refused for another reason: an error, after the look below
			}
		}
	}
	if !cancelled && !unknownOutcome(err) {
		return Record{}, false, fmt.Errorf("nexjob: start debounce window in %s: %w", s.table, err)
	}
	cur, _, _, rerr := s.Debounced(ctx, keyHash)
	switch {
	case rerr != nil:
		return Record{}, false, &UnknownOutcomeError{ID: rec.ID, Err: errors.Join(err, rerr)}
	case cur == rec.ID:
		return rec, true, nil // ours, applied: its reply was lost
	case cancelled:
		return Record{}, false, nil
	}
	return Record{}, false, fmt.Errorf("nexjob: start debounce window in %s: %w", s.table, err)
}

// Fold puts a later enqueue's args and deadline (rec's Args and
// Deadline; none removes the job's) into the debounced job jobID and
// moves its run to runAt: one update, conditional on the job being of
// rec's kind, Scheduled and never run: attempt 0, no run cut off, and no
// steps (a run that sleeps or waits gives its attempt back, and a fold
// into it replaced the args of a job whose charge was made; a job sent a
// signal before any run is not folded into either). The deadline is
// the folding enqueue's because the run it bounds is that enqueue's:
// the first enqueue's would expire a job moved past it. folded=false
// (with the current record, or ErrNotFound) means it is not pending any
// more: the enqueue starts the next window.
func (s *Store) Fold(ctx context.Context, jobID string, rec Record, runAt time.Time) (Record, bool, error) {
	if len(rec.Args) > MaxArgsBytes {
		return Record{}, false, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(rec.Args), MaxArgsBytes)
	}
	st := expression.Name(AttrState)
	cond := isJob(jobID).And(st.Equal(expression.Value(Scheduled))).
		And(expression.Name(AttrAttempt).Equal(expression.Value(0))).
		And(expression.Name(AttrKind).Equal(expression.Value(rec.Kind))).
		And(expression.Name(AttrSteps).AttributeNotExists()).
		And(expression.Name(AttrRan).AttributeNotExists()).
		And(expression.Name(AttrCutOffs).AttributeNotExists())
	upd := expression.Set(expression.Name(AttrArgs), expression.Value(rec.Args)).
		Set(expression.Name(AttrArgsHash), expression.Value(ArgsHash(rec.Kind, rec.Args))).
		Set(expression.Name(AttrRunAt), expression.Value(runAt.UnixMilli())).
		Set(st, expression.Value(Scheduled))
	if rec.Deadline != 0 {
		upd = upd.Set(expression.Name(AttrDeadline), expression.Value(rec.Deadline))
	} else {
		upd = upd.Remove(expression.Name(AttrDeadline))
	}
	return s.transition(ctx, jobID, cond, upd, Scheduled, "", time.Time{})
}
