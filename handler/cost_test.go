package handler_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestPathCosts pins the AWS requests of each lifecycle path (the worker's
// receives and deletes belong to the event source mapping and are not
// counted). Write units follow from these plus the byState index writes
// listed in the README's cost table.
func TestPathCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	clk := &clock{}
	fail := true
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(_ context.Context, j *handler.Job[email]) error {
		if j.Args.To == "fails@example.com" && fail {
			return errors.New("down")
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return 0 }})
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Ledger: ledger.Options{Now: clk.Now}, MaxDelay: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := h.Producer()
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1})
	ctx := context.Background()
	step := stepper(t, counter)
	runOne := func() {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			if n, _ := p.Poll(ctx); n > 0 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no message")
	}
	put, upd, get, send := "DynamoDB.PutItem", "DynamoDB.UpdateItem", "DynamoDB.GetItem", "SQS.SendMessage"

	var sched enqueue.Result
	step("schedule 2 h: enqueue", []string{put, send}, func() {
		sched, err = c.Enqueue(ctx, email{To: "s@example.com"}, &enqueue.Opts{IdempotencyKey: "cost-s", Delay: 2 * time.Hour})
	})
	step("schedule 2 h: one hop carried forward", []string{send}, runOne)
	clk.Advance(2 * time.Hour)
	step("schedule 2 h: due, run", []string{upd, upd}, runOne)
	if r, _ := c.Store().Get(ctx, sched.ID); r.State != ledger.Succeeded {
		t.Fatalf("scheduled job is %s", r.State)
	}

	var parent, child enqueue.Result
	step("continuation: parent enqueue", []string{put, send}, func() { parent, _ = c.Enqueue(ctx, email{To: "p@example.com"}, nil) })
	step("continuation: add child", []string{get, "DynamoDB.TransactWriteItems"}, func() { child, _ = c.ContinueWith(ctx, parent.ID, email{To: "c@example.com"}, nil) })
	step("continuation: parent runs, child released", []string{upd, upd, upd, send}, runOne)
	step("continuation: child runs", []string{upd, upd}, runOne)
	if r, _ := c.Store().Get(ctx, child.ID); r.State != ledger.Succeeded {
		t.Fatalf("child is %s", r.State)
	}

	var failed enqueue.Result
	step("retry: enqueue", []string{put, send}, func() { failed, _ = c.Enqueue(ctx, email{To: "fails@example.com"}, &enqueue.Opts{MaxAttempts: 1}) })
	step("retry: fails for good", []string{upd, upd}, runOne)
	fail = false
	step("requeue", []string{upd, send}, func() { _, err = c.Requeue(ctx, failed.ID) })
	step("requeue: runs", []string{upd, upd}, runOne)
}

// stepper returns a function that runs do and checks the requests it
// made, counted by counter, against want.
func stepper(t *testing.T, counter *awstest.Counter) func(name string, want []string, do func()) {
	return func(name string, want []string, do func()) {
		t.Helper()
		counter.Reset()
		do()
		if got := counter.Calls(); !slices.Equal(got, want) {
			t.Errorf("%s: requests\n got %v\nwant %v", name, got, want)
		}
	}
}
