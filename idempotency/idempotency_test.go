package idempotency_test

import (
	"context"
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
	counter := awstest.Count(&cfg)
	if r.counter == nil {
		r.counter = counter
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
