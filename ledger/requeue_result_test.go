package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestRequeueLeavesTheResultUnread: a requeue (an operator's write, which
// may not name the result) leaves the run before's result in the item,
// unread: SucceededResult is "" until the job Succeeds again; the next
// run's end replaces it, or removes it when that run returns none or
// fails, so no reader ever takes a result the current run did not make.
func TestRequeueLeavesTheResultUnread(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	s, err := ledger.New(e.DB, e.Table, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rec, _, err := s.Insert(ctx, ledger.Record{Kind: "quote", Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "", ledger.RejectAlways, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored := func() (string, bool) {
		t.Helper()
		out, err := e.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(e.Table), Key: map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: rec.PK}}, ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := out.Item[ledger.AttrResult].(*types.AttributeValueMemberS)
		if !ok {
			return "", false
		}
		return v.Value, true
	}
	run := func(f ledger.Finish) ledger.Record {
		t.Helper()
		claimed, err := s.Claim(ctx, rec.ID, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		done, err := s.Finish(ctx, claimed, f)
		if err != nil {
			t.Fatal(err)
		}
		return done
	}
	requeue := func() {
		t.Helper()
		got, err := s.Requeue(ctx, rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.SucceededResult() != "" {
			t.Fatalf("a requeued job's result: %q, want none", got.SucceededResult())
		}
	}
	if done := run(ledger.Finish{State: ledger.Succeeded, Result: `{"price":1}`}); done.SucceededResult() != `{"price":1}` {
		t.Fatalf("the first run's result: %q", done.SucceededResult())
	}
	requeue()
	if v, ok := stored(); !ok || v != `{"price":1}` {
		t.Fatalf("the requeue wrote the result: %q %v; want it left as it was", v, ok)
	}
	if got, err := s.Get(ctx, rec.ID); err != nil || got.SucceededResult() != "" {
		t.Fatalf("a requeued job read: %q %v; want no result", got.SucceededResult(), err)
	}
	if done := run(ledger.Finish{State: ledger.Succeeded, Result: `{"price":2}`}); done.SucceededResult() != `{"price":2}` {
		t.Fatalf("the second run's result: %q", done.SucceededResult())
	}
	requeue()
	if done := run(ledger.Finish{State: ledger.Succeeded}); done.SucceededResult() != "" {
		t.Fatalf("a run returning no result after a requeue: %q", done.SucceededResult())
	}
	if v, ok := stored(); ok {
		t.Fatalf("the item keeps the run before's result %q after a run that returned none", v)
	}
	requeue()
	run(ledger.Finish{State: ledger.Succeeded, Result: `{"price":3}`})
	requeue()
	if done := run(ledger.Finish{State: ledger.Failed, LastError: "no quote"}); done.SucceededResult() != "" {
		t.Fatalf("a failed run after a requeue: %q", done.SucceededResult())
	}
	if v, ok := stored(); ok {
		t.Fatalf("the item keeps the run before's result %q after a failed run", v)
	}
}
