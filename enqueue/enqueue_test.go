package enqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

type payment struct {
	OrderID string `json:"orderId"`
	Cents   int    `json:"cents"`
}

func (payment) Kind() string { return "payment" }

func newClient(t *testing.T, e *awstest.Env, opts *enqueue.ClientOptions) *enqueue.Client {
	t.Helper()
	c, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// setState moves a job's record to a state the producer cannot reach by
// itself (the worker's transitions), as a fixture written to the real table.
func setState(t *testing.T, e *awstest.Env, c *enqueue.Client, id string, st ledger.State, expiresAt int64) {
	t.Helper()
	rec, err := c.Store().Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	rec.State, rec.ExpiresAt = st, expiresAt
	rec.UpdatedAt++
	item, err := attributevalue.MarshalMap(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(e.Table), Item: item}); err != nil {
		t.Fatal(err)
	}
}

type outcome int

const (
	existing outcome = iota // the existing id, Duplicate
	created                 // a new job
	rejected                // *DuplicateJobError
)

// The existing job's situation, as MISSION.md's matrix lists them.
var situations = []struct {
	name  string
	state ledger.State // "" = no record
	past  bool         // record past its TTL
}{
	{"Enqueued", ledger.Enqueued, false},
	{"Scheduled", ledger.Scheduled, false},
	{"Processing", ledger.Processing, false},
	{"AwaitingContinuation", ledger.AwaitingContinuation, false},
	{"Succeeded", ledger.Succeeded, false},
	{"Failed", ledger.Failed, false},
	{"Expired", ledger.Expired, false},
	{"NoRecord", "", false},
	{"PastTTL", ledger.Failed, true},
}

// want[policy][situation], straight from MISSION.md.
var want = map[ledger.DuplicatePolicy][]outcome{
	enqueue.AllowAfterFailed: {existing, existing, existing, existing, created, created, created, created, created},
	enqueue.RejectIfFailed:   {existing, existing, existing, existing, created, rejected, created, created, created},
	enqueue.RejectAlways:     {existing, existing, existing, existing, rejected, rejected, rejected, created, created},
}

func TestPolicyMatrix(t *testing.T) {
	t.Parallel()
	for _, policy := range []ledger.DuplicatePolicy{enqueue.AllowAfterFailed, enqueue.RejectIfFailed, enqueue.RejectAlways} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c := newClient(t, e, nil)
			ctx := context.Background()
			for i, sit := range situations {
				key := "payment-" + sit.name
				var first enqueue.Result
				if sit.state != "" {
					opts := &enqueue.Opts{IdempotencyKey: key}
					if sit.state == ledger.Scheduled {
						opts.Delay = time.Hour
					}
					var err error
					if first, err = c.Enqueue(ctx, payment{OrderID: sit.name}, opts); err != nil {
						t.Fatal(err)
					}
					if sit.state != first.State {
						var exp int64
						if sit.past {
							exp = time.Now().Add(-time.Second).Unix()
						} else if sit.state.Terminal() {
							exp = time.Now().Add(time.Hour).Unix()
						}
						setState(t, e, c, first.ID, sit.state, exp)
					}
				}
				got, err := c.Enqueue(ctx, payment{OrderID: sit.name}, &enqueue.Opts{IdempotencyKey: key, DuplicatePolicy: policy})
				checkOutcome(t, sit.name, want[policy][i], first, got, err, policy, sit.state, key)
				checkRecords(t, e, c.Store().HashKey(key), sit.name, want[policy][i], sit.state, sit.past, first, got)
			}
			checkMessages(t, e, len(situations)-1+countCreated(want[policy]))
		})
	}
}

func checkOutcome(t *testing.T, name string, w outcome, first, got enqueue.Result, err error, policy ledger.DuplicatePolicy, st ledger.State, key string) {
	t.Helper()
	switch w {
	case existing:
		if err != nil || !got.Duplicate || got.ID != first.ID || got.State != st {
			t.Errorf("%s: want existing id %s as duplicate in %s, got %+v, %v", name, first.ID, st, got, err)
		}
	case created:
		if err != nil || got.Duplicate || got.ID == "" || got.ID == first.ID || got.State != ledger.Enqueued {
			t.Errorf("%s: want a new Enqueued job, got %+v, %v (first %s)", name, got, err, first.ID)
		}
	case rejected:
		var dup *enqueue.DuplicateJobError
		if !errors.As(err, &dup) {
			t.Fatalf("%s: want *DuplicateJobError, got %+v, %v", name, got, err)
		}
		if dup.ExistingJobID != first.ID || dup.Policy != policy || dup.ExistingState != st || dup.Key != key {
			t.Errorf("%s: error fields %+v, want id %s policy %s state %s", name, dup, first.ID, policy, st)
		}
	}
}

// checkRecords asserts what the table holds for the key afterwards.
func checkRecords(t *testing.T, e *awstest.Env, hash, name string, w outcome, st ledger.State, past bool, first, got enqueue.Result) {
	t.Helper()
	byID := map[string]ledger.Record{}
	for _, r := range e.Records(t) {
		if r.KeyHash == hash {
			byID[r.ID] = r
		}
	}
	wantIDs := map[string]ledger.State{}
	switch {
	case st == "":
		wantIDs[got.ID] = ledger.Enqueued
	case w == created && past: // the expired holder is simply overwritten
		wantIDs[got.ID] = ledger.Enqueued
	case w == created: // the old job stays readable, archived
		wantIDs[first.ID], wantIDs[got.ID] = st, ledger.Enqueued
	default:
		wantIDs[first.ID] = st
	}
	if len(byID) != len(wantIDs) {
		t.Errorf("%s: %d records for the key, want %d: %+v", name, len(byID), len(wantIDs), byID)
	}
	for id, s := range wantIDs {
		if r, ok := byID[id]; !ok || r.State != s {
			t.Errorf("%s: record %s is %+v, want state %s", name, id, r, s)
		}
	}
}

func checkMessages(t *testing.T, e *awstest.Env, want int) {
	t.Helper()
	if n := e.QueueDepth(t, e.QueueURL); n != want {
		t.Errorf("queue holds %d messages, want %d", n, want)
	}
}

func countCreated(o []outcome) int {
	n := 0
	for _, x := range o {
		if x == created {
			n++
		}
	}
	return n
}

// TestReuseKeepsOldRecordReadable: after re-use the old job is still found
// by its id, and the key now leads to the new one.
func TestReuseKeepsOldRecordReadable(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, nil)
	ctx := context.Background()
	first, err := c.Enqueue(ctx, payment{OrderID: "1"}, &enqueue.Opts{IdempotencyKey: "payment-1"})
	if err != nil {
		t.Fatal(err)
	}
	setState(t, e, c, first.ID, ledger.Succeeded, time.Now().Add(time.Hour).Unix())
	second, err := c.Enqueue(ctx, payment{OrderID: "1"}, &enqueue.Opts{IdempotencyKey: "payment-1"})
	if err != nil || second.Duplicate {
		t.Fatalf("re-use: %+v %v", second, err)
	}
	old, err := c.Store().Get(ctx, first.ID)
	if err != nil || old.State != ledger.Succeeded {
		t.Fatalf("old job after re-use: %+v %v", old, err)
	}
	cur, err := c.Store().Get(ctx, second.ID)
	if err != nil || cur.State != ledger.Enqueued {
		t.Fatalf("new job: %+v %v", cur, err)
	}
	third, err := c.Enqueue(ctx, payment{OrderID: "1"}, &enqueue.Opts{IdempotencyKey: "payment-1"})
	if err != nil || !third.Duplicate || third.ID != second.ID {
		t.Fatalf("key should now lead to the new job: %+v %v", third, err)
	}
}

// TestEnqueueCost counts the AWS requests of one keyed enqueue.
func TestEnqueueCost(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(context.Background(), payment{OrderID: "9"}, &enqueue.Opts{IdempotencyKey: "payment-9"}); err != nil {
		t.Fatal(err)
	}
	got := counter.Calls()
	if len(got) != 2 || got[0] != "DynamoDB.PutItem" || got[1] != "SQS.SendMessage" {
		t.Fatalf("requests = %v, want [DynamoDB.PutItem SQS.SendMessage]", got)
	}
}

// TestArgsRoundTrip: the stored args are the JSON of the args value, and the
// message names the job and its kind.
func TestArgsRoundTrip(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, nil)
	res, err := c.Enqueue(context.Background(), payment{OrderID: "7", Cents: 1250}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.Store().Get(context.Background(), res.ID)
	if err != nil {
		t.Fatal(err)
	}
	var p payment
	if err := json.Unmarshal([]byte(rec.Args), &p); err != nil || p != (payment{"7", 1250}) || rec.Kind != "payment" || rec.MaxAttempts != enqueue.DefaultMaxAttempts {
		t.Fatalf("record %+v (args %+v, %v)", rec, p, err)
	}
	msgs := e.Messages(t, e.QueueURL)
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	m, err := enqueue.DecodeMessage(aws.ToString(msgs[0].Body))
	if err != nil || m.ID != res.ID || m.Kind != "payment" {
		t.Fatalf("message %+v %v", m, err)
	}
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))
