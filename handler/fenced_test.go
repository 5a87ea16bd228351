package handler_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// An operator's Delete ends a running parent (EndActive) and then fails
// before it settles the parent's waiting continuation (the 10k soak, seed
// 1796502170212235855, left such a child AwaitingContinuation for good:
// the running worker's result was refused as fenced and its message, the
// parent's only one, deleted). The refused finish settles the children
// as the parent's end says: the child ends Failed.
func TestFencedFinishSettlesTheChildren(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		close(started)
		<-release
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	parent, err := e.Client.Enqueue(ctx, email{To: "parent@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := e.Client.ContinueWith(ctx, parent.ID, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := e.Messages(t, e.QueueURL)
	var body string
	for _, m := range msgs {
		if msg, err := enqueue.DecodeMessage(*m.Body); err == nil && msg.ID == parent.ID {
			body = *m.Body
		}
	}
	if body == "" {
		t.Fatalf("no message for the parent among %d", len(msgs))
	}
	done := make(chan events.SQSEventResponse, 1)
	go func() {
		resp, _ := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: "p", ReceiptHandle: "rh", Body: body}}})
		done <- resp
	}()
	<-started
	// The operator's Delete: the parent ended, then the Delete failed
	// before it settled the child (nothing more written).
	if _, ended, err := e.Client.Store().EndActive(ctx, parent.ID, "deleted by an operator", time.Time{}); err != nil || !ended {
		t.Fatalf("end the running parent: %v %v", ended, err)
	}
	close(release)
	if resp := <-done; len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the refused finish kept its message: %+v", resp)
	}
	if rec := e.Get(t, child.ID); rec.State != ledger.Failed {
		t.Fatalf("the child of the ended parent is %s, want Failed (nothing else would ever end it)", rec.State)
	}
}
