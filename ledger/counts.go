package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// CountIndexed is CountJobs read from the byState index instead of the
// table: the jobs of the indexed states (Indexed: Scheduled,
// AwaitingContinuation, Failed and Expired; every state under
// IndexAllStates) by state and kind, those of them that ended since since
// (JobCounts.Ends: each one's kind, end, due time and attempts) and the
// oldest due time of the jobs waiting to start (JobCounts.OldestDue:
// Scheduled ones past their RunAt; Enqueued ones only under
// IndexAllStates). One Scan of the index, paginated, reading only its entries
// (IndexProjection: never the args, the error cut to MaxListError), so
// its read units grow with the number of indexed jobs, never with their
// args: an entry is a few hundred bytes, half a read unit per 4 KB of
// them (eventually consistent, as every read of an index). The states the
// index does not hold are not counted (JobCounts.Counted says which are);
// CountJobs counts them, at the price of reading every record whole.
// Records past their retention and items that are not jobs are left out,
// as CountJobs leaves them. A deployment that turned IndexAllStates on
// counts a record written before in a state then unindexed only once it
// changes state.
//
// How it fails: the Scan's error, wrapped, and nothing counted.
func (s *Store) CountIndexed(ctx context.Context, since time.Time) (JobCounts, error) {
	nowMs := s.now().UnixMilli()
	now := time.Unix(nowMs/1000, 0)
	expr, err := countedProjection()
	if err != nil {
		return JobCounts{}, fmt.Errorf("nexjob: build index scan: %w", err)
	}
	c := JobCounts{ByState: map[State]map[string]int{}, EndedSince: map[State]int{}}
	for _, st := range append(append([]State{}, ActiveStates...), TerminalStates...) {
		if s.Indexed(st) {
			c.Counted = append(c.Counted, st)
		}
	}
	p := dynamodb.NewScanPaginator(s.db, &dynamodb.ScanInput{
		TableName:                aws.String(s.table),
		IndexName:                aws.String(IndexByState),
		ProjectionExpression:     expr.Projection(),
		ExpressionAttributeNames: expr.Names(),
	})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return JobCounts{}, fmt.Errorf("nexjob: scan the %s index of %s: %w", IndexByState, s.table, err)
		}
		page, err := decodeRecords(out.Items)
		if err != nil {
			return JobCounts{}, fmt.Errorf("nexjob: decode index entries: %w", err)
		}
		for _, r := range page {
			if r.ExpiredAt(now) || !isJobPK(r.PK) || r.Kind == "" || !s.Indexed(r.State) {
				continue // past retention; not a job; an entry of a state not counted
			}
			c.add(r, since, nowMs)
		}
	}
	return c, nil
}
