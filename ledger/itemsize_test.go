package ledger_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// storedSize is the size DynamoDB bills for the item pk as stored now.
func storedSize(t *testing.T, e *awstest.Env, pk string) int {
	t.Helper()
	out, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(e.Table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: pk}},
	})
	if err != nil || out.Item == nil {
		t.Fatalf("read %s: %v (item %v)", pk, err, out.Item)
	}
	return awstest.ItemSize(out.Item)
}

// units is what a write of an item of n bytes costs: a write unit per
// started KB (a read unit per started 4 KB, consistent).
func units(n int) (write, read int) { return (n + 1023) / 1024, (n + 4095) / 4096 }

// Issue 27 item 9: flow control's items at the largest settings accepted
// cost one write unit (and one read unit) per start, so a key's ceiling
// is ledger.KeyWriteCeiling starts a second whatever its Limit. A rate
// log at MaxRateLimit with its slots spread over two Periods (the most
// it keeps), and a concurrency key at MaxConcurrency held by keyed jobs
// (the longest job ids), are measured as stored; so is a debounce
// pointer. The log was 18,060 bytes at Limit 1000 (18 write units and 5
// read units a start: about 55 starts a second before the partition's
// ceiling) and the concurrency item 8,063 with keyed jobs' ids (8 units
// to take a slot, 8 to free it). (ItemSize counts a number by its digits,
// which is more than DynamoDB's byte per two, and no byte per map member:
// more than DynamoDB counts for these items.)
func TestFlowItemsFitOneWriteUnit(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	s, clock := clockedStore(t, e.DB, e.Table, time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))

	r := ledger.Rate{Limit: ledger.MaxRateLimit, Period: ledger.MaxRatePeriod}
	rateKey := s.HashKey("every start of a busy kind")
	most := 0
	for i := range 2*r.Limit + 40 {
		if _, taken, err := s.Reserve(ctx, rateKey, ledger.RateTag(strconv.Itoa(i)), r, true); err != nil || !taken {
			t.Fatalf("slot %d: taken %v err %v", i, taken, err)
		}
		clock.Add(int64(r.Period) / int64(r.Limit))
		if i%97 == 0 || i >= 2*r.Limit {
			most = max(most, storedSize(t, e, "r#"+rateKey))
		}
	}
	w, rd := units(most)
	t.Logf("rate log at Limit %d, Period %s: %d bytes, %d write unit(s) and %d read unit(s) a start", r.Limit, r.Period, most, w, rd)
	if w != 1 || rd != 1 {
		t.Errorf("rate log at Limit %d: %d bytes, %d write units and %d read units a start; want at most 1024 bytes, 1 of each", r.Limit, most, w, rd)
	}
	// The ceiling: a key's item takes KeyWriteCeiling write units a
	// second, and no accepted Rate asks one key for more starts than that.
	if most := float64(ledger.MaxRateLimit) / ledger.MinRatePeriod.Seconds() * float64(w); most > ledger.KeyWriteCeiling {
		t.Errorf("a Rate of %d per %s asks one key for %.0f write units a second; its ceiling is %d", ledger.MaxRateLimit, ledger.MinRatePeriod, most, ledger.KeyWriteCeiling)
	}
	t.Logf("a key's ceiling: %d starts a second (%d write unit each)", ledger.KeyWriteCeiling/w, w)

	concKey := s.HashKey("one tenant's exports")
	until := s.Now().Add(12 * time.Hour)
	for i := range ledger.MaxConcurrency {
		// A keyed job's id (its own part, the key's hash) and a large token.
		id := strings.Repeat(string(rune('a'+i%26)), 26) + "." + s.HashKey("order-"+strconv.Itoa(i))
		holder := ledger.Holder(ledger.Record{ID: id, Token: 1<<40 + int64(i)})
		if ok, _, err := s.Acquire(ctx, concKey, holder, ledger.MaxConcurrency, until); err != nil || !ok {
			t.Fatalf("holder %d: ok %v err %v", i, ok, err)
		}
	}
	size := storedSize(t, e, "c#"+concKey)
	w, rd = units(size)
	t.Logf("concurrency key at Limit %d: %d bytes, %d write unit(s) to take a slot and %d to free it, %d read unit(s)", ledger.MaxConcurrency, size, w, w, rd)
	if w != 1 || rd != 1 {
		t.Errorf("concurrency key at Limit %d: %d bytes, %d write units to take a slot and %d to free it; want at most 1024 bytes, 1 each", ledger.MaxConcurrency, size, w, w)
	}

	debKey := s.HashKey("debounce: " + strings.Repeat("k", ledger.MaxKeyLen-10))
	job := ledger.Record{Kind: strings.Repeat("k", 64), Args: "{}", State: ledger.Enqueued, MaxAttempts: 25}
	if _, ok, err := s.StartDebounce(ctx, debKey, job, ledger.AllowAfterFailed, s.Now().Add(time.Hour), 0); err != nil || !ok {
		t.Fatalf("debounce: ok %v err %v", ok, err)
	}
	size = storedSize(t, e, "d#"+debKey)
	if w, _ := units(size); w != 1 {
		t.Errorf("debounce pointer: %d bytes, %d write units; want 1", size, w)
	}
	t.Logf("debounce pointer: %d bytes", size)
}
