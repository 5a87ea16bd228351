package nexjobtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	stypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"

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
