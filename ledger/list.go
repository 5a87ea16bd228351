package ledger

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ErrNotIndexed: List of a state the byState index does not hold (see
// Options.IndexAllStates).
var ErrNotIndexed = errors.New("nexjob: jobs in this state are not indexed for listing")

// ErrBadCursor: the cursor did not come from List.
var ErrBadCursor = errors.New("nexjob: malformed list cursor")

// Indexed reports whether records in state st carry the byState index key.
func (s *Store) Indexed(st State) bool {
	if s.indexAll {
		return st.Valid()
	}
	switch st {
	case Scheduled, AwaitingContinuation, Failed, Expired:
		return true
	}
	return false
}

// withIndex adds to upd the index attributes for a move to state st: set
// when st is indexed, removed otherwise (removing absent attributes costs
// no index write).
func (s *Store) withIndex(upd expression.UpdateBuilder, st State, nowMs int64) expression.UpdateBuilder {
	if s.Indexed(st) {
		return upd.Set(expression.Name(AttrListState), expression.Value(st)).
			Set(expression.Name(AttrListAt), expression.Value(nowMs))
	}
	return upd.Remove(expression.Name(AttrListState)).Remove(expression.Name(AttrListAt))
}

// List returns up to limit jobs in state st, most recently changed first,
// and a cursor for the next page ("" at the end). It queries the sparse
// byState index (no scan); records past their retention are left out, so a
// page may hold fewer than limit records while the cursor is not "".
func (s *Store) List(ctx context.Context, st State, limit int, cursor string) ([]Record, string, error) {
	if !s.Indexed(st) {
		return nil, "", fmt.Errorf("%w: %s", ErrNotIndexed, st)
	}
	if limit <= 0 {
		limit = 100
	}
	start, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	now := s.now().Unix()
	expr, err := expression.NewBuilder().
		WithKeyCondition(expression.Key(AttrListState).Equal(expression.Value(st))).
		WithFilter(expression.AttributeNotExists(expression.Name(AttrExpiresAt)).Or(expression.Name(AttrExpiresAt).GreaterThan(expression.Value(now)))).
		Build()
	if err != nil {
		return nil, "", fmt.Errorf("nexjob: build query: %w", err)
	}
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.table),
		IndexName:                 aws.String(IndexByState),
		KeyConditionExpression:    expr.KeyCondition(),
		FilterExpression:          expr.Filter(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(int32(limit)),
		ExclusiveStartKey:         start,
	})
	if err != nil {
		return nil, "", fmt.Errorf("nexjob: list %s jobs in %s: %w", st, s.table, err)
	}
	var recs []Record
	if err := attributevalue.UnmarshalListOfMaps(out.Items, &recs); err != nil {
		return nil, "", fmt.Errorf("nexjob: decode job records: %w", err)
	}
	next, err := encodeCursor(out.LastEvaluatedKey)
	return recs, next, err
}

// A cursor is the query's LastEvaluatedKey (pk, listState, listAt) as
// base64 JSON of strings and numbers.
func encodeCursor(key map[string]types.AttributeValue) (string, error) {
	if len(key) == 0 {
		return "", nil
	}
	plain := map[string]string{}
	for k, v := range key {
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			plain["s:"+k] = v.Value
		case *types.AttributeValueMemberN:
			plain["n:"+k] = v.Value
		default:
			return "", fmt.Errorf("nexjob: unexpected key attribute %s", k)
		}
	}
	b, err := json.Marshal(plain)
	return base64.RawURLEncoding.EncodeToString(b), err
}

func decodeCursor(c string) (map[string]types.AttributeValue, error) {
	if c == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, ErrBadCursor
	}
	var plain map[string]string
	if json.Unmarshal(b, &plain) != nil || len(plain) != 3 {
		return nil, ErrBadCursor
	}
	key := map[string]types.AttributeValue{}
	for k, v := range plain {
		switch k {
		case "s:" + AttrPK, "s:" + AttrListState:
			key[k[2:]] = &types.AttributeValueMemberS{Value: v}
		case "n:" + AttrListAt:
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return nil, ErrBadCursor
			}
			key[k[2:]] = &types.AttributeValueMemberN{Value: v}
		default:
			return nil, ErrBadCursor
		}
	}
	return key, nil
}
