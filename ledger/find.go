package ledger

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Filter selects jobs for Find.
type Filter struct {
	// State is required.
	State State
	// Kind, when set, keeps only jobs of that kind.
	Kind string
	// Since and Until bound the job's last change (UpdatedAt) to
	// [Since, Until); a zero bound is open.
	Since, Until time.Time
	// Limit caps the page. Defaults to 100.
	Limit int
	// Cursor continues from a previous page ("" for the first).
	Cursor string
}

// Find returns up to f.Limit jobs matching f and a cursor for the next page
// ("" at the end). Records past their retention are left out.
//
// An indexed state (see Indexed) is a Query of the byState index, most
// recently changed first, reading only that state's records. Any other
// state (Enqueued and Processing, Succeeded unless IndexAllStates) is a
// Scan of the whole table with a filter: it reads, and is billed for,
// every record, and its pages come in table order (each page sorted newest
// first). That suits an operator's tool, not a hot path.
func (s *Store) Find(ctx context.Context, f Filter) ([]Record, string, error) {
	if !f.State.Valid() {
		return nil, "", fmt.Errorf("nexjob: unknown state %q", f.State)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	start, err := decodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	indexed := s.Indexed(f.State)
	var recs []Record
	for {
		items, next, err := s.findPage(ctx, f, indexed, start)
		if err != nil {
			return nil, "", err
		}
		var page []Record
		if err := attributevalue.UnmarshalListOfMaps(items, &page); err != nil {
			return nil, "", fmt.Errorf("nexjob: decode job records: %w", err)
		}
		if need := f.Limit - len(recs); len(page) > need {
			// Continue after the last record kept, in the order DynamoDB
			// returned them (any item's key is a valid start key).
			page = page[:need]
			next = startAfter(page[need-1], indexed)
		}
		recs = append(recs, page...)
		if len(recs) == f.Limit || len(next) == 0 {
			if !indexed {
				sort.SliceStable(recs, func(i, j int) bool { return recs[i].UpdatedAt > recs[j].UpdatedAt })
			}
			c, err := encodeCursor(next)
			return recs, c, err
		}
		start = next
	}
}

// findPage reads one page: a Query of the index or a Scan.
func (s *Store) findPage(ctx context.Context, f Filter, indexed bool, start map[string]types.AttributeValue) ([]map[string]types.AttributeValue, map[string]types.AttributeValue, error) {
	now := s.now().Unix()
	filter := expression.AttributeNotExists(expression.Name(AttrExpiresAt)).Or(expression.Name(AttrExpiresAt).GreaterThan(expression.Value(now)))
	if f.Kind != "" {
		filter = filter.And(expression.Name(AttrKind).Equal(expression.Value(f.Kind)))
	}
	since, until := int64(0), int64(1<<62)
	if !f.Since.IsZero() {
		since = f.Since.UnixMilli()
	}
	if !f.Until.IsZero() {
		until = f.Until.UnixMilli() - 1
	}
	if indexed {
		key := expression.Key(AttrListState).Equal(expression.Value(f.State)).
			And(expression.Key(AttrListAt).Between(expression.Value(since), expression.Value(until)))
		expr, err := expression.NewBuilder().WithKeyCondition(key).WithFilter(filter).Build()
		if err != nil {
			return nil, nil, fmt.Errorf("nexjob: build query: %w", err)
		}
		out, err := s.db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(s.table),
			IndexName:                 aws.String(IndexByState),
			KeyConditionExpression:    expr.KeyCondition(),
			FilterExpression:          expr.Filter(),
			ExpressionAttributeNames:  expr.Names(),
			ExpressionAttributeValues: expr.Values(),
			ScanIndexForward:          aws.Bool(false),
			Limit:                     aws.Int32(int32(f.Limit)),
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("nexjob: list %s jobs in %s: %w", f.State, s.table, err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	}
	filter = filter.And(expression.Name(AttrState).Equal(expression.Value(f.State))).
		And(expression.Name(AttrUpdatedAt).Between(expression.Value(since), expression.Value(until)))
	expr, err := expression.NewBuilder().WithFilter(filter).Build()
	if err != nil {
		return nil, nil, fmt.Errorf("nexjob: build scan: %w", err)
	}
	out, err := s.db.Scan(ctx, &dynamodb.ScanInput{
		TableName:                 aws.String(s.table),
		FilterExpression:          expr.Filter(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
		ExclusiveStartKey:         start,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("nexjob: scan %s for %s jobs: %w", s.table, f.State, err)
	}
	return out.Items, out.LastEvaluatedKey, nil
}

// startAfter is the start key that continues a read after rec.
func startAfter(rec Record, indexed bool) map[string]types.AttributeValue {
	key := map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: rec.PK}}
	if indexed {
		key[AttrListState] = &types.AttributeValueMemberS{Value: string(rec.ListState)}
		key[AttrListAt] = &types.AttributeValueMemberN{Value: fmt.Sprint(rec.ListAt)}
	}
	return key
}

// Counts returns how many live jobs there are per state and kind, with
// one Scan of the table that reads only those attributes (billed for every
// record's full size all the same). For an operator's overview.
func (s *Store) Counts(ctx context.Context) (map[State]map[string]int, error) {
	now := s.now().Unix()
	proj := expression.NamesList(expression.Name(AttrState), expression.Name(AttrKind), expression.Name(AttrExpiresAt))
	expr, err := expression.NewBuilder().WithProjection(proj).Build()
	if err != nil {
		return nil, fmt.Errorf("nexjob: build scan: %w", err)
	}
	counts := map[State]map[string]int{}
	p := dynamodb.NewScanPaginator(s.db, &dynamodb.ScanInput{
		TableName:                aws.String(s.table),
		ProjectionExpression:     expr.Projection(),
		ExpressionAttributeNames: expr.Names(),
	})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("nexjob: scan %s: %w", s.table, err)
		}
		var page []Record
		if err := attributevalue.UnmarshalListOfMaps(out.Items, &page); err != nil {
			return nil, fmt.Errorf("nexjob: decode job records: %w", err)
		}
		for _, r := range page {
			if r.ExpiredAt(time.Unix(now, 0)) {
				continue
			}
			if counts[r.State] == nil {
				counts[r.State] = map[string]int{}
			}
			counts[r.State][r.Kind]++
		}
	}
	return counts, nil
}
