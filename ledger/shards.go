package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The index's shard count can change between deployments (settings'
// NEXJOB_INDEX_SHARDS), and entries written under a higher count stay on
// their shard until the record's next write or its TTL. So a listing
// reads every shard any writer may have used: at least
// DefaultIndexShards, its own count, and the highest count recorded in
// the table's index item (pk "x#index"), which a Store above the default
// records before it writes (RecordIndexShards; settings.Load calls it).
// Lowering the count never hides a Failed or Expired job.
const (
	indexItemPK   = "x#index"
	AttrMaxShards = "maxShards" // the index item's highest shard count any writer used
)

// RecordIndexShards records this Store's shard count in the table's index
// item when it is above DefaultIndexShards (at most the count is raised,
// never lowered), so that listings by any later deployment read its
// shards: one conditional UpdateItem, once per process, before the first
// write. A resend whose first update applied meets its own value and is
// no error; a failure is returned and the caller should not write.
func (s *Store) RecordIndexShards(ctx context.Context) error {
	if s.shards <= DefaultIndexShards {
		return nil
	}
	n := &types.AttributeValueMemberN{Value: strconv.Itoa(s.shards)}
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: indexItemPK}},
		UpdateExpression:          aws.String("SET #n = :n"),
		ConditionExpression:       aws.String("attribute_not_exists(#n) OR #n < :n"),
		ExpressionAttributeNames:  map[string]string{"#n": AttrMaxShards},
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": n},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // as high or higher already (or our own resend)
	}
	if err != nil {
		return fmt.Errorf("nexjob: record the index's shard count in %s: %w", s.table, err)
	}
	return nil
}

// listShards is how many shards a listing reads: the most any writer of
// the table may have used (one consistent GetItem of the index item).
func (s *Store) listShards(ctx context.Context) (int, error) {
	n := max(s.shards, DefaultIndexShards)
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: indexItemPK}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return 0, fmt.Errorf("nexjob: read the index's shard count in %s: %w", s.table, err)
	}
	if v, err := num(out.Item[AttrMaxShards]); err == nil && int(v) > n && v <= MaxIndexShards {
		n = int(v)
	}
	return n, nil
}

// isJobPK reports whether pk is a job record's (by its id or its key),
// not one of the table's other items (flow control's, the index item).
func isJobPK(pk string) bool {
	return len(pk) > 2 && (pk[:2] == jobPrefix || pk[:2] == keyPrefix)
}
