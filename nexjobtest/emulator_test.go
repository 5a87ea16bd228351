package nexjobtest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	stypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// A cancelled transaction changes nothing, writes nothing to the stream,
// and a stream reader that was already open sees the writes after it.
// DynamoDB behaves so; moto 5.2.5 swapped a deep copy in for the table on
// every cancel, which left open iterators on a stream no longer written
// (the dispatch guard went blind: the soak's seed 3 lost a job so) and
// leaked a whole table per cancel. The default emulator patches that.
func TestCancelledTransactionLeavesTheStreamReadable(t *testing.T) {
	ctx := context.Background()
	e := nexjobtest.New(t, nil)
	streams := dynamodbstreams.NewFromConfig(e.Cfg)
	key := func(id string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: id}}
	}
	put := func(id, v string) {
		t.Helper()
		item := key(id)
		item["v"] = &types.AttributeValueMemberS{Value: v}
		if _, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(e.Table), Item: item}); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "a0")
	put("b", "b0")

	desc, err := e.DB.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(e.Table)})
	if err != nil {
		t.Fatal(err)
	}
	sd, err := streams.DescribeStream(ctx, &dynamodbstreams.DescribeStreamInput{StreamArn: desc.Table.LatestStreamArn})
	if err != nil {
		t.Fatal(err)
	}
	if len(sd.StreamDescription.Shards) != 1 {
		t.Fatalf("want one shard, got %d", len(sd.StreamDescription.Shards))
	}
	it, err := streams.GetShardIterator(ctx, &dynamodbstreams.GetShardIteratorInput{
		StreamArn: desc.Table.LatestStreamArn, ShardId: sd.StreamDescription.Shards[0].ShardId, ShardIteratorType: stypes.ShardIteratorTypeLatest,
	})
	if err != nil {
		t.Fatal(err)
	}
	next := it.ShardIterator
	read := func() []string {
		t.Helper()
		out, err := streams.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: next})
		if err != nil {
			t.Fatal(err)
		}
		next = out.NextShardIterator
		var got []string
		for _, r := range out.Records {
			img := r.Dynamodb.NewImage
			if img == nil {
				img = r.Dynamodb.OldImage
			}
			got = append(got, string(r.EventName)+" "+img[ledger.AttrPK].(*stypes.AttributeValueMemberS).Value)
		}
		return got
	}
	if got := read(); len(got) != 0 {
		t.Fatalf("records before any write after LATEST: %v", got)
	}

	// Three writes, the last of which fails its condition: all cancelled.
	_, err = e.DB.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: &types.Update{TableName: aws.String(e.Table), Key: key("a"), UpdateExpression: aws.String("SET v = :v"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: "a1"}}}},
		{Put: &types.Put{TableName: aws.String(e.Table), Item: key("c")}},
		{Put: &types.Put{TableName: aws.String(e.Table), Item: key("b"), ConditionExpression: aws.String("attribute_not_exists(#pk)"),
			ExpressionAttributeNames: map[string]string{"#pk": ledger.AttrPK}}},
	}})
	var cancelled *types.TransactionCanceledException
	if !errors.As(err, &cancelled) {
		t.Fatalf("want the transaction cancelled, got %v", err)
	}
	for id, want := range map[string]string{"a": "a0", "b": "b0", "c": ""} {
		got, err := e.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(e.Table), Key: key(id), ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		v, _ := got.Item["v"].(*types.AttributeValueMemberS)
		switch {
		case want == "" && got.Item != nil:
			t.Errorf("%s: the cancelled transaction's put is there: %v", id, got.Item)
		case want != "" && (v == nil || v.Value != want):
			t.Errorf("%s: after the cancel v = %v, want %q", id, got.Item["v"], want)
		}
	}

	put("d", "d0")
	if got := read(); len(got) != 1 || got[0] != "INSERT d" {
		t.Fatalf("the open iterator read %v after the cancel and one put, want [INSERT d]", got)
	}
}

// A message sent while others are deleted from the same queue is kept.
// SQS loses no acknowledged send; moto 5.2.5 deleted a message by
// building a new list of the queue's others outside the lock its sends
// append under, and assigning it: a send that appended to one delete's
// new list was undone by a second delete's assignment, so SendMessage
// answered OK and the message was never received (the 10k soak, seed
// 1796611249630198530, left ten retries Scheduled so). The deeper the
// queue the longer each delete's walk: here 3,000 messages are held in
// flight and deleted ten at a time, three batches at once, beside two
// senders of 500 new ones each. The default emulator patches it.
func TestSendDuringDeletesIsKept(t *testing.T) {
	ctx := context.Background()
	e := nexjobtest.New(t, nil)
	q := aws.String(e.QueueURL)
	send := func(prefix string, from int) error {
		var entries []sqstypes.SendMessageBatchRequestEntry
		for i := from; i < from+10; i++ {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(fmt.Sprintf("%s-%d", prefix, i))})
		}
		out, err := e.SQS.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: q, Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = fmt.Errorf("%d entries failed: %v", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		return err
	}
	receive := func() []sqstypes.Message {
		t.Helper()
		out, err := e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: q, MaxNumberOfMessages: 10, VisibilityTimeout: 900})
		if err != nil {
			t.Fatal(err)
		}
		return out.Messages
	}
	const held, fresh = 3000, 1000
	for i := 0; i < held; i += 10 {
		if err := send("old", i); err != nil {
			t.Fatal(err)
		}
	}
	var handles []string
	for len(handles) < held {
		ms := receive()
		if len(ms) == 0 {
			t.Fatalf("received %d of the %d sent", len(handles), held)
		}
		for _, m := range ms {
			handles = append(handles, aws.ToString(m.ReceiptHandle))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for d := range 3 {
		wg.Go(func() {
			for i := d * 10; i < len(handles); i += 30 {
				var entries []sqstypes.DeleteMessageBatchRequestEntry
				for j, h := range handles[i:min(i+10, len(handles))] {
					entries = append(entries, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(j)), ReceiptHandle: aws.String(h)})
				}
				out, err := e.SQS.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: q, Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d deletes failed: %v", len(out.Failed), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for s := range 2 {
		wg.Go(func() {
			for i := s * fresh / 2; i < (s+1)*fresh/2; i += 10 {
				if err := send("new", i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for ms := receive(); len(ms) > 0; ms = receive() {
		for _, m := range ms {
			seen[aws.ToString(m.Body)] = true
		}
	}
	var lost []int
	for i := range fresh {
		if !seen[fmt.Sprintf("new-%d", i)] {
			lost = append(lost, i)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d messages sent with no error were never received (of the held ones, %d came back): %v", len(lost), fresh, len(seen)-fresh+len(lost), lost)
	}
	// Old messages may come too: a send or a receive whose reply was lost
	// under load is retried by the SDK (a second copy, or ten held for
	// the visibility timeout), as on SQS. Only a lost new one is a fault.
}
