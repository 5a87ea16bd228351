package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// FindOnQueue returns one page of the live jobs whose named queue
// (Record.Queue) is queue and whose state is one of states, and a cursor
// for the next page ("" at the end; a page may be empty while the
// cursor is not). It is a Scan of the whole table with a filter: it
// reads, and is billed for, every record (the byState index does not
// hold the queue). For an operator's tool: moving the jobs of a named
// queue taken out of the configuration.
func (s *Store) FindOnQueue(ctx context.Context, queue string, states []State, cursor string) ([]Record, string, error) {
	if queue == "" || len(states) == 0 {
		return nil, "", errors.New("nexjob: FindOnQueue needs a named queue and at least one state")
	}
	start, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	filter, _, _ := s.filterOf(Filter{})
	in := make([]expression.OperandBuilder, 0, len(states))
	for _, st := range states {
		in = append(in, expression.Value(st))
	}
	filter = filter.And(expression.Name(AttrQueue).Equal(expression.Value(queue))).
		And(expression.Name(AttrState).In(in[0], in[1:]...))
	expr, err := expression.NewBuilder().WithFilter(filter).Build()
	if err != nil {
		return nil, "", fmt.Errorf("nexjob: build scan: %w", err)
	}
	out, err := s.db.Scan(ctx, &dynamodb.ScanInput{
		TableName:                 aws.String(s.table),
		FilterExpression:          expr.Filter(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
		ExclusiveStartKey:         start,
	})
	if err != nil {
		return nil, "", fmt.Errorf("nexjob: scan %s for the jobs of queue %q: %w", s.table, queue, err)
	}
	recs, err := decodeRecords(out.Items)
	if err != nil {
		return nil, "", fmt.Errorf("nexjob: decode job records: %w", err)
	}
	next, err := encodeCursor(out.LastEvaluatedKey)
	return recs, next, err
}

// MoveQueue moves the job seen (as read) to the named queue to ("" the
// job queue): one conditional update of its queue, on the job being still
// as seen (its state and its last write's nonce, which every write
// changes: a claim too; not the fencing token, which an operator's update
// may not name, see infra.OperatorAttributes) and still on seen.Queue. Its
// state, run time and attempt stay; UpdatedAt moves. A Processing job
// moves only once its lease has run out (an orphan): a live run is never
// touched. moved=false, with the current record, means the job moved on
// (claimed, ended, moved elsewhere): nothing was written. A resend of an
// applied move (its reply lost) reads as moved. The caller sends the job
// to its new queue: the write sends nothing.
func (s *Store) MoveQueue(ctx context.Context, seen Record, to string) (Record, bool, error) {
	now := s.now().UnixMilli()
	q := expression.Name(AttrQueue)
	on := q.Equal(expression.Value(seen.Queue))
	if seen.Queue == "" {
		on = expression.AttributeNotExists(q)
	}
	cond := isJob(seen.ID).And(expression.Name(AttrState).Equal(expression.Value(seen.State))).And(lastWrite(seen)).And(on)
	if seen.State == Processing {
		cond = cond.And(expression.Name(AttrLeaseUntil).LessThanEqual(expression.Value(now)))
	}
	upd := expression.Set(expression.Name(AttrUpdatedAt), expression.Value(now))
	if to == "" {
		upd = upd.Remove(q)
	} else {
		upd = upd.Set(q, expression.Value(to))
	}
	rec, err := s.updateByID(ctx, seen.ID, cond, s.withIndex(upd, seen.State, seen.ID, now))
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return rec, err == nil, err
}

// lastWrite holds a write to the record's version seen: its last write's
// nonce (none on a record no update has touched yet).
func lastWrite(seen Record) expression.ConditionBuilder {
	if seen.Nonce == "" {
		return expression.AttributeNotExists(expression.Name(AttrNonce))
	}
	return expression.Name(AttrNonce).Equal(expression.Value(seen.Nonce))
}
