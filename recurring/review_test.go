package recurring_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
)

// Review: a firing's run fails for good and its worker runs the
// dead-letter hook, a slow one, holding it (ExtendHook every third of the
// lease). The next firing meets the record (its hook due) and moves it
// aside under its job id (archive), conditional on the record's state
// and UpdatedAt, which ExtendHook does not change: the holder's
// extension lands between the put that read the record and the
// transaction, and the archived copy keeps the old HookUntil. The
// holder's next extension fails its condition, it stops holding, and once
// the stale lease ends the DLQ consumer takes the hook over while the
// first run of it is still going: two runs of one hook, no kill between.
func TestReviewArchivedFiringLosesHookExtension(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(context.Context, *handler.Job[report]) error { return errors.New("down") }),
		&handler.KindOptions{OnDeadLetter: func(ctx context.Context, _ ledger.Record, _ error) error {
			if hooks.Add(1) == 1 {
				close(started)
				<-release // a slow hook
			}
			return nil
		}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet, Lease: 3 * time.Second}) // no deadline: the hook's lease is 8 s, extended every 2.7 s
	st := e.Client.Store()
	f := nightly("2026-12-04T02:00:00Z")
	f.MaxAttempts = 1
	res, err := recurring.Fire(ctx, e.Client, f)
	if err != nil {
		t.Fatal(err)
	}
	polled := make(chan error, 1)
	go func() {
		_, err := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m", ReceiptHandle: "rh", Body: enqueue.Message{V: 1, ID: res.ID, Kind: "report"}.Encode()}}})
		polled <- err
	}()
	defer func() {
		close(release)
		if err := <-polled; err != nil {
			t.Error(err)
		}
	}()
	<-started
	first := e.Get(t, res.ID).HookUntil

	// The next firing; its archive transaction is held until the holder
	// has extended its lease once.
	ft, cfg := e.Faulty()
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Pass, Before: func(*http.Request, []byte) {
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if rec, err := st.Get(ctx, res.ID); err == nil && rec.HookUntil != first {
				return
			}
		}
	}})
	next, err := recurring.Fire(ctx, c, nightly("2026-12-05T02:00:00Z"))
	if err != nil || next.Duplicate || next.ID == res.ID {
		t.Fatalf("the next firing: %+v %v", next, err)
	}
	old := e.Get(t, res.ID)
	if !old.HookPending {
		t.Fatal("the failed firing's record lost its due hook")
	}
	// The lease as the archived record has it ends (real time: the
	// holder is alive and would have extended it).
	time.Sleep(time.Until(ledger.Millis(old.HookUntil)) + 200*time.Millisecond)
	msg := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "d", ReceiptHandle: "rh", Body: enqueue.Message{V: 1, ID: res.ID, Kind: "report"}.Encode(),
		Attributes: map[string]string{"ApproximateReceiveCount": "5"}}}}
	if _, err := h.HandleDeadLetters(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the hook ran %d times while its first run still held it (archived HookUntil %d, first %d): want once", n, old.HookUntil, first)
	}
}
