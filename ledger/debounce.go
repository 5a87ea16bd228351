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

// NewJobID returns a fresh id for an unkeyed job (InsertOptions.ID).
func NewJobID() string { return newID("") }

// Debounced reads a debounce key's pointer: the job enqueues fold into
// and its window's end, or "" when none was written; ver is the item's
// version for PointDebounce. One consistent read.
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

// PointDebounce points the debounce key at jobID (a new window ending at
// until) if its item is still at version ver (0: no item). ok=false: an
// enqueue with the same key pointed it first (read it again). A resend
// whose first put applied and whose reply was lost reads as ok: the
// pointer names our job. The item expires (TTL) an hour after until.
func (s *Store) PointDebounce(ctx context.Context, keyHash, jobID string, until time.Time, ver int64) (bool, error) {
	cond, names, vals := "attribute_not_exists(#pk)", map[string]string{"#pk": AttrPK}, map[string]types.AttributeValue(nil)
	if ver > 0 {
		cond, names = "#ver = :old", map[string]string{"#ver": AttrItemVer}
		vals = map[string]types.AttributeValue{":old": &types.AttributeValueMemberN{Value: strconv.FormatInt(ver, 10)}}
	}
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.table),
		Item: map[string]types.AttributeValue{
			AttrPK:            &types.AttributeValueMemberS{Value: debouncePrefix + keyHash},
			AttrDebounceJob:   &types.AttributeValueMemberS{Value: jobID},
			AttrDebounceUntil: &types.AttributeValueMemberN{Value: strconv.FormatInt(until.UnixMilli(), 10)},
			AttrItemVer:       &types.AttributeValueMemberN{Value: strconv.FormatInt(ver+1, 10)},
			AttrExpiresAt:     &types.AttributeValueMemberN{Value: strconv.FormatInt(TTL(until.Add(time.Hour)), 10)},
		},
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: vals,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		cur, _, _, rerr := s.Debounced(ctx, keyHash)
		if rerr != nil {
			return false, rerr
		}
		return cur == jobID, nil
	}
	if err != nil {
		return false, fmt.Errorf("nexjob: write debounce key in %s: %w", s.table, err)
	}
	return true, nil
}

// Fold puts a later enqueue's args into the debounced job jobID and
// moves its run to runAt: one update, conditional on the job being of
// this kind, Scheduled and never claimed (attempt 0). folded=false (with
// the current record, or ErrNotFound) means it is not pending any more:
// the enqueue starts the next window.
func (s *Store) Fold(ctx context.Context, jobID, kind, args string, runAt time.Time) (Record, bool, error) {
	if len(args) > MaxArgsBytes {
		return Record{}, false, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(args), MaxArgsBytes)
	}
	st := expression.Name(AttrState)
	cond := isJob(jobID).And(st.Equal(expression.Value(Scheduled))).
		And(expression.Name(AttrAttempt).Equal(expression.Value(0))).
		And(expression.Name(AttrKind).Equal(expression.Value(kind)))
	upd := expression.Set(expression.Name(AttrArgs), expression.Value(args)).
		Set(expression.Name(AttrArgsHash), expression.Value(ArgsHash(kind, args))).
		Set(expression.Name(AttrRunAt), expression.Value(runAt.UnixMilli())).
		Set(st, expression.Value(Scheduled))
	return s.transition(ctx, jobID, cond, upd, Scheduled, "", time.Time{})
}
