package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/aws/aws-lambda-go/events"
)

// BatchOptions say how a batch's records are keyed. nil keys each record
// by its event source's own id (an SQS messageId, a stream record's
// eventID): a redelivery of one record is a repeat; two sends of one body
// are not.
type BatchOptions[M any] struct {
	// Key, KeyPath, Payload and PayloadPath find a record's key and the
	// fields a repeat must match, as HandlerOptions do for an event.
	Key         func(M) (string, error)
	KeyPath     string
	Payload     func(M) any
	PayloadPath string
}

// Records is the per-record mode every batch wrapper below uses, for any
// event source: the returned function runs each record's fn once per key,
// as Do, one after the other in the batch's order, and returns the ids
// (id(record)) of the records that failed (their function's error, a call
// in progress, a payload mismatch, a record that could not be written),
// for the source's partial batch response; a replayed record is done.
// ordered: the first failure fails the rest of the batch unrun, so that
// no record overtakes one that will come back (FIFO queues, Kinesis and
// DynamoDB streams, which retry from the first failure). A record whose
// first call's error was recorded (Options.RecordErrors) and protected by
// the policy is done: it does not come back. The error is for a bad
// option or expression. o must say how records are keyed.
func Records[M any](s *Store, id func(M) string, fn func(context.Context, M) error, o *BatchOptions[M]) (func(ctx context.Context, recs []M, ordered bool) []string, error) {
	if o == nil {
		return nil, errors.New("nexjob: an idempotent batch needs BatchOptions saying how records are keyed")
	}
	x, err := newExtractor(&HandlerOptions[M, struct{}]{Key: o.Key, KeyPath: o.KeyPath, Payload: o.Payload, PayloadPath: o.PayloadPath})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, recs []M, ordered bool) []string {
		var failed []string
		for _, r := range recs {
			if len(failed) > 0 && ordered {
				failed = append(failed, id(r))
				continue
			}
			if err := record(ctx, s, x, r, fn); err != nil {
				s.log.LogAttrs(ctx, slog.LevelWarn, "nexjob: idempotent batch record failed; it comes back", slog.String("function", s.function), slog.String("record_id", id(r)), slog.String("outcome", outcome(err)))
				failed = append(failed, id(r))
			}
		}
		return failed
	}, nil
}

// record runs one batch record idempotently.
func record[M any](ctx context.Context, s *Store, x *extractor[M, struct{}], m M, fn func(context.Context, M) error) error {
	if s.disabled {
		return fn(ctx, m)
	}
	key, payload, err := x.find(m)
	if err != nil {
		return err
	}
	if key.text == "" {
		return ErrNoKey
	}
	_, err = call(ctx, s, key.hash(s), func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx, m) }, &CallOptions{Payload: payload})
	var dup *DuplicateError
	if errors.As(err, &dup) {
		return nil // its recorded failure stands: it does not come back
	}
	return err
}

// SQSBatch wraps a per-message function into an SQS event source's
// handler with partial batch responses (the mapping's
// ReportBatchItemFailures, which the construct sets), as Records: ordered
// on a FIFO queue. nil options key a message by its messageId.
func SQSBatch(s *Store, fn func(context.Context, events.SQSMessage) error, o *BatchOptions[events.SQSMessage]) (func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), error) {
	if o == nil {
		o = &BatchOptions[events.SQSMessage]{Key: func(m events.SQSMessage) (string, error) { return m.MessageId, nil }}
	}
	run, err := Records(s, func(m events.SQSMessage) string { return m.MessageId }, fn, o)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		fifo := len(ev.Records) > 0 && strings.HasSuffix(ev.Records[0].EventSourceARN, ".fifo")
		var resp events.SQSEventResponse
		for _, id := range run(ctx, ev.Records, fifo) {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
		}
		return resp, nil
	}, nil
}

// KinesisBatch is SQSBatch for a Kinesis stream's records, ordered (the
// mapping retries from the first failure it is told of, by sequence
// number). nil options key a record by its eventID (shard and sequence
// number: the same on a retry).
func KinesisBatch(s *Store, fn func(context.Context, events.KinesisEventRecord) error, o *BatchOptions[events.KinesisEventRecord]) (func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error), error) {
	if o == nil {
		o = &BatchOptions[events.KinesisEventRecord]{Key: func(r events.KinesisEventRecord) (string, error) { return r.EventID, nil }}
	}
	run, err := Records(s, func(r events.KinesisEventRecord) string { return r.Kinesis.SequenceNumber }, fn, o)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.KinesisEvent) (events.KinesisEventResponse, error) {
		var resp events.KinesisEventResponse
		for _, id := range run(ctx, ev.Records, true) {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.KinesisBatchItemFailure{ItemIdentifier: id})
		}
		return resp, nil
	}, nil
}

// DynamoDBStreamBatch is SQSBatch for a DynamoDB stream's records,
// ordered as KinesisBatch. nil options key a record by its eventID.
func DynamoDBStreamBatch(s *Store, fn func(context.Context, events.DynamoDBEventRecord) error, o *BatchOptions[events.DynamoDBEventRecord]) (func(context.Context, events.DynamoDBEvent) (events.DynamoDBEventResponse, error), error) {
	if o == nil {
		o = &BatchOptions[events.DynamoDBEventRecord]{Key: func(r events.DynamoDBEventRecord) (string, error) { return r.EventID, nil }}
	}
	run, err := Records(s, func(r events.DynamoDBEventRecord) string { return r.Change.SequenceNumber }, fn, o)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		var resp events.DynamoDBEventResponse
		for _, id := range run(ctx, ev.Records, true) {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.DynamoDBBatchItemFailure{ItemIdentifier: id})
		}
		return resp, nil
	}, nil
}

// outcome names a record's failure for the log without its text (a
// function's error may quote the payload).
func outcome(err error) string {
	switch {
	case errors.Is(err, ErrInProgress):
		return "in progress"
	case errors.Is(err, ErrPayloadMismatch):
		return "payload mismatch"
	case errors.Is(err, ErrNoKey):
		return "no key"
	case errors.Is(err, ErrNotRecorded):
		return "not recorded"
	}
	return "failed"
}
