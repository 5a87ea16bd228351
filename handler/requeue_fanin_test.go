package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// brokenFanIn is a fan-in child of a (which fails while broken) and b,
// after a drain: a Failed, b Succeeded, the child ended unrun.
func brokenFanIn(t *testing.T, rc rigConfig) (r *rig, broken *atomic.Bool, a, b, child string) {
	t.Helper()
	broken = new(atomic.Bool)
	broken.Store(true)
	r = newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if broken.Load() && j.Args.To == "a@example.com" {
			return handler.Permanent(errors.New("mailbox full"))
		}
		return nil
	}, rc)
	a = r.enqueue(t, email{To: "a@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	b = r.enqueue(t, email{To: "b@example.com"}, nil)
	res, err := r.prod.ContinueWhenAll(context.Background(), []string{a, b}, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, res.ID), ledger.Failed, 0, "parent job "+a+" ended Failed")
	return r, broken, a, b, res.ID
}

// TestRequeueOfAFanInChildFollowsItsParents: a fan-in child is requeued
// by the rule a single parent's child is. A parent Failed: refused,
// nothing written. That parent requeued: the child waits for it again
// (the other, Succeeded, counted) and runs once after it. A parent
// requeued after the child ran: the child's requeue waits for it, and
// runs after its new success. Every parent Succeeded: it runs at once.
func TestRequeueOfAFanInChildFollowsItsParents(t *testing.T) {
	t.Parallel()
	r, broken, a, b, child := brokenFanIn(t, rigConfig{})
	ctx := context.Background()
	var pns *enqueue.ParentNotSucceededError
	if _, err := r.prod.Requeue(ctx, child); !errors.As(err, &pns) || pns.ParentID != a || pns.ParentState != ledger.Failed {
		t.Fatalf("requeue of the fan-in child of a Failed parent: %v, want a *ParentNotSucceededError naming %s", err, a)
	}
	if got := r.get(t, child); got.State != ledger.Failed || r.runs(child) != 0 {
		t.Fatalf("the refused requeue changed the child: %s, %d runs", got.State, r.runs(child))
	}
	broken.Store(false)
	if _, err := r.prod.Requeue(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got := r.get(t, child); got.State != ledger.AwaitingContinuation || len(got.Released) != 1 || got.Released[0] != b {
		t.Fatalf("after its failed parent's requeue the child is %s with %v counted; want AwaitingContinuation, %s counted", got.State, got.Released, b)
	}
	r.drain(t)
	r.ranAs(t, child, ledger.Succeeded, 1, "", 1)

	// b requeued after the child ran: the child's requeue waits for it.
	if _, err := r.prod.Requeue(ctx, b); err != nil {
		t.Fatal(err)
	}
	res, err := r.prod.Requeue(ctx, child)
	if err != nil || res.State != ledger.AwaitingContinuation {
		t.Fatalf("requeue of the child while a parent runs again: %+v %v, want it AwaitingContinuation", res, err)
	}
	if got := r.get(t, child); len(got.Released) != 1 || got.Released[0] != a {
		t.Fatalf("the requeued child counts %v, want only %s", got.Released, a)
	}
	r.drain(t)
	r.ranAs(t, b, ledger.Succeeded, 1, "", 2)
	r.ranAs(t, child, ledger.Succeeded, 1, "", 2)

	// Every parent Succeeded: it runs again at once.
	if res, err := r.prod.Requeue(ctx, child); err != nil || res.State != ledger.Enqueued {
		t.Fatalf("requeue with every parent Succeeded: %+v %v", res, err)
	}
	r.drain(t)
	r.ranAs(t, child, ledger.Succeeded, 1, "", 3)
}

// isWaitAgain matches the transaction that puts a continuation back to
// waiting with its links: its first item an update to
// AwaitingContinuation.
func isWaitAgain(b []byte) bool {
	var tx struct {
		TransactItems []struct{ Update *updateBody }
	}
	_ = json.Unmarshal(b, &tx)
	return len(tx.TransactItems) > 1 && tx.TransactItems[0].Update != nil && tx.TransactItems[0].Update.setsState() == ledger.AwaitingContinuation
}

// TestWaitAgainReplyLost: the transaction that puts a requeued fan-in
// child back to waiting (its parent b runs again) is applied and its
// reply lost; the SDK's resend meets it (reply lost), or its resends are
// throttled past the retries and it is read back (then throttled): the
// requeue reads it as applied, and the child runs once after b.
func TestWaitAgainReplyLost(t *testing.T) {
	t.Parallel()
	for _, then := range []string{"reply lost", "then throttled"} {
		t.Run(then, func(t *testing.T) {
			t.Parallel()
			r, broken, a, b, child := brokenFanIn(t, rigConfig{})
			ctx := context.Background()
			broken.Store(false)
			if _, err := r.prod.Requeue(ctx, a); err != nil {
				t.Fatal(err)
			}
			r.drain(t)
			if _, err := r.prod.Requeue(ctx, b); err != nil {
				t.Fatal(err)
			}
			ft, prod := faultyProducer(t, r)
			lost := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Match: isWaitAgain, Fault: faults.LostReply})
			if then == "then throttled" {
				ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Match: isWaitAgain, Fault: faults.Throttle, Times: faults.Attempts - 1})
			}
			res, err := prod.Requeue(ctx, child)
			if err != nil || res.State != ledger.AwaitingContinuation {
				t.Fatalf("requeue with its write applied, reply lost: %+v %v", res, err)
			}
			fired(t, lost, 1)
			r.drain(t)
			r.ranAs(t, b, ledger.Succeeded, 1, "", 2)
			r.ranAs(t, child, ledger.Succeeded, 1, "", 2)
		})
	}
}

// TestWaitAgainThrottledPastTheRetries: that transaction throttled past
// the SDK's retries: the requeue of the child is an error and changes
// nothing; so is a parent's requeue that brings the child back (the
// parent is requeued all the same, the error says the child stays
// ended). Requeued again, the child waits, and runs once after its
// parents.
func TestWaitAgainThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	r, broken, a, b, child := brokenFanIn(t, rigConfig{})
	ctx := context.Background()
	broken.Store(false)
	ft, prod := faultyProducer(t, r)
	h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Match: isWaitAgain, Fault: faults.Throttle, Times: faults.Attempts})
	if _, err := prod.Requeue(ctx, a); err == nil {
		t.Fatal("the parent's requeue with the child's rewait throttled: no error")
	}
	fired(t, h, faults.Attempts)
	if got := r.get(t, child); got.State != ledger.Failed {
		t.Fatalf("the child is %s after a throttled rewait, want Failed as it was", got.State)
	}
	h = ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Match: isWaitAgain, Fault: faults.Throttle, Times: faults.Attempts})
	if _, err := prod.Requeue(ctx, child); err == nil {
		t.Fatal("the child's requeue throttled past the retries: no error")
	}
	fired(t, h, faults.Attempts)
	if got := r.get(t, child); got.State != ledger.Failed {
		t.Fatalf("the child is %s after its throttled requeue, want Failed as it was", got.State)
	}
	if res, err := prod.Requeue(ctx, child); err != nil || res.State != ledger.AwaitingContinuation {
		t.Fatalf("the child's requeue again: %+v %v", res, err)
	}
	r.drain(t)
	r.ranAs(t, a, ledger.Succeeded, 1, "mailbox full", 2)
	r.ranAs(t, b, ledger.Succeeded, 1, "", 1)
	r.ranAs(t, child, ledger.Succeeded, 1, "", 1)
}

// TestRequeueAllBringsBackAnEndedTree: a root's failure ended the whole
// tree below it (a continuation, its fan-in child, its keyed child and
// that one's child). `requeue-all --state Failed` lists all five in any
// order; each continuation is requeued after its parent, so every one
// waits again, none is refused, and once the root Succeeds the tree runs,
// each job once, after its parents.
func TestRequeueAllBringsBackAnEndedTree(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	broken.Store(true)
	r := newRig(t, func(ctx context.Context, j *handler.Job[email]) error {
		if broken.Load() {
			return failing(ctx, j)
		}
		return nil
	}, nil)
	root := r.enqueue(t, email{To: "fail@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	tr := growTree(t, r, root)
	r.drain(t)
	for _, id := range []string{tr.b, tr.fanIn, tr.keyed, tr.deep} {
		expect(t, r.get(t, id), ledger.Failed, 0, "parent job")
	}
	broken.Store(false)
	rep, err := newAdmin(t, r).RequeueAll(context.Background(), ledger.Filter{State: ledger.Failed}, nil)
	if err != nil || rep.Err() != nil || len(rep.Outcomes) != 5 {
		t.Fatalf("requeue-all: %d outcomes, %v %v; want 5, no error", len(rep.Outcomes), err, rep.Err())
	}
	r.drain(t)
	r.ranAs(t, root, ledger.Succeeded, 1, "mailbox gone", 2)
	for _, id := range []string{tr.b, tr.fanIn, tr.keyed, tr.deep} {
		r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
	}
}
