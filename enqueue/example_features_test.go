package enqueue_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/provision"
)

// Batch enqueue: one conditional write per item, messages in batches of
// ten; each item says what happened to it.
func ExampleClient_EnqueueMany() {
	c, _ := exampleSetup("many")
	ctx := context.Background()
	items := []enqueue.Item{
		{Args: seedjobs.WelcomeEmail{UserID: "1", Email: "a@example.com"}, Opts: &enqueue.Opts{IdempotencyKey: "welcome-1"}},
		{Args: seedjobs.WelcomeEmail{UserID: "2", Email: "b@example.com"}, Opts: &enqueue.Opts{IdempotencyKey: "welcome-2"}},
		{Args: seedjobs.WelcomeEmail{UserID: "1", Email: "a@example.com"}, Opts: &enqueue.Opts{IdempotencyKey: "welcome-1"}},
		{Args: seedjobs.WelcomeEmail{UserID: "3"}, Opts: &enqueue.Opts{IdempotencyKey: " "}},
	}
	res, err := c.EnqueueMany(ctx, items)
	var be *enqueue.BatchError
	fmt.Println("failed items:", errors.As(err, &be), be.Failed)
	fmt.Println("item 2 is item 0's job or item 0 is item 2's:", res[0].ID == res[2].ID && res[0].Duplicate != res[2].Duplicate)
	fmt.Println("item 1 recorded and sent:", res[1].Recorded, res[1].Sent)
	// Output:
	// failed items: true [3]
	// item 2 is item 0's job or item 0 is item 2's: true
	// item 1 recorded and sent: true true
}

// Transactional enqueue: the receipt job exists if and only if the order
// does.
func ExampleClient_EnqueueTx() {
	c, _ := exampleSetup("tx")
	ctx := context.Background()
	cfg, _ := config.LoadDefaultConfig(ctx)
	db := dynamodb.NewFromConfig(cfg)
	orders := c.Store().Table() + "-orders"
	_, _ = db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(orders),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	tx, err := c.EnqueueTx(ctx, seedjobs.WelcomeEmail{UserID: "7", Email: "g@example.com"}, &enqueue.Opts{IdempotencyKey: "welcome-7"})
	if err != nil {
		panic(err)
	}
	order := types.TransactWriteItem{Put: &types.Put{TableName: aws.String(orders),
		Item: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "7"}}}}
	_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: append([]types.TransactWriteItem{order}, tx.Items...)})
	res, err := c.Settle(ctx, tx, err)
	fmt.Println("committed and sent:", err == nil && res.ID == tx.Result.ID)
	// Output:
	// committed and sent: true
}

// A key re-used with other args: a duplicate by default, an error when
// the payload policy says so.
func ExamplePayloadMismatchError() {
	c, _ := exampleSetup("payload")
	ctx := context.Background()
	key := &enqueue.Opts{IdempotencyKey: "payment-42", PayloadMismatch: enqueue.RejectPayload}
	_, _ = c.Enqueue(ctx, seedjobs.Payment{OrderID: "42", AmountCents: 1000}, key)
	_, err := c.Enqueue(ctx, seedjobs.Payment{OrderID: "42", AmountCents: 9999}, key)
	var pm *enqueue.PayloadMismatchError
	fmt.Println("other args rejected:", errors.As(err, &pm))
	// Output:
	// other args rejected: true
}

// nightly carries its kind's defaults, like River's InsertOpts.
type nightly struct{}

func (nightly) Kind() string { return "nightly" }
func (nightly) JobDefaults() enqueue.Defaults {
	return enqueue.Defaults{MaxAttempts: 3, DuplicatePolicy: enqueue.RejectAlways}
}

func ExampleKindDefaults() {
	c, _ := exampleSetup("defaults")
	ctx := context.Background()
	res, _ := c.Enqueue(ctx, nightly{}, &enqueue.Opts{IdempotencyKey: "nightly-2026-12-03"})
	rec, _ := c.Store().Get(ctx, res.ID)
	fmt.Println(rec.MaxAttempts, rec.Policy)
	// Output:
	// 3 RejectAlways
}

// Key admin: who holds a key, what an enqueue would do, and freeing it.
func ExampleClient_WouldAccept() {
	c, work := exampleSetup("keys")
	ctx := context.Background()
	_, _ = c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "9", Email: "i@example.com"}, &enqueue.Opts{IdempotencyKey: "welcome-9"})
	work()
	h, _ := c.Holder(ctx, "welcome-9")
	fmt.Println("holder:", h.Kind, h.State)
	d, _ := c.WouldAccept(ctx, "welcome-9", enqueue.RejectAlways)
	fmt.Println("RejectAlways would:", d.Outcome)
	_, _ = c.ReleaseKey(ctx, "welcome-9")
	d, _ = c.WouldAccept(ctx, "welcome-9", enqueue.RejectAlways)
	fmt.Println("after ReleaseKey:", d.Outcome, d.Holder == nil)
	_, err := c.Holder(ctx, "welcome-9")
	fmt.Println("free:", errors.Is(err, ledger.ErrNotFound))
	// Output:
	// holder: welcome-email Succeeded
	// RejectAlways would: reject
	// after ReleaseKey: create true
	// free: true
}

// Rate limit: at most two welcome emails per user per hour; the third is
// refused, nothing written, with when a slot frees.
func ExampleRateLimit() {
	c, _ := exampleSetup("ratelimit")
	ctx := context.Background()
	perUser := &enqueue.RateLimit{Key: "welcome-user-1", Limit: 2, Period: time.Hour}
	for i := range 3 {
		_, err := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "1", Email: "a@example.com"}, &enqueue.Opts{RateLimit: perUser})
		var limited *enqueue.RateLimitedError
		if errors.As(err, &limited) {
			fmt.Printf("enqueue %d refused; a slot frees in about %.0f minutes\n", i+1, time.Until(limited.RetryAt).Minutes())
			continue
		}
		fmt.Printf("enqueue %d accepted: %v\n", i+1, err == nil)
	}
	// Output:
	// enqueue 1 accepted: true
	// enqueue 2 accepted: true
	// enqueue 3 refused; a slot frees in about 60 minutes
}

// Fan-in: the summary email goes out once both welcome emails were sent.
func ExampleClient_ContinueWhenAll() {
	c, work := exampleSetup("fanin")
	ctx := context.Background()
	a, _ := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "1", Email: "a@example.com"}, nil)
	b, _ := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "2", Email: "b@example.com"}, nil)
	summary, err := c.ContinueWhenAll(ctx, []string{a.ID, b.ID}, seedjobs.WelcomeEmail{UserID: "ops", Email: "ops@example.com"}, nil)
	fmt.Println("summary:", summary.State, err)
	work()
	rec, _ := c.Store().Get(ctx, summary.ID)
	fmt.Println("summary after both:", rec.State, "parents counted:", len(rec.Released))
	// Output:
	// summary: AwaitingContinuation <nil>
	// summary after both: Succeeded parents counted: 2
}

// Debounce: a user saving their profile five times in a row sends one
// "profile changed" email, with the last version, 5 s after the last save.
func ExampleDebounce() {
	c, _ := exampleSetup("debounce")
	ctx := context.Background()
	opts := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "profile-changed:user-1", Period: 5 * time.Second, MaxWait: time.Minute}}
	var first string
	for i := range 5 {
		res, err := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "1", Email: fmt.Sprintf("v%d@example.com", i)}, opts)
		if i == 0 {
			first = res.ID
		}
		fmt.Printf("save %d: folded %v into the first job %v (%v)\n", i+1, res.Folded, res.ID == first, err)
	}
	rec, _ := c.Store().Get(ctx, first)
	fmt.Println("its args:", rec.Args)
	// Output:
	// save 1: folded false into the first job true (<nil>)
	// save 2: folded true into the first job true (<nil>)
	// save 3: folded true into the first job true (<nil>)
	// save 4: folded true into the first job true (<nil>)
	// save 5: folded true into the first job true (<nil>)
	// its args: {"userId":"1","email":"v4@example.com"}
}

// Named queues: a bulk import goes to a queue of its own, so its backlog
// (and, deployed, its event source's MaxConcurrency) never holds back the
// jobs on the job queue. A name the client was not given is refused,
// nothing written.
func ExampleOpts_queue() {
	ctx := context.Background()
	cfg, _ := config.LoadDefaultConfig(ctx)
	name := fmt.Sprintf("example-queues-%d", time.Now().UnixNano())
	if err := provision.Table(ctx, dynamodb.NewFromConfig(cfg), name); err != nil {
		panic(err)
	}
	q := sqs.NewFromConfig(cfg)
	jobs, _, _ := provision.Queues(ctx, q, provision.QueueSpec{Name: name})
	bulk, _, _ := provision.Queues(ctx, q, provision.QueueSpec{Name: name + "-bulk"})
	c, _ := enqueue.New(cfg, name, jobs, &enqueue.ClientOptions{Queues: map[string]string{"bulk": bulk}, Logger: quietLog})

	res, err := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "8", Email: "h@example.com"}, &enqueue.Opts{Queue: "bulk"})
	fmt.Println("enqueued:", err == nil, res.State)
	rec, _ := c.Store().Get(ctx, res.ID)
	fmt.Println("its queue:", rec.Queue)
	_, err = c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "9"}, &enqueue.Opts{Queue: "imports"})
	fmt.Println("unknown queue refused:", errors.Is(err, enqueue.ErrUnknownQueue))
	// Output:
	// enqueued: true Enqueued
	// its queue: bulk
	// unknown queue refused: true
}
