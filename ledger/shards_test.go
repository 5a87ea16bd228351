package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// failedJobs makes n Failed jobs, one a second of the store's clock apart,
// each with args of argsLen bytes, and returns their ids newest first.
func failedJobs(t *testing.T, s *ledger.Store, now *atomic.Int64, n, argsLen int) []string {
	t.Helper()
	ctx := context.Background()
	args := `{"blob":"` + strings.Repeat("x", argsLen) + `"}`
	var ids []string
	for range n {
		rec, _, err := s.Insert(ctx, ledger.Record{Kind: "k", Args: args, State: ledger.Enqueued, MaxAttempts: 1}, "", ledger.AllowAfterFailed, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rec, err = s.Claim(ctx, rec.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: strings.Repeat("e", 3000)}); err != nil {
			t.Fatal(err)
		}
		now.Add(int64(time.Second))
		ids = append([]string{rec.ID}, ids...)
	}
	return ids
}

// TestListingAcrossShards: a state's entries spread over the shards'
// partition key values; Find merges them newest first, and its cursor
// pages through every one exactly once, with entries an older version
// wrote under the unsharded key among them.
func TestListingAcrossShards(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var now atomic.Int64
	now.Store(time.Unix(2_000_000_000, 0).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s, err := ledger.New(e.DB, e.Table, &ledger.Options{Now: clock, IndexShards: 4})
	if err != nil {
		t.Fatal(err)
	}
	ids := failedJobs(t, s, &now, 23, 10)
	// Two entries as a version before sharding wrote them: the bare state.
	ctx := context.Background()
	for _, id := range []string{ids[3], ids[17]} {
		if _, err := e.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(e.Table), Key: map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: "j#" + id}},
			UpdateExpression:          aws.String("SET listState = :s"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: "Failed"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	shards := map[string]bool{}
	for _, r := range e.Records(t) {
		shards[r.ListState] = true
	}
	if len(shards) < 3 {
		t.Fatalf("23 jobs on %d index keys %v: not spread", len(shards), shards)
	}
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, next, err := s.Find(ctx, ledger.Filter{State: ledger.Failed, Limit: 5, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 5 || pages > 10 {
			t.Fatalf("page %d: %d records", pages, len(page))
		}
		for _, r := range page {
			got = append(got, r.ID)
			if len(r.LastError) > ledger.MaxListError+len("…") || r.Args != "" {
				t.Fatalf("a listed record carries %d bytes of error, %d of args: the index projects only what a listing shows", len(r.LastError), len(r.Args))
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("paged listing, newest first:\n got %v\nwant %v", got, ids)
	}
}

// TestIndexEntryIsOneWriteUnit: a Failed job with 20 KB of args and a
// 3,000-byte error is a 24 KB item (24 write units a write), but its
// byState index entry holds only what a listing shows: under 1 KB, one
// write unit per index write (it was the whole item with ALL).
func TestIndexEntryIsOneWriteUnit(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	s, err := ledger.New(e.DB, e.Table, &ledger.Options{Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	id := failedJobs(t, s, &now, 1, 20*1024)[0]
	full := e.Records(t)[0]
	out, err := e.DB.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(e.Table), IndexName: aws.String(ledger.IndexByState)})
	if err != nil || len(out.Items) != 1 {
		t.Fatalf("index scan: %v, %d entries", err, len(out.Items))
	}
	entry := out.Items[0]
	if got := entry[ledger.AttrID].(*types.AttributeValueMemberS).Value; got != id {
		t.Fatalf("index entry of %s, want %s", got, id)
	}
	size := awstest.ItemSize(entry)
	units := (size + 1023) / 1024
	t.Logf("job item: %d bytes of args; index entry: %d bytes, %d write unit(s)", len(full.Args), size, units)
	if units != 1 {
		t.Fatalf("an index write of a job with 20 KB args is %d write units (%d bytes): %v", units, size, keys(entry))
	}
}

func keys(m map[string]types.AttributeValue) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// listAll pages through state st's listing and returns the ids.
func listAll(t *testing.T, s *ledger.Store, st ledger.State) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for cursor, first := "", true; first || cursor != ""; first = false {
		page, next, err := s.List(context.Background(), st, 7, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			if got[r.ID] {
				t.Fatalf("%s listed twice", r.ID)
			}
			got[r.ID] = true
		}
		cursor = next
	}
	return got
}

// Issue 27 item 25: a deployment that lowers its shard count still lists
// the Failed jobs an earlier one wrote on the shards it dropped: 8 → 2
// (below the default: a listing reads at least DefaultIndexShards) and
// 40 → 2 (above it: the earlier count was recorded in the table's index
// item, which a listing reads). A cursor made before the count changed is
// refused (ErrBadCursor), never a page that lists entries twice.
func TestLoweredShardsHideNothing(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var now atomic.Int64
	now.Store(time.Unix(2_000_000_000, 0).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	store := func(shards int) *ledger.Store {
		s, err := ledger.New(e.DB, e.Table, &ledger.Options{Now: clock, IndexShards: shards})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	eight, forty, two := store(8), store(40), store(2)
	want := failedJobs(t, eight, &now, 12, 10)
	if got := listAll(t, two, ledger.Failed); len(got) != len(want) {
		t.Fatalf("after 8 → 2 shards: %d of %d Failed jobs listed", len(got), len(want))
	}
	_, cursor, err := two.List(context.Background(), ledger.Failed, 3, "")
	if err != nil || cursor == "" {
		t.Fatalf("first page: %q %v", cursor, err)
	}
	if err := forty.RecordIndexShards(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := forty.RecordIndexShards(context.Background()); err != nil { // again: no error
		t.Fatal(err)
	}
	want = append(want, failedJobs(t, forty, &now, 30, 10)...)
	if got := listAll(t, two, ledger.Failed); len(got) != len(want) {
		t.Fatalf("after 40 → 2 shards: %d of %d Failed jobs listed", len(got), len(want))
	}
	if _, _, err := two.List(context.Background(), ledger.Failed, 3, cursor); !errors.Is(err, ledger.ErrBadCursor) {
		t.Fatalf("a cursor made before the count was raised: %v, want ErrBadCursor", err)
	}
	if _, _, err := two.Reserve(context.Background(), "tenant", "tag", ledger.Rate{Limit: 1, Period: time.Second}, true); err != nil { // a flow-control item
		t.Fatal(err)
	}
	if n, err := two.Counts(context.Background()); err != nil || len(n[ledger.State("")]) != 0 || n[ledger.Failed]["k"] != len(want) {
		t.Fatalf("counts %v %v: want %d Failed of kind k and nothing else", n, err, len(want))
	}
}
