package ledger

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
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
// An indexed state (see Indexed) is a Query of each of the byState
// index's shards for that state (IndexShards, and the unsharded key of
// records written before sharding), merged most recently changed first,
// reading only that state's entries: IndexShards+1 Queries at least per
// page. Its records carry only what the index projects (IndexProjection:
// no args, LastError cut to MaxListError); Get reads a whole record. Any other
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
	if s.Indexed(f.State) {
		return s.findIndexed(ctx, f)
	}
	start, err := decodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	var recs []Record
	for {
		items, next, err := s.scanPage(ctx, f, start)
		if err != nil {
			return nil, "", err
		}
		page, err := decodeRecords(items)
		if err != nil {
			return nil, "", fmt.Errorf("nexjob: decode job records: %w", err)
		}
		if need := f.Limit - len(recs); len(page) > need {
			// Continue after the last record kept, in the order DynamoDB
			// returned them (any item's key is a valid start key).
			page = page[:need]
			next = map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: page[need-1].PK}}
		}
		recs = append(recs, page...)
		if len(recs) == f.Limit || len(next) == 0 {
			sort.SliceStable(recs, func(i, j int) bool { return recs[i].UpdatedAt > recs[j].UpdatedAt })
			c, err := encodeCursor(next)
			return recs, c, err
		}
		start = next
	}
}

// filterOf is f's filter (live records of its kind) and its time bounds
// in Unix ms, [since, until].
func (s *Store) filterOf(f Filter) (expression.ConditionBuilder, int64, int64) {
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
	return filter, since, until
}

// queryShard reads one page of one index partition key value, newest
// first.
func (s *Store) queryShard(ctx context.Context, f Filter, key string, start map[string]types.AttributeValue) ([]Record, map[string]types.AttributeValue, error) {
	filter, since, until := s.filterOf(f)
	kc := expression.Key(AttrListState).Equal(expression.Value(key)).
		And(expression.Key(AttrListAt).Between(expression.Value(since), expression.Value(until)))
	expr, err := expression.NewBuilder().WithKeyCondition(kc).WithFilter(filter).Build()
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
	page, err := decodeRecords(out.Items)
	if err != nil {
		return nil, nil, fmt.Errorf("nexjob: decode job records: %w", err)
	}
	for i := range page {
		if page[i].LastError == "" {
			page[i].LastError = page[i].ListErr // the index holds the cut one
		}
	}
	return page, out.LastEvaluatedKey, nil
}

// shardRead is one index partition key value's place in a merged listing.
type shardRead struct {
	key   string
	start map[string]types.AttributeValue // where this call began reading it
	next  map[string]types.AttributeValue // where its read buffer ends
	buf   []Record                        // read, not yet listed
	last  *Record                         // the last of its records listed
	done  bool                            // nothing more to read
}

// findIndexed lists an indexed state: every shard's partition key value
// (and the unsharded one of older records) queried newest first, merged
// by time. Each shard is read lazily, a page at a time, only when its
// next record could be the newest of all; the cursor keeps each shard's
// place, so pages neither skip nor repeat a record.
func (s *Store) findIndexed(ctx context.Context, f Filter) ([]Record, string, error) {
	shards, err := s.listShards(ctx)
	if err != nil {
		return nil, "", err
	}
	keys := s.listKeys(f.State, shards)
	reads := make([]*shardRead, len(keys))
	pos, err := decodeShardCursor(f.Cursor, len(keys))
	if err != nil {
		return nil, "", err
	}
	for i, k := range keys {
		r := &shardRead{key: k}
		if p, ok := pos[i]; ok {
			if p == nil {
				r.done = true
			} else {
				r.start = map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: p.PK}, AttrListState: &types.AttributeValueMemberS{Value: k},
					AttrListAt: &types.AttributeValueMemberN{Value: strconv.FormatInt(p.At, 10)}}
			}
		}
		r.next = r.start
		reads[i] = r
	}
	var out []Record
	for len(out) < f.Limit {
		var best *shardRead
		for _, r := range reads {
			// A shard whose buffer is empty may hold the newest record:
			// read on until it has one or has nothing more.
			for len(r.buf) == 0 && !r.done {
				page, next, err := s.queryShard(ctx, f, r.key, r.next)
				if err != nil {
					return nil, "", err
				}
				if len(next) == 0 {
					next = nil // this buffer is the shard's last
				}
				r.buf, r.next, r.done = page, next, next == nil && len(page) == 0
			}
			if len(r.buf) > 0 && (best == nil || newer(r.buf[0], best.buf[0])) {
				best = r
			}
		}
		if best == nil {
			break
		}
		rec := best.buf[0]
		best.buf = best.buf[1:]
		best.last = &rec
		if len(best.buf) == 0 && best.next == nil {
			best.done = true
		}
		out = append(out, rec)
	}
	c, err := encodeShardCursor(reads)
	return out, c, err
}

// newer orders the merged listing: the later change first, then the
// partition key, so the order is total.
func newer(a, b Record) bool {
	if a.ListAt != b.ListAt {
		return a.ListAt > b.ListAt
	}
	return a.PK > b.PK
}

// shardPos is one shard's place in a cursor: after the record with this
// table key and sort key; a nil *shardPos is a shard read to its end.
type shardPos struct {
	PK string `json:"p"`
	At int64  `json:"t"`
}

func encodeShardCursor(reads []*shardRead) (string, error) {
	pos := map[string]*shardPos{}
	more := false
	for i, r := range reads {
		switch {
		case r.done:
			pos[strconv.Itoa(i)] = nil
		case r.last != nil:
			pos[strconv.Itoa(i)] = &shardPos{PK: r.last.PK, At: r.last.ListAt}
			more = true
		case r.start != nil:
			at, _ := strconv.ParseInt(r.start[AttrListAt].(*types.AttributeValueMemberN).Value, 10, 64)
			pos[strconv.Itoa(i)] = &shardPos{PK: r.start[AttrPK].(*types.AttributeValueMemberS).Value, At: at}
			more = true
		default:
			more = true // not begun
		}
	}
	if !more {
		return "", nil
	}
	b, err := json.Marshal(struct {
		V int                  `json:"v"`
		N int                  `json:"n"`
		S map[string]*shardPos `json:"s"`
	}{3, len(reads), pos})
	return base64.RawURLEncoding.EncodeToString(b), err
}

// decodeShardCursor reads encodeShardCursor's: shard index to its place
// (nil: read to its end; absent: from the start).
func decodeShardCursor(c string, shards int) (map[int]*shardPos, error) {
	if c == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, ErrBadCursor
	}
	var v struct {
		V int                  `json:"v"`
		N int                  `json:"n"`
		S map[string]*shardPos `json:"s"`
	}
	if json.Unmarshal(b, &v) != nil || v.V != 3 || v.N != shards {
		// Another version, or made when the index had another shard count
		// (its positions would name other shards: entries listed twice).
		return nil, ErrBadCursor
	}
	out := map[int]*shardPos{}
	for k, p := range v.S {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= shards || p != nil && !strings.HasPrefix(p.PK, jobPrefix) && !strings.HasPrefix(p.PK, keyPrefix) {
			return nil, ErrBadCursor // another shard count, or not ours
		}
		out[i] = p
	}
	return out, nil
}

// scanPage reads one page of a Scan.
func (s *Store) scanPage(ctx context.Context, f Filter, start map[string]types.AttributeValue) ([]map[string]types.AttributeValue, map[string]types.AttributeValue, error) {
	filter, since, until := s.filterOf(f)
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

// Counts counts the jobs by state and kind (one Scan; see CountJobs).
func (s *Store) Counts(ctx context.Context) (map[State]map[string]int, error) {
	c, err := s.CountJobs(ctx, time.Time{})
	return c.ByState, err
}

// JobCounts are CountJobs's and CountIndexed's counts.
type JobCounts struct {
	ByState map[State]map[string]int // jobs by state and kind
	// EndedSince are the jobs by end state (Succeeded, Failed, Expired)
	// whose record last changed at or after the time asked (an end, or an
	// operator's cancel).
	EndedSince map[State]int
	// Counted are the states counted, in State order: every state for
	// CountJobs, the indexed ones (Indexed) for CountIndexed. A state not
	// in it is not zero: it is unknown.
	Counted []State
	// Ends are the counted jobs that ended since the time asked, one each
	// (no order), as EndedSince counts them.
	Ends []End
	// OldestDue is when the counted job that has waited longest to start
	// became due (Unix ms; 0: none waits): an Enqueued job since its last
	// change, a Scheduled one since its RunAt, once that has passed.
	OldestDue int64
}

// End is a job that ended, read from what the byState index projects
// (never the args nor the whole error): what the dashboard's charts draw.
type End struct {
	Kind      string
	State     State // Succeeded, Failed or Expired
	Cancelled bool  // a Failed job an operator withdrew before it started
	At        int64 // its end (the record's last change), Unix ms
	// Began is when its last run began, Unix ms: an ended job's RunAt
	// (Finish.Began). 0 when no run's start is kept: a job that never
	// ran, one ended by no run of its own (dead-lettered, an orphan out
	// of attempts). A cancelled job (Cancelled) keeps its last due time
	// there, which Cancel removes its far schedule by; so does a job that
	// ended before this version kept the start, until its retention ends.
	Began int64
	Runs  int // the attempts it spent: 0 never started
	// Continues: a continuation of one parent (ParentID).
	Continues bool
}

// add counts r (a job record, in state r.State) into c.
func (c *JobCounts) add(r Record, since time.Time, now int64) {
	if c.ByState[r.State] == nil {
		c.ByState[r.State] = map[string]int{}
	}
	c.ByState[r.State][r.Kind]++
	var due int64
	switch {
	case r.State == Enqueued:
		due = r.UpdatedAt
	case r.State == Scheduled && r.RunAt <= now:
		due = r.RunAt
	}
	if due > 0 && (c.OldestDue == 0 || due < c.OldestDue) {
		c.OldestDue = due
	}
	if r.State.Terminal() && !since.IsZero() && r.UpdatedAt >= since.UnixMilli() {
		c.EndedSince[r.State]++
		c.Ends = append(c.Ends, End{Kind: r.Kind, State: r.State, Cancelled: r.Cancelled, At: r.UpdatedAt,
			Began: r.RunAt, Runs: r.Attempt, Continues: r.ParentID != ""})
	}
}

// countedAttrs are what CountJobs and CountIndexed read of each item:
// all of them projected by the byState index.
var countedAttrs = []string{AttrPK, AttrState, AttrKind, AttrExpiresAt, AttrUpdatedAt, AttrCreatedAt, AttrRunAt, AttrAttempt, AttrCancelled, AttrParentID}

// countedProjection is countedAttrs as a projection.
func countedProjection() (expression.Expression, error) {
	proj := expression.NamesList(expression.Name(countedAttrs[0]))
	for _, a := range countedAttrs[1:] {
		proj = proj.AddNames(expression.Name(a))
	}
	return expression.NewBuilder().WithProjection(proj).Build()
}

// CountJobs counts the jobs by state and kind, and those that ended since
// since (JobCounts.Ends lists them), in one Scan projecting ten
// attributes (billed for every record whole, whatever it projects). Items that are not jobs
// (flow control's, the index's) and records past their retention are
// not counted.
func (s *Store) CountJobs(ctx context.Context, since time.Time) (JobCounts, error) {
	nowMs := s.now().UnixMilli()
	now := nowMs / 1000
	expr, err := countedProjection()
	if err != nil {
		return JobCounts{}, fmt.Errorf("nexjob: build scan: %w", err)
	}
	c := JobCounts{ByState: map[State]map[string]int{}, EndedSince: map[State]int{}, Counted: append(slices.Clone(ActiveStates), TerminalStates...)}
	p := dynamodb.NewScanPaginator(s.db, &dynamodb.ScanInput{
		TableName:                aws.String(s.table),
		ProjectionExpression:     expr.Projection(),
		ExpressionAttributeNames: expr.Names(),
	})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return JobCounts{}, fmt.Errorf("nexjob: scan %s: %w", s.table, err)
		}
		page, err := decodeRecords(out.Items)
		if err != nil {
			return JobCounts{}, fmt.Errorf("nexjob: decode job records: %w", err)
		}
		for _, r := range page {
			if r.ExpiredAt(time.Unix(now, 0)) || !isJobPK(r.PK) || r.Kind == "" {
				continue // flow control's items, the index item: not jobs
			}
			c.add(r, since, nowMs)
		}
	}
	return c, nil
}

// OpenStates are the states of a job that has not ended (OpenJobs).
var OpenStates = []State{Enqueued, Scheduled, Processing, AwaitingContinuation}

// OpenJobs calls fn with each open job of kind (OpenStates), its record
// read whole (strongly consistent), its args (ArgsOf; argsErr when they
// cannot be read), with its steps (Record.Steps whole, as
// WithSteps reads them, and as StepItems lists them in the order they
// were written, each value read),
// until fn returns an error, which it returns; each job once. It writes
// nothing. One
// Query of the byState index per page of each state (a Scan of the table
// for a state the index does not hold: Enqueued and Processing unless
// IndexAllStates), then a GetItem and a Query of its steps per job.
func (s *Store) OpenJobs(ctx context.Context, kind string, fn func(rec Record, steps []StepItem, argsErr error) error) error {
	seen := map[string]bool{} // a job that moved from one state to another as they were listed comes once
	for _, st := range OpenStates {
		f := Filter{State: st, Kind: kind}
		for {
			recs, next, err := s.Find(ctx, f)
			if err != nil {
				return err
			}
			for _, r := range recs {
				full, err := s.Get(ctx, r.ID)
				if err != nil {
					continue // gone meanwhile
				}
				if full.Kind != kind || full.State.Terminal() || seen[full.ID] {
					continue // ended, or listed already, since the index was read
				}
				seen[full.ID] = true
				items, err := s.stepItems(ctx, full, true)
				if err != nil {
					return err
				}
				// Args in the blob bucket: read, not renewed. One that cannot be
				// read (gone, or replaced: anyone who may enqueue may write
				// args/) is fn's argsErr, Args empty: one job's object does not
				// hide the others.
				args, argsErr := s.ArgsOf(ctx, full, false)
				full.Args = args
				full.Steps = make(StepMap, len(items))
				for _, it := range items {
					full.Steps[it.Name] = it.Value
				}
				if err := fn(full, items, argsErr); err != nil {
					return err
				}
			}
			if next == "" {
				break
			}
			f.Cursor = next
		}
	}
	return nil
}
