package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/aws/aws-lambda-go/events"
)

// BatchOptions say how a batch's records are keyed. nil keys each SQS
// message by its messageId (a redelivery of one message is a repeat; two
// sends of one body are not).
type BatchOptions[M any] struct {
	// Key, KeyPath, Payload and PayloadPath find a record's key and the
	// fields a repeat must match, as HandlerOptions do for an event.
	Key         func(M) (string, error)
	KeyPath     string
	Payload     func(M) any
	PayloadPath string
}

// SQSBatch wraps a per-message function into an SQS event source's
// handler with partial batch responses (the mapping's
// ReportBatchItemFailures, which the construct sets): each message runs
// fn once per key, as Do; a message whose call failed (its function's
// error, a call in progress, a payload mismatch, a record that could not
// be written) is reported in BatchItemFailures and comes back; a replayed
// one is done. Messages run one after the other, in the batch's order; on
// a FIFO queue the first failure fails the rest of the batch too, so
// that no message of a group overtakes one that will come back. A
// message whose first call's error was recorded (Options.RecordErrors)
// and protected by the policy is done: it does not come back. The error
// is for a bad option or expression.
func SQSBatch(s *Store, fn func(context.Context, events.SQSMessage) error, o *BatchOptions[events.SQSMessage]) (func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), error) {
	if o == nil {
		o = &BatchOptions[events.SQSMessage]{Key: func(m events.SQSMessage) (string, error) { return m.MessageId, nil }}
	}
	x, err := newExtractor(&HandlerOptions[events.SQSMessage, struct{}]{Key: o.Key, KeyPath: o.KeyPath, Payload: o.Payload, PayloadPath: o.PayloadPath})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		var resp events.SQSEventResponse
		failed := false
		for _, m := range ev.Records {
			fifo := strings.HasSuffix(m.EventSourceARN, ".fifo")
			if failed && fifo {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
				continue
			}
			if err := s.record(ctx, x, m, fn); err != nil {
				failed = true
				s.log.LogAttrs(ctx, slog.LevelWarn, "nexjob: idempotent batch record failed; it comes back", slog.String("function", s.function), slog.String("message_id", m.MessageId), slog.String("outcome", outcome(err)))
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
			}
		}
		return resp, nil
	}, nil
}

// record runs one batch record idempotently.
func (s *Store) record(ctx context.Context, x *extractor[events.SQSMessage, struct{}], m events.SQSMessage, fn func(context.Context, events.SQSMessage) error) error {
	if s.disabled {
		return fn(ctx, m)
	}
	key, payload, err := x.find(m)
	if err != nil {
		return err
	}
	_, err = Do(ctx, s, key, func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx, m) }, &CallOptions{Payload: payload})
	var dup *DuplicateError
	if errors.As(err, &dup) {
		return nil // its recorded failure stands: it does not come back
	}
	return err
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
