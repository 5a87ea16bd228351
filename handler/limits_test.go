package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestLargestArgsThroughFailingRuns (scenario 14): args of the largest
// accepted size, a worker failing with an error far over the kept length:
// every later write of the record fits DynamoDB's item limit, and the job
// ends Failed, never looping to the DLQ as poison.
func TestLargestArgsThroughFailingRuns(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error {
		return errors.New(strings.Repeat("é", 8000)) // 16 000 bytes
	}, &handler.Options{})
	args := email{To: strings.Repeat("x", ledger.MaxArgsBytes-len(`{"To":""}`))}
	parent := r.enqueue(t, args, &enqueue.Opts{IdempotencyKey: "big-1", MaxAttempts: 2})
	for range 3 {
		if _, err := r.prod.ContinueWith(context.Background(), parent, email{To: "child"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.prod.Enqueue(context.Background(), email{To: args.To + "x"}, nil); !errors.Is(err, enqueue.ErrInvalidInput) {
		t.Fatalf("args one byte over the limit: %v; want an *InputError", err)
	}
	r.drain(t)
	expect(t, r.get(t, parent), ledger.Failed, 2, "éé")
	if n := r.e.QueueDepth(t, r.e.DLQURL); n != 0 {
		t.Fatalf("%d messages in the DLQ", n)
	}
}
