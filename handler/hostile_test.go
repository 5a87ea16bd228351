package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

type rawArgs struct {
	Data json.RawMessage `json:"data"`
}

func (rawArgs) Kind() string { return "email" } // posing as an email job: its args will not decode

// TestHostileArgs: deeply nested JSON and invalid UTF-8 in args end as a
// typed refusal at enqueue or a Failed job with the reason, never a panic
// or a lost job.
func TestHostileArgs(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	res, err := r.prod.Enqueue(context.Background(), rawArgs{Data: json.RawMessage(deep)}, nil)
	var nested string
	switch {
	case errors.Is(err, enqueue.ErrInvalidInput):
		t.Logf("deep nesting refused at enqueue: %v", err)
	case err != nil:
		t.Fatalf("deep nesting: untyped error %v", err)
	default:
		nested = res.ID
	}
	utf := r.enqueue(t, email{To: "bad\xff\xfe@example.com"}, nil)
	r.drain(t)
	if nested != "" {
		expect(t, r.get(t, nested), ledger.Failed, 1, "do not decode")
	}
	expect(t, r.get(t, utf), ledger.Succeeded, 1, "")
	if r.calls.Load() != 1 {
		t.Fatalf("worker ran %d times, want once (the UTF-8 job)", r.calls.Load())
	}
}
