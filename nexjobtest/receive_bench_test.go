package nexjobtest_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// BenchmarkReceiveBesideDeepQueue: one receive of ten messages from a
// queue that also holds 2,000 delayed ones (a soak's carries and retries
// after its outage). moto 5.2.5 read the queue's retention period for
// each message it handed out by building all of the queue's attributes,
// three counts over every message, three times: a receive's cost grew
// with the queue's depth. The default emulator reads the period alone
// (emulator.py, patch_sqs_retention).
func BenchmarkReceiveBesideDeepQueue(b *testing.B) {
	e := nexjobtest.New(b, nil)
	ctx := context.Background()
	batch := func(delay int32) {
		var entries []sqstypes.SendMessageBatchRequestEntry
		for i := range 10 {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String("m"), DelaySeconds: delay})
		}
		if _, err := e.SQS.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(e.QueueURL), Entries: entries}); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 {
		batch(900)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		batch(0)
		b.StartTimer()
		out, err := e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(e.QueueURL), MaxNumberOfMessages: 10, VisibilityTimeout: 900})
		if err != nil || len(out.Messages) == 0 {
			b.Fatalf("receive: %d messages, %v", len(out.Messages), err)
		}
	}
}

// BenchmarkSendBesideDeepQueue: one send beside 2,000 delayed messages.
// moto 5.2.5 read the queue's ContentBasedDeduplication through all of
// its attributes, three counts over every message among them, on every
// send; the default emulator makes no count within a send.
func BenchmarkSendBesideDeepQueue(b *testing.B) {
	e := nexjobtest.New(b, nil)
	ctx := context.Background()
	for i := range 200 {
		var entries []sqstypes.SendMessageBatchRequestEntry
		for j := range 10 {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(10*i + j)), MessageBody: aws.String("m"), DelaySeconds: 900})
		}
		if _, err := e.SQS.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(e.QueueURL), Entries: entries}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String("m")}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n := e.QueueDepth(b, e.QueueURL); n != 2000+b.N {
		b.Fatalf("the queue's counts say %d messages, want %d", n, 2000+b.N)
	}
}
