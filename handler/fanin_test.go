package handler_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// A fan-in of 5 parents: the child runs once, after all 5 Succeeded,
// although one parent's Finish reply was lost (its resend is recognised
// and it releases the child) and the child's count of another parent had
// its reply lost too (a set: counted once). Every parent ran once.
func TestFanInRunsOnceAfterEveryParent(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true, queue: fastQueue})
	parents, child := fanIn(t, r, 5)
	lostFinish := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, Match: func(b []byte) bool {
		return finishTo(ledger.Succeeded)(b) && bytes.Contains(b, []byte(parents[2]))
	}})
	lostCount := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, Match: func(b []byte) bool {
		return bytes.Contains(b, []byte(`"released"`)) && bytes.Contains(b, []byte(parents[3]))
	}})
	r.drain(t)
	if lostFinish.Fired() != 1 || lostCount.Fired() != 1 {
		t.Fatalf("faults fired: finish %d, count %d", lostFinish.Fired(), lostCount.Fired())
	}
	ranOnceAfterAll(t, r, parents, child.ID)
}

// A parent that fails ends the fan-in child as it ended, unrun; bad
// parents are refused with nothing written.
func TestFanInEndsWithAFailedParent(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Args.To == "bad@example.com" {
			return handler.Permanent(errors.New("mailbox gone"))
		}
		return nil
	}, nil)
	ctx := context.Background()
	good, bad := r.enqueue(t, email{To: "good@example.com"}, nil), r.enqueue(t, email{To: "bad@example.com"}, nil)
	child, err := r.prod.ContinueWhenAll(ctx, []string{good, bad}, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	if got := r.get(t, child.ID); got.State != ledger.Failed || r.runs(child.ID) != 0 {
		t.Fatalf("child %s after %d runs; want Failed, unrun", got.State, r.runs(child.ID))
	}
	var ended *enqueue.ParentEndedError
	if _, err := r.prod.ContinueWhenAll(ctx, []string{good, bad}, email{To: "late@example.com"}, nil); !errors.As(err, &ended) || ended.ParentID != bad {
		t.Fatalf("a Failed parent: %v, want a *ParentEndedError naming it", err)
	}
	for _, ps := range [][]string{{good}, {good, good}, {good, "aaaaaaaaaaaaaaaaaaaaaaaaaa"}} {
		if _, err := r.prod.ContinueWhenAll(ctx, ps, email{To: "x@example.com"}, nil); !errors.Is(err, enqueue.ErrInvalidInput) {
			t.Errorf("parents %v: %v, want an *InputError", ps, err)
		}
	}
	// Both parents Succeeded before the call: the child is released at once.
	other := r.enqueue(t, email{To: "other@example.com"}, nil)
	r.drain(t)
	late, err := r.prod.ContinueWhenAll(ctx, []string{good, other}, email{To: "after@example.com"}, nil)
	if err != nil || late.State != ledger.Enqueued {
		t.Fatalf("parents already done: %+v %v, want it Enqueued", late, err)
	}
	r.drain(t)
	expect(t, r.get(t, late.ID), ledger.Succeeded, 1, "")
}

// The requests of a fan-in of two parents and their units, pinned
// (docs/costs.md's table): the call (the parents' consistent reads, 1
// read unit each, then the child and its two links in one transaction,
// the child AwaitingContinuation in the index); each parent's success
// (its claim and finish, then the child's failed single-parent release
// and its count; the last parent's release and send); the child's run.
func TestFanInCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](ok), nil)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := h.Producer()
	ctx := context.Background()
	a, _ := c.Enqueue(ctx, email{To: "a@example.com"}, nil)
	b, _ := c.Enqueue(ctx, email{To: "b@example.com"}, nil)
	e.Purge(t, e.QueueURL) // the parents' messages are handed in below, one at a time
	upd, get, send := "DynamoDB.UpdateItem", "DynamoDB.GetItem", "SQS.SendMessage"
	step := meterStep(t, meter)
	type u = awstest.Units
	run := func(id string) {
		ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: id, ReceiptHandle: "not-a-receipt", Body: enqueue.Message{V: 1, ID: id, Kind: "email"}.Encode()}}}
		if resp, err := h.Handle(ctx, ev); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("job %s: %+v %v", id, resp, err)
		}
	}
	var child enqueue.Result
	step("ContinueWhenAll of two", []string{get, get, "DynamoDB.TransactWriteItems"}, u{Write: 6, Index: 1, Read: 2}, func() {
		child, err = c.ContinueWhenAll(ctx, []string{a.ID, b.ID}, email{To: "child@example.com"}, nil)
		if err != nil {
			t.Fatal(err)
		}
	})
	step("the first parent", []string{upd, upd, upd, upd}, u{Write: 4}, func() { run(a.ID) })
	step("the last parent", []string{upd, upd, upd, upd, upd, send}, u{Write: 5, Index: 1, Sends: 1}, func() { run(b.ID) })
	step("the child", []string{upd, upd}, u{Write: 2}, func() { run(child.ID) })
	if got := e.Get(t, child.ID); got.State != ledger.Succeeded {
		t.Fatalf("child %s", got.State)
	}
}

// TestFanInCountThrottledPastTheRetries: a parent's count into the
// child's set throttled past the SDK's retries (the parent already
// Succeeded) is not lost: the parent's message comes back, its delivery
// counts it, and the child runs once, after every parent, each parent
// having run once.
func TestFanInCountThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true, queue: fastQueue})
	parents, child := fanIn(t, r, 3)
	throttled := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts, Match: func(b []byte) bool {
		return bytes.Contains(b, []byte(`"released"`)) && bytes.Contains(b, []byte(parents[1]))
	}})
	r.drain(t)
	if throttled.Fired() != faults.Attempts {
		t.Fatalf("the count's throttle fired %d times", throttled.Fired())
	}
	ranOnceAfterAll(t, r, parents, child.ID)
}

// fanIn enqueues n parents and a child of all of them (ContinueWhenAll),
// waiting.
func fanIn(t *testing.T, r *rig, n int) (parents []string, child enqueue.Result) {
	t.Helper()
	for i := range n {
		parents = append(parents, r.enqueue(t, email{To: fmt.Sprintf("parent-%d@example.com", i)}, nil))
	}
	child, err := r.prod.ContinueWhenAll(context.Background(), parents, email{To: "child@example.com"}, nil)
	if err != nil || child.State != ledger.AwaitingContinuation {
		t.Fatalf("ContinueWhenAll: %+v %v", child, err)
	}
	return parents, child
}

// ranOnceAfterAll: every parent Succeeded after one run, and the fan-in
// child Succeeded after one run with every parent counted.
func ranOnceAfterAll(t *testing.T, r *rig, parents []string, child string) {
	t.Helper()
	for _, p := range parents {
		expect(t, r.get(t, p), ledger.Succeeded, 1, "")
		if n := r.runs(p); n != 1 {
			t.Fatalf("parent %s ran %d times", p, n)
		}
	}
	got := r.get(t, child)
	expect(t, got, ledger.Succeeded, 1, "")
	if n := r.runs(child); n != 1 || len(got.Released) != len(parents) {
		t.Fatalf("the child ran %d times with %d parents counted; want once, %d", n, len(got.Released), len(parents))
	}
}
