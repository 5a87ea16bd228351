package nexjobtest

// An Env's assertions and reads: a job's record and state, a key's
// holder, a queue's messages and depth.

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Get returns the job's record, its Steps whole (those in the steps table
// too), failing the test if it cannot be read.
func (e *Env) Get(t testing.TB, id string) ledger.Record {
	t.Helper()
	rec, err := e.Client.Store().Get(context.Background(), id)
	if err == nil {
		rec, err = e.Client.Store().WithSteps(context.Background(), rec) // the steps table's too
	}
	if err != nil {
		t.Fatalf("get job %s: %v", id, err)
	}
	return rec
}

// RequireState fails the test unless the job is in state st now.
func (e *Env) RequireState(t testing.TB, id string, st ledger.State) ledger.Record {
	t.Helper()
	rec := e.Get(t, id)
	if rec.State != st {
		t.Fatalf("job %s (%s) is %s after %d attempts (last error %q); want %s", id, rec.Kind, rec.State, rec.Attempt, rec.LastError, st)
	}
	return rec
}

// WaitFor waits (polling the record, strongly consistent) until the job is
// in state st, for at most timeout, and returns its record; it fails the
// test with the record as it was otherwise. Something must be running the
// jobs meanwhile (a goroutine draining, a Lambda on real AWS).
func (e *Env) WaitFor(t testing.TB, id string, st ledger.State, timeout time.Duration) ledger.Record {
	t.Helper()
	var rec ledger.Record
	for end := time.Now().Add(timeout); ; {
		rec = e.Get(t, id)
		if rec.State == st {
			return rec
		}
		if time.Now().After(end) {
			t.Fatalf("job %s is %s after %s (attempt %d, last error %q); want %s", id, rec.State, timeout, rec.Attempt, rec.LastError, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RequireEnqueued fails the test unless an active job of this kind holds
// the idempotency key (Enqueued, Scheduled, Processing or waiting on its
// parent), and returns it. The key is looked up by its hash, as the
// ledger stores it.
func (e *Env) RequireEnqueued(t testing.TB, kind, key string) ledger.Record {
	t.Helper()
	rec, ok := e.holder(t, key)
	switch {
	case !ok:
		t.Fatalf("no job holds the key %q", key)
	case rec.Kind != kind:
		t.Fatalf("the key %q is held by a %s job (%s), want %s", key, rec.Kind, rec.ID, kind)
	case !rec.State.Active():
		t.Fatalf("the %s job %s holding the key %q is %s, not active", kind, rec.ID, key, rec.State)
	}
	return rec
}

// RequireNoJob fails the test if a job holds the key.
func (e *Env) RequireNoJob(t testing.TB, key string) {
	t.Helper()
	if rec, ok := e.holder(t, key); ok {
		t.Fatalf("the key %q is held by %s job %s (%s)", key, rec.Kind, rec.ID, rec.State)
	}
}

func (e *Env) holder(t testing.TB, key string) (ledger.Record, bool) {
	t.Helper()
	rec, err := e.Client.Store().GetByKey(context.Background(), key)
	if errors.Is(err, ledger.ErrNotFound) {
		return ledger.Record{}, false
	}
	if err != nil {
		t.Fatalf("look up key: %v", err)
	}
	return rec, true
}

// Messages receives what is visible on the queue (deleting nothing) until
// an empty receive. They stay invisible for 60 s afterwards.
func (e *Env) Messages(t testing.TB, queueURL string) []sqstypes.Message {
	t.Helper()
	var out []sqstypes.Message
	for {
		r, err := e.SQS.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, VisibilityTimeout: 60,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		if len(r.Messages) == 0 {
			return out
		}
		out = append(out, r.Messages...)
	}
}

// QueueDepth returns the visible + in-flight + delayed message count.
func (e *Env) QueueDepth(t testing.TB, queueURL string) int {
	t.Helper()
	a, err := e.SQS.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{
			sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		t.Fatalf("queue attributes: %v", err)
	}
	n := 0
	for _, v := range a.Attributes {
		i, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("queue attribute %q: %v", v, err)
		}
		n += i
	}
	return n
}
