package handler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// A parent Succeeded and its worker died before releasing its children
// (or the release failed and the message was received until the DLQ
// took it): the dead letter of the parent's message releases them. The
// 10k soak, seed 1796502170212235855, left a fan-in child
// AwaitingContinuation for ever this way: the DLQ consumer dropped the
// dead letter of a Succeeded job as a duplicate.
func TestDeadLetterOfASucceededParentReleasesItsChildren(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[queued](func(context.Context, *handler.Job[queued]) error { return nil }), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	parent, err := e.Client.Enqueue(ctx, queued{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.Client.Enqueue(ctx, queued{N: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := e.Client.ContinueWith(ctx, parent.ID, queued{N: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fanIn, err := e.Client.ContinueWhenAll(ctx, []string{parent.ID, other.ID}, queued{N: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := e.Client.Store()
	for _, id := range []string{parent.ID, other.ID} {
		rec, err := st.Claim(ctx, id, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Succeeded}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Client.ReleaseContinuations(ctx, e.Get(t, other.ID)); err != nil {
		t.Fatal(err)
	}
	// The parent's worker died before its release: its message is the
	// dead letter.
	dead := e.Messages(t, e.QueueURL)
	for i := 0; i < len(dead); i++ {
		if !strings.Contains(*dead[i].Body, parent.ID) {
			dead = append(dead[:i], dead[i+1:]...)
			i--
		}
	}
	if len(dead) != 1 {
		t.Fatalf("%d messages of the parent, want 1", len(dead))
	}
	if resp, err := h.HandleDeadLetters(ctx, poller.Event(e.DLQURL, dead)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter: %+v %v", resp, err)
	}
	for _, id := range []string{child.ID, fanIn.ID} {
		if rec := e.Get(t, id); rec.State != ledger.Enqueued {
			t.Errorf("continuation %s of the Succeeded parent: %s, want Enqueued (released)", id, rec.State)
		}
	}
}
