package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/internal/awstest"
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
