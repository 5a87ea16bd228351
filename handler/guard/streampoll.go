package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	stypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"
)

// StreamPoller reads the ledger table's stream and hands changes to a
// Guard, playing the part of Lambda's stream event source mapping. It is
// for local use (tests, emulators); on AWS the event source mapping does
// this. It starts at the stream's beginning and follows every shard.
type StreamPoller struct {
	db      *dynamodb.Client
	streams *dynamodbstreams.Client
	table   string
	g       *Guard
	sinks   []func(context.Context, []Change) error // the guard's Check, and Also's
	iters   map[string]*string                      // shard id → next iterator; nil when closed
	arn     *string                                 // the table's latest stream, read once
}

// NewStreamPoller returns a poller over the table's latest stream.
func NewStreamPoller(db *dynamodb.Client, streams *dynamodbstreams.Client, table string, g *Guard) *StreamPoller {
	return &StreamPoller{db: db, streams: streams, table: table, g: g, sinks: []func(context.Context, []Change) error{g.Check}, iters: map[string]*string{}}
}

// Also hands every batch of changes to sink too, after the guard (as a
// second event source mapping on the stream would: the completion
// events' publisher). A sink's error leaves the batch to come again, to
// every sink: each must take a batch twice.
func (p *StreamPoller) Also(sink func(context.Context, []Change) error) *StreamPoller {
	p.sinks = append(p.sinks, sink)
	return p
}

// Run polls until ctx is done.
func (p *StreamPoller) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := p.Poll(ctx); err != nil && ctx.Err() == nil {
			p.g.o.Logger.WarnContext(ctx, "nexjob guard: stream poll failed", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// Poll reads what every shard has now and checks it.
func (p *StreamPoller) Poll(ctx context.Context) error {
	if p.arn == nil {
		// Once: DescribeTable on the emulator sizes every item, each poll.
		t, err := p.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(p.table)})
		if err != nil {
			return fmt.Errorf("describe table: %w", err)
		}
		if t.Table.LatestStreamArn == nil {
			return fmt.Errorf("table %s has no stream", p.table)
		}
		p.arn = t.Table.LatestStreamArn
	}
	d, err := p.streams.DescribeStream(ctx, &dynamodbstreams.DescribeStreamInput{StreamArn: p.arn})
	if err != nil {
		p.arn = nil // perhaps a new stream: read the table again next time
		return fmt.Errorf("describe stream: %w", err)
	}
	for _, sh := range d.StreamDescription.Shards {
		id := aws.ToString(sh.ShardId)
		it, seen := p.iters[id]
		if !seen {
			out, err := p.streams.GetShardIterator(ctx, &dynamodbstreams.GetShardIteratorInput{
				StreamArn: p.arn, ShardId: sh.ShardId, ShardIteratorType: stypes.ShardIteratorTypeTrimHorizon,
			})
			if err != nil {
				return fmt.Errorf("shard iterator: %w", err)
			}
			it = out.ShardIterator
		}
		for it != nil {
			out, err := p.streams.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: it})
			if err != nil {
				return fmt.Errorf("get records: %w", err)
			}
			var changes []Change
			for _, r := range out.Records {
				if r.Dynamodb == nil || (r.EventName != stypes.OperationTypeInsert && r.EventName != stypes.OperationTypeModify) {
					continue
				}
				changes = append(changes, changeFromStream(r.Dynamodb.NewImage, r.Dynamodb.OldImage))
			}
			for _, sink := range p.sinks {
				if err := sink(ctx, changes); err != nil {
					return err // the iterator is not advanced: the same records come again
				}
			}
			it = out.NextShardIterator
			p.iters[id] = it
			if len(out.Records) == 0 {
				break
			}
		}
	}
	return nil
}

func changeFromStream(newImg, oldImg map[string]stypes.AttributeValue) Change {
	get := func(img map[string]stypes.AttributeValue) attrs {
		return func(k string, number bool) (string, bool) {
			switch v := img[k].(type) {
			case *stypes.AttributeValueMemberN:
				if number {
					return v.Value, true
				}
			case *stypes.AttributeValueMemberS:
				if !number {
					return v.Value, true
				}
			}
			return "", false
		}
	}
	return changeFrom(get(newImg), get(oldImg))
}
