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

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
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

// stage creates a job holding key in state st through the real APIs:
// Enqueue (Enqueued, Scheduled with a delay), ContinueWith
// (AwaitingContinuation), and the ledger's own Claim and Finish, the
// transitions the worker makes (Processing, Succeeded, Failed, Expired).
// expiresAt, when set, is the terminal record's TTL.
func stage(t *testing.T, c *enqueue.Client, key string, st ledger.State, expiresAt time.Time) enqueue.Result {
	t.Helper()
	ctx := context.Background()
	opts := &enqueue.Opts{IdempotencyKey: key}
	var res enqueue.Result
	var err error
	switch st {
	case ledger.Scheduled:
		opts.Delay = time.Hour
		res, err = c.Enqueue(ctx, payment{OrderID: key}, opts)
	case ledger.AwaitingContinuation:
		var parent enqueue.Result
		if parent, err = c.Enqueue(ctx, payment{OrderID: key + "-parent"}, nil); err == nil {
			res, err = c.ContinueWith(ctx, parent.ID, payment{OrderID: key}, opts)
		}
	default:
		res, err = c.Enqueue(ctx, payment{OrderID: key}, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st == res.State {
		return res
	}
	rec, err := c.Store().Claim(ctx, res.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if st != ledger.Processing {
		if rec, err = c.Store().Finish(ctx, rec, ledger.Finish{State: st, LastError: "staged", ExpiresAt: expiresAt}); err != nil {
			t.Fatal(err)
		}
	}
	if rec.State != st {
		t.Fatalf("staged %s, got %s", st, rec.State)
	}
	res.State = rec.State
	return res
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
					exp := time.Now().Add(time.Hour)
					if sit.past {
						exp = time.Now().Add(-time.Second)
					}
					first = stage(t, c, key, sit.state, exp)
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
	e.WantDepth(t, e.QueueURL, want, "the job queue")
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
	first := stage(t, c, "payment-1", ledger.Succeeded, time.Now().Add(time.Hour))
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

// TestDeleteFreesKey: deleting a job frees its key, even under RejectAlways.
func TestDeleteFreesKey(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, nil)
	ctx := context.Background()
	first := stage(t, c, "legal-7", ledger.Failed, time.Time{})
	opts := &enqueue.Opts{IdempotencyKey: "legal-7", DuplicatePolicy: enqueue.RejectAlways}
	if _, err := c.Enqueue(ctx, payment{OrderID: "7"}, opts); err == nil {
		t.Fatal("RejectAlways accepted a Failed job's key")
	}
	if err := c.Delete(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Store().Get(ctx, first.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("deleted job still readable: %v", err)
	}
	res, err := c.Enqueue(ctx, payment{OrderID: "7"}, opts)
	if err != nil || res.Duplicate || res.ID == first.ID {
		t.Fatalf("after delete: %+v %v", res, err)
	}
	if err := c.Delete(ctx, "aaaaaaaaaaaaaaaaaaaaaaaaaa"); err != nil {
		t.Fatalf("deleting a job that does not exist: %v", err)
	}
}
