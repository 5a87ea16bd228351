package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// DeadLetterKind is the kind of the ledger records that keep messages that
// were not jobs (malformed bodies, unknown ids): state Failed, args
// {"messageId", "body", "reason"}, listed with the other Failed jobs.
const DeadLetterKind = "nexjob.dead-letter"

// maxKeptBody bounds the body kept in a dead-letter record (the item limit
// is 400 KB).
const maxKeptBody = 300 * 1024

// HandleDeadLetters is the handler of the DLQ consumer function. A job
// message means the job's worker never reported a result in
// maxReceiveCount receives (it crashed or timed out every time): the job
// becomes Failed with that reason, once, and its dead-letter hook runs. A
// message that is not a job is kept in the ledger as a DeadLetterKind
// record with the reason. Nothing is dropped: a message whose record
// cannot be written is returned as a failure and stays in the DLQ.
func (h *Handler) HandleDeadLetters(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, m := range ev.Records {
		if err := h.deadLetterOne(ctx, m); err != nil {
			h.log.ErrorContext(ctx, "nexjob: dead letter not recorded", "message_id", m.MessageId, "err", err)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
		}
	}
	return resp, nil
}

func (h *Handler) deadLetterOne(ctx context.Context, m events.SQSMessage) error {
	msg, err := enqueue.DecodeMessage(m.Body)
	if err != nil {
		return h.keepNonJob(ctx, m, reasonOf(m, err))
	}
	cause := fmt.Errorf("%w: poison message moved to the dead-letter queue after %s receives (the worker crashed or timed out every time)",
		ErrOrphaned, m.Attributes["ApproximateReceiveCount"])
	rec, dead, err := h.store.DeadLetter(ctx, msg.ID, cause.Error(), h.expiry(h.o.Retention.Failed))
	switch {
	case errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrBadID):
		return h.keepNonJob(ctx, m, reasonOf(m, fmt.Errorf("no job %s in the ledger", msg.ID)))
	case err != nil:
		return err
	case dead:
		h.log.WarnContext(ctx, "nexjob: job dead-lettered", "job_id", rec.ID, "kind", rec.Kind)
		h.deadLetter(ctx, rec, cause)
	}
	return nil
}

func reasonOf(m events.SQSMessage, err error) string {
	if a, ok := m.MessageAttributes["nexjob-reason"]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return err.Error()
}

// keepNonJob writes a Failed record holding the message and the reason.
func (h *Handler) keepNonJob(ctx context.Context, m events.SQSMessage, reason string) error {
	body := m.Body
	if len(body) > maxKeptBody {
		body = body[:maxKeptBody]
	}
	args, err := json.Marshal(map[string]string{"messageId": m.MessageId, "body": body, "reason": reason})
	if err != nil {
		return err
	}
	rec := ledger.Record{Kind: DeadLetterKind, Args: string(args), State: ledger.Failed, LastError: reason, MaxAttempts: 1}
	if exp := h.expiry(h.o.Retention.Failed); !exp.IsZero() {
		rec.ExpiresAt = exp.Unix()
	}
	// Keyed by the message id: a redelivered dead letter is kept once.
	if _, _, err := h.store.Insert(ctx, rec, "dead-letter/"+m.MessageId, ledger.RejectAlways); err != nil {
		var dup *ledger.DuplicateJobError
		if !errors.As(err, &dup) {
			return err
		}
	}
	h.log.WarnContext(ctx, "nexjob: non-job message kept in the ledger", "message_id", m.MessageId, "reason", reason)
	return nil
}
