package handler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// A debounced burst of 5 from its first enqueue to its run: the window
// (the pointer's read, the pointer and the job in one transaction, the
// send), 4 folds (a read and an UpdateItem each: the job's run moves, so
// its index entry moves too), then the window's message comes at the old
// run time: a failed claim (the run moved later) and a re-send, and at the
// new run time the claim and the finish. 11 write units + 10 index, 5
// read units, 2 sends; the enqueues alone 8 write units + 9 index, 5
// read units, 1 send; the failed claim and the re-send are what a burst
// with folds adds.
func TestDebouncedBurstCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	clk := stillClock() // the fold's run time, not the machine's speed, decides what is due
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](ok), nil)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Ledger: ledger.Options{Now: clk.Now}, MaxDelay: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := h.Producer()
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: time.Second})
	ctx := context.Background()
	step := meterStep(t, meter)
	runOne := func() { pollOne(t, p) }
	get, upd := "DynamoDB.GetItem", "DynamoDB.UpdateItem"
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "burst", Period: time.Second}}
	var id string
	total := awstest.Units{}
	step("a new window", []string{get, "DynamoDB.TransactWriteItems", "SQS.SendMessage"}, awstest.Units{Write: 4, Index: 1, Read: 1, Sends: 1}, func() {
		res, err := c.Enqueue(ctx, email{To: "b0@example.com"}, db)
		if err != nil || res.Folded {
			t.Fatal(res, err)
		}
		id = res.ID
	})
	total = total.Add(meter.Units())
	for i := 1; i < 5; i++ {
		clk.Advance(100 * time.Millisecond)
		step("a fold", []string{get, upd}, awstest.Units{Write: 1, Index: 2, Read: 1}, func() {
			if res, err := c.Enqueue(ctx, email{To: "b@example.com"}, db); err != nil || !res.Folded || res.ID != id {
				t.Fatal(res, err)
			}
		})
		total = total.Add(meter.Units())
	}
	clk.Advance(700 * time.Millisecond) // past the window's first run time (1 s), before the folded one (1.4 s)
	step("the window's message at the old run time: a failed claim, a re-send", []string{upd, "SQS.SendMessage"}, awstest.Units{Write: 1, Sends: 1}, runOne)
	total = total.Add(meter.Units())
	clk.Advance(time.Second)
	step("the run", []string{upd, upd}, awstest.Units{Write: 2, Index: 1}, runOne)
	total = total.Add(meter.Units())
	if rec := e.Get(t, id); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("the debounced job: %s attempt %d", rec.State, rec.Attempt)
	}
	t.Logf("a burst of 5, from its first enqueue to its run: %v", total)
	if want := (awstest.Units{Write: 11, Index: 10, Read: 5, Sends: 2}); total != want {
		t.Errorf("the burst: %v, want %v", total, want)
	}
}
