package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// rig is one test's table, a Store on it whose requests are counted and
// go through a fault transport, and what the Store logged and counted.
type rig struct {
	e       *nexjobtest.Env
	ft      *faults.Transport
	counter *awstest.Counter
	logs    *awstest.Buffer
	emf     *awstest.Buffer
	s       *idempotency.Store
}

func newRig(t *testing.T, o *idempotency.Options) *rig {
	t.Helper()
	r := &rig{e: nexjobtest.New(t, nil), ft: faults.New(nil), logs: &awstest.Buffer{}, emf: &awstest.Buffer{}}
	r.s = r.store(t, o)
	return r
}

// store makes another Store on the rig's table (another process).
func (r *rig) store(t *testing.T, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	cfg := r.e.Cfg
	if r.counter == nil {
		r.counter = awstest.Count(&cfg)
	} else {
		r.counter.On(&cfg) // every Store of the rig counts in one list
	}
	cfg = faults.Config(cfg, r.ft)
	opts.Ledger.Now = r.e.Now
	opts.Logger = slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.Metrics = metrics.New(&metrics.Options{Out: r.emf})
	if opts.Function == "" {
		opts.Function = "charge"
	}
	s, err := idempotency.New(cfg, r.e.Table, &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type receipt struct {
	ChargeID string
	Amount   int
}

// charger is a function under test: it counts its runs.
type charger struct {
	runs atomic.Int32
	err  error
}

func (c *charger) charge(amount int) func(context.Context) (receipt, error) {
	return func(context.Context) (receipt, error) {
		n := c.runs.Add(1)
		if c.err != nil {
			return receipt{}, c.err
		}
		return receipt{ChargeID: fmt.Sprintf("ch_%d", n), Amount: amount}, nil
	}
}

func ops(c *awstest.Counter) string { return strings.Join(c.Calls(), " ") }

// The first call runs and records; a repeat returns the recorded result,
// Replayed, without running. Requests pinned: PutItem and UpdateItem for
// the first call, one PutItem for a repeat (its failed condition returns
// the record); each item is one write unit.
func TestFirstCallThenRepeat(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var c charger
	ctx := context.Background()
	first, err := idempotency.Do(ctx, r.s, "order-1", c.charge(100), nil)
	if err != nil || first.Replayed || first.Value != (receipt{"ch_1", 100}) {
		t.Fatalf("first call: %+v %v", first, err)
	}
	if got := ops(r.counter); got != "DynamoDB.PutItem DynamoDB.UpdateItem" {
		t.Errorf("first call's requests: %s, want PutItem UpdateItem", got)
	}
	r.counter.Reset()
	again, err := idempotency.Do(ctx, r.s, "order-1", c.charge(100), nil)
	if err != nil || !again.Replayed || again.Value != first.Value || c.runs.Load() != 1 {
		t.Fatalf("repeat: %+v %v, %d runs; want the first result replayed, 1 run", again, err, c.runs.Load())
	}
	if got := ops(r.counter); got != "DynamoDB.PutItem" {
		t.Errorf("repeat's requests: %s, want PutItem", got)
	}
	if first.KeyHash != r.s.KeyHash("order-1") || again.KeyHash != first.KeyHash {
		t.Errorf("key hashes %q %q", first.KeyHash, again.KeyHash)
	}
	item := r.item(t, first.KeyHash)
	if n := awstest.ItemSize(item); n > 1024 {
		t.Errorf("the recorded call is %d bytes: over one write unit", n)
	}
	if strings.Contains(fmt.Sprint(item), "order-1") {
		t.Errorf("the raw key is stored: %v", item)
	}
}

// item reads a call's record as stored (nil when there is none).
func (r *rig) item(t *testing.T, keyHash string) map[string]types.AttributeValue {
	t.Helper()
	out, err := r.e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(r.e.Table), Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "i#" + keyHash}}, ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// units is the write units DynamoDB bills for an item of n bytes.
func units(n int) int { return (n + 1023) / 1024 }

// TestCallCosts pins each path's requests and the write units of its
// items (awstest.ItemSize, DynamoDB's rule): a first call is the hold's
// PutItem and the result's UpdateItem; a repeat one failed PutItem billed
// at the record's size; a cached repeat nothing; an error released
// PutItem, DeleteItem; a new call taking an outcome its policy lets go
// two PutItems and the UpdateItem.
func TestCallCosts(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		result      string
		first, full int // the hold's units, the recorded item's
	}{
		{"small", "ok", 1, 1},
		{"2.5 KB", strings.Repeat("r", 2500), 1, 3},
	} {
		hold := 0
		key := "cost-" + tc.name
		res := func(context.Context) (string, error) {
			hold = awstest.ItemSize(r.item(t, r.s.KeyHash(key))) // the hold, as written
			return tc.result, nil
		}
		r.counter.Reset()
		first, err := idempotency.Do(ctx, r.s, key, res, &idempotency.CallOptions{Payload: "p"})
		if err != nil {
			t.Fatal(err)
		}
		if got := ops(r.counter); got != "DynamoDB.PutItem DynamoDB.UpdateItem" {
			t.Errorf("%s first call: %s", tc.name, got)
		}
		if u := units(hold); hold == 0 || u != tc.first {
			t.Errorf("%s: the hold is %d bytes, %d units; want %d", tc.name, hold, u, tc.first)
		}
		full := awstest.ItemSize(r.item(t, first.KeyHash))
		if u := units(full); u != tc.full {
			t.Errorf("%s: the recorded call is %d bytes, %d units; want %d", tc.name, full, u, tc.full)
		}
		r.counter.Reset()
		if again, err := idempotency.Do(ctx, r.s, "cost-"+tc.name, res, &idempotency.CallOptions{Payload: "p"}); err != nil || !again.Replayed {
			t.Fatalf("%s repeat: %+v %v", tc.name, again, err)
		}
		if got := ops(r.counter); got != "DynamoDB.PutItem" {
			t.Errorf("%s repeat: %s, want one PutItem (%d units: the record's size)", tc.name, got, tc.full)
		}
	}
	cached := r.store(t, &idempotency.Options{CacheSize: 1})
	if _, err := idempotency.Do(ctx, cached, "cost-cached", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
		t.Fatal(err)
	}
	r.counter.Reset()
	if res, err := idempotency.Do(ctx, cached, "cost-cached", func(context.Context) (int, error) { return 2, nil }, nil); err != nil || !res.Replayed || res.Value != 1 {
		t.Fatalf("cached repeat: %+v %v", res, err)
	}
	if got := ops(r.counter); got != "" {
		t.Errorf("a cached repeat: %s, want no request", got)
	}
	r.counter.Reset()
	if _, err := idempotency.Do(ctx, r.s, "cost-error", func(context.Context) (int, error) { return 0, errors.New("no") }, nil); err == nil {
		t.Fatal("want the error")
	}
	if got := ops(r.counter); got != "DynamoDB.PutItem DynamoDB.DeleteItem" {
		t.Errorf("an error released: %s", got)
	}
	allow := ledger.AllowAfterFailed
	reuse := r.store(t, &idempotency.Options{Policy: &allow, Function: "reuse"})
	if _, err := idempotency.Do(ctx, reuse, "cost-reuse", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
		t.Fatal(err)
	}
	r.counter.Reset()
	if res, err := idempotency.Do(ctx, reuse, "cost-reuse", func(context.Context) (int, error) { return 2, nil }, nil); err != nil || res.Replayed || res.Value != 2 {
		t.Fatalf("a new call after a success under AllowAfterFailed: %+v %v", res, err)
	}
	if got := ops(r.counter); got != "DynamoDB.PutItem DynamoDB.PutItem DynamoDB.UpdateItem" {
		t.Errorf("a new call replacing a recorded outcome: %s", got)
	}
}
