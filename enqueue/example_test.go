package enqueue_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/provision"
)

// exampleSetup provisions a table and queue on the backend of the SDK
// environment (make test starts the default emulator) and returns a client
// and a function that runs the worker until the queue is empty.
func exampleSetup(name string) (*enqueue.Client, func()) {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		panic(err)
	}
	name = fmt.Sprintf("example-%s-%d", name, time.Now().UnixNano())
	if err := provision.Table(ctx, dynamodb.NewFromConfig(cfg), name); err != nil {
		panic(err)
	}
	q := sqs.NewFromConfig(cfg)
	queueURL, _, err := provision.Queues(ctx, q, provision.QueueSpec{Name: name})
	if err != nil {
		panic(err)
	}
	reg := handler.NewRegistry()
	seedjobs.Register(reg, &seedjobs.Charges{}, quietLog, func(int) time.Duration { return 0 })
	h, err := handler.New(cfg, name, queueURL, reg, &handler.Options{Logger: quietLog})
	if err != nil {
		panic(err)
	}
	p := poller.New(q, queueURL, h.Handle, &poller.Options{WaitTime: time.Second, Logger: quietLog})
	work := func() {
		for {
			if n, err := p.Poll(ctx); err != nil || n == 0 {
				return
			}
		}
	}
	c, err := enqueue.New(cfg, name, queueURL, &enqueue.ClientOptions{Logger: quietLog})
	if err != nil {
		panic(err)
	}
	return c, work
}

// Payment processing: deduplicated while a payment job for the order is
// active; a new attempt is allowed once it finishes (AllowAfterFailed).
func Example_payment() {
	c, work := exampleSetup("payment")
	ctx := context.Background()
	opts := &enqueue.Opts{IdempotencyKey: "payment-1001", DuplicatePolicy: enqueue.AllowAfterFailed}
	first, _ := c.Enqueue(ctx, seedjobs.Payment{OrderID: "1001", AmountCents: 4999}, opts)
	again, _ := c.Enqueue(ctx, seedjobs.Payment{OrderID: "1001", AmountCents: 4999}, opts)
	fmt.Println("first is new:", !first.Duplicate)
	fmt.Println("retry while active returns the same job:", again.Duplicate && again.ID == first.ID)
	work()
	after, _ := c.Enqueue(ctx, seedjobs.Payment{OrderID: "1001", AmountCents: 4999}, opts)
	fmt.Println("after it succeeded, a new job:", !after.Duplicate && after.ID != first.ID)
	// Output:
	// first is new: true
	// retry while active returns the same job: true
	// after it succeeded, a new job: true
}

// Welcome email: never sent twice, even if the job previously failed
// (RejectAlways). The rejection is a typed error carrying the existing job.
func Example_welcomeEmail() {
	c, work := exampleSetup("welcome")
	ctx := context.Background()
	opts := &enqueue.Opts{IdempotencyKey: "welcome-42", DuplicatePolicy: enqueue.RejectAlways}
	first, _ := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "42", Email: "ada@example.com"}, opts)
	work()
	_, err := c.Enqueue(ctx, seedjobs.WelcomeEmail{UserID: "42", Email: "ada@example.com"}, opts)
	var dup *enqueue.DuplicateJobError
	if errors.As(err, &dup) {
		fmt.Println("rejected by", dup.Policy, "- existing job is", dup.ExistingState)
		fmt.Println("existing job is the first one:", dup.ExistingJobID == first.ID)
	}
	// Output:
	// rejected by RejectAlways - existing job is Succeeded
	// existing job is the first one: true
}

// Webhook delivery: deduplicated while a delivery is in progress; allowed
// again once the previous delivery failed.
func Example_webhook() {
	c, work := exampleSetup("webhook")
	ctx := context.Background()
	hook := seedjobs.Webhook{URL: "https://hooks.unreachable.invalid/in", EventID: "evt-7"}
	opts := &enqueue.Opts{IdempotencyKey: "webhook-evt-7", DuplicatePolicy: enqueue.AllowAfterFailed, MaxAttempts: 2}
	first, _ := c.Enqueue(ctx, hook, opts)
	work() // two attempts, both refused: Failed
	rec, _ := c.Store().Get(ctx, first.ID)
	fmt.Println("first delivery:", rec.State, "after", rec.Attempt, "attempts")
	retry, _ := c.Enqueue(ctx, hook, opts)
	fmt.Println("a new delivery job:", !retry.Duplicate && retry.ID != first.ID)
	// Output:
	// first delivery: Failed after 2 attempts
	// a new delivery job: true
}
