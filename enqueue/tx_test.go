package enqueue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// ordersTable is the caller's own table, beside the ledger.
func ordersTable(t *testing.T, e *awstest.Env) string {
	t.Helper()
	name := e.Table + "-orders"
	_, err := e.DB.CreateTable(context.Background(), &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.DB.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	return name
}

// orderPut is the caller's own write: an order that must not exist yet.
func orderPut(table, id string) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{
		TableName:           aws.String(table),
		Item:                map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id}},
		ConditionExpression: aws.String("attribute_not_exists(id)"),
	}}
}

// commit runs the caller's transaction: its order and the job's items.
func commit(ctx context.Context, db enqueueTxDB, table, order string, tx *enqueue.TxJob) error {
	items := append([]types.TransactWriteItem{orderPut(table, order)}, tx.Items...)
	_, err := db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	return err
}

type enqueueTxDB interface {
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// TestEnqueueTx (issue 12, item 3): the job commits with the caller's own
// write or not at all; the policy matrix decides as for Enqueue.
func TestEnqueueTx(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	orders := ordersTable(t, e)
	ctx := context.Background()

	// Committed: the order and the job, then one message.
	tx, err := c.EnqueueTx(ctx, payment{OrderID: "1"}, &enqueue.Opts{IdempotencyKey: "receipt-1"})
	if err != nil || len(tx.Items) != 1 || tx.Result.Duplicate {
		t.Fatalf("prepare: %+v %v", tx, err)
	}
	res, err := c.Settle(ctx, tx, commit(ctx, e.DB, orders, "1", tx))
	if err != nil || res.ID != tx.Result.ID {
		t.Fatalf("settle: %+v %v", res, err)
	}
	e.RequireState(t, res.ID, ledger.Enqueued)
	checkMessages(t, e, 1)

	// The caller's own condition fails: no job, no message.
	tx, err = c.EnqueueTx(ctx, payment{OrderID: "1"}, &enqueue.Opts{IdempotencyKey: "receipt-1-again"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, tx, commit(ctx, e.DB, orders, "1", tx)); !errors.Is(err, enqueue.ErrTxNotCommitted) {
		t.Fatalf("order existed: %v", err)
	}
	if _, err := c.Store().Get(ctx, tx.Result.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("a job exists without its order: %v", err)
	}
	checkMessages(t, e, 1)

	// An active holder: a duplicate, nothing to write.
	tx, err = c.EnqueueTx(ctx, payment{OrderID: "1"}, &enqueue.Opts{IdempotencyKey: "receipt-1"})
	if err != nil || !tx.Result.Duplicate || len(tx.Items) != 0 || tx.Result.ID != res.ID {
		t.Fatalf("duplicate: %+v %v", tx, err)
	}

	// A protected terminal holder: rejected before any write.
	failed := stage(t, c, "receipt-2", ledger.Failed, time.Time{})
	var dup *enqueue.DuplicateJobError
	if _, err := c.EnqueueTx(ctx, payment{OrderID: "2"}, &enqueue.Opts{IdempotencyKey: "receipt-2", DuplicatePolicy: enqueue.RejectIfFailed}); !errors.As(err, &dup) || dup.ExistingJobID != failed.ID {
		t.Fatalf("RejectIfFailed over a Failed holder: %v", err)
	}
	// An allowed one: archived and replaced in the caller's transaction.
	tx, err = c.EnqueueTx(ctx, payment{OrderID: "2"}, &enqueue.Opts{IdempotencyKey: "receipt-2"})
	if err != nil || len(tx.Items) != 2 {
		t.Fatalf("AllowAfterFailed over a Failed holder: %+v %v", tx, err)
	}
	if res, err = c.Settle(ctx, tx, commit(ctx, e.DB, orders, "2", tx)); err != nil {
		t.Fatal(err)
	}
	e.RequireState(t, res.ID, ledger.Enqueued)
	e.RequireState(t, failed.ID, ledger.Failed) // kept under its own id

	// The key changes hands between prepare and commit: the commit fails
	// as a whole; prepared again, it is a duplicate of the winner.
	tx, err = c.EnqueueTx(ctx, payment{OrderID: "3"}, &enqueue.Opts{IdempotencyKey: "receipt-3"})
	if err != nil {
		t.Fatal(err)
	}
	winner, err := c.Enqueue(ctx, payment{OrderID: "3"}, &enqueue.Opts{IdempotencyKey: "receipt-3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, tx, commit(ctx, e.DB, orders, "3", tx)); !errors.Is(err, enqueue.ErrTxNotCommitted) {
		t.Fatalf("commit after the key changed hands: %v", err)
	}
	if out, err := e.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(orders), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "3"}}}); err != nil || len(out.Item) != 0 {
		t.Fatalf("the order was written without its job: %v %v", out, err)
	}
	tx, err = c.EnqueueTx(ctx, payment{OrderID: "3"}, &enqueue.Opts{IdempotencyKey: "receipt-3"})
	if err != nil || !tx.Result.Duplicate || tx.Result.ID != winner.ID {
		t.Fatalf("prepared again: %+v %v", tx, err)
	}
}

// TestEnqueueTxCommitReplyLost: the caller's commit is applied and its
// reply lost (500, then the SDK's resend); Settle reads the job, finds it
// committed and sends it.
func TestEnqueueTxCommitReplyLost(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Timeout} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
			orders := ordersTable(t, e)
			ft, cfg := e.Faulty()
			db := dynamodb.NewFromConfig(cfg)
			ctx := context.Background()
			tx, err := c.EnqueueTx(ctx, payment{OrderID: "9"}, &enqueue.Opts{IdempotencyKey: "receipt-9"})
			if err != nil {
				t.Fatal(err)
			}
			h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: f})
			cerr := commit(ctx, db, orders, "9", tx)
			if h.Fired() != 1 {
				t.Fatalf("fault fired %d times", h.Fired())
			}
			res, err := c.Settle(ctx, tx, cerr)
			if err != nil || res.ID != tx.Result.ID {
				t.Fatalf("settle after %v: %+v %v", fmt.Sprint(cerr), res, err)
			}
			e.RequireState(t, res.ID, ledger.Enqueued)
			checkMessages(t, e, 1)
		})
	}
}

// TestEnqueueTxCommitThrottled: the caller's commit is throttled through
// the SDK's retries (never applied). Settle finds no job and says the
// transaction did not commit; nothing is sent, and preparing again
// commits.
func TestEnqueueTxCommitThrottled(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	orders := ordersTable(t, e)
	ft, cfg := e.Faulty()
	db := dynamodb.NewFromConfig(cfg)
	ctx := context.Background()
	tx, err := c.EnqueueTx(ctx, payment{OrderID: "8"}, &enqueue.Opts{IdempotencyKey: "receipt-8"})
	if err != nil {
		t.Fatal(err)
	}
	h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: faults.Attempts})
	cerr := commit(ctx, db, orders, "8", tx)
	if cerr == nil || h.Fired() != faults.Attempts {
		t.Fatalf("commit: %v, fault fired %d times", cerr, h.Fired())
	}
	if _, err := c.Settle(ctx, tx, cerr); !errors.Is(err, enqueue.ErrTxNotCommitted) {
		t.Fatalf("settle after a throttled commit: %v", err)
	}
	checkMessages(t, e, 0)
	tx, err = c.EnqueueTx(ctx, payment{OrderID: "8"}, &enqueue.Opts{IdempotencyKey: "receipt-8"})
	if err != nil || tx.Result.Duplicate {
		t.Fatalf("prepared again: %+v %v", tx, err)
	}
	if err := commit(ctx, db, orders, "8", tx); err != nil {
		t.Fatal(err)
	}
	res, err := c.Settle(ctx, tx, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.RequireState(t, res.ID, ledger.Enqueued)
	checkMessages(t, e, 1)
}
