package handler_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// isEndForDelete matches the update that ends an active job before its
// record is deleted.
func isEndForDelete(b []byte) bool { return bytes.Contains(b, []byte("deleted by an operator")) }

// faultyProducer is a producer whose requests go through a fault
// transport of their own.
func faultyProducer(t *testing.T, r *rig) (*faults.Transport, *enqueue.Client) {
	t.Helper()
	ft, cfg := r.e.Faulty()
	prod, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quiet, Ledger: ledger.Options{Now: r.clock.Now}})
	if err != nil {
		t.Fatal(err)
	}
	return ft, prod
}

// TestDeleteEndAppliedThenThrottled: the update that ends the deleted
// parent is applied, its reply lost, and the SDK's resends throttled past
// its retries: read back, it is recognised as applied, and the delete
// goes on: the parent is gone, every continuation below it ended.
func TestDeleteEndAppliedThenThrottled(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	root := r.enqueue(t, email{To: "later@example.com"}, &enqueue.Opts{Delay: time.Hour})
	tr := growTree(t, r, root)
	ft, prod := faultyProducer(t, r)
	lost := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isEndForDelete, Fault: faults.LostReply})
	throttled := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isEndForDelete, Fault: faults.Throttle, Times: faults.Attempts - 1})
	if err := prod.Delete(context.Background(), root); err != nil {
		t.Fatalf("delete with its end applied, then throttled: %v", err)
	}
	fired(t, lost, 1)
	fired(t, throttled, faults.Attempts-1)
	r.drain(t)
	if _, err := r.prod.Store().Get(context.Background(), root); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the deleted parent: %v, want ErrNotFound", err)
	}
	tr.endedBelow(t, r, ledger.Failed)
}

// TestDeleteEndThrottledPastTheRetries: the update that ends the deleted
// parent is throttled past the SDK's retries: Delete returns the error
// and nothing changed (the parent and its continuations wait as they
// did); deleting it again settles the tree.
func TestDeleteEndThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	root := r.enqueue(t, email{To: "later@example.com"}, &enqueue.Opts{Delay: time.Hour})
	tr := growTree(t, r, root)
	ft, prod := faultyProducer(t, r)
	throttled := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isEndForDelete, Fault: faults.Throttle, Times: faults.Attempts})
	ctx := context.Background()
	if err := prod.Delete(ctx, root); err == nil {
		t.Fatal("delete with its end throttled past the retries: no error")
	}
	fired(t, throttled, faults.Attempts)
	if got, b := r.get(t, root), r.get(t, tr.b); got.State != ledger.Scheduled || b.State != ledger.AwaitingContinuation {
		t.Fatalf("after the failed delete: parent %s, its continuation %s; want both as they were", got.State, b.State)
	}
	if err := prod.Delete(ctx, root); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	if _, err := r.prod.Store().Get(ctx, root); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the deleted parent: %v, want ErrNotFound", err)
	}
	tr.endedBelow(t, r, ledger.Failed)
}

// TestDeleteOfAWaitingChildSettledByItsParentsSuccess: an operator deletes
// a continuation that still waits (it has no message), its end applies,
// and ending its own continuation is throttled past the SDK's retries:
// Delete returns the error and the deleted job stays Failed with a child
// waiting on it, which no message names. Its parent's success, meeting
// it ended, hands the ending on (its message), and the grandchild ends:
// nobody has to Delete again. The short soak (seed 2, beside a make
// test) left such a flow's fan-in child and a continuation of the same
// job AwaitingContinuation for good.
func TestDeleteOfAWaitingChildSettledByItsParentsSuccess(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ctx := context.Background()
	root := r.enqueue(t, email{To: "root@example.com"}, nil)
	cont := func(parent, to string) string {
		t.Helper()
		res, err := r.prod.ContinueWith(ctx, parent, email{To: to}, nil)
		if err != nil || res.State != ledger.AwaitingContinuation {
			t.Fatalf("ContinueWith %s: %+v %v", to, res, err)
		}
		return res.ID
	}
	mid := cont(root, "mid@example.com")
	leaf := cont(mid, "leaf@example.com")
	ft, prod := faultyProducer(t, r)
	throttled := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: func(b []byte) bool { return bytes.Contains(b, []byte("was deleted")) },
		Fault: faults.Throttle, Times: faults.Attempts})
	if err := prod.Delete(ctx, mid); err == nil {
		t.Fatal("delete with its child's end throttled past the retries: no error")
	}
	fired(t, throttled, faults.Attempts)
	if m, l := r.get(t, mid), r.get(t, leaf); m.State != ledger.Failed || l.State != ledger.AwaitingContinuation {
		t.Fatalf("after the failed delete: the deleted job %s, its child %s; want Failed, AwaitingContinuation", m.State, l.State)
	}
	r.drain(t) // the root runs and Succeeds
	if got := r.get(t, root); got.State != ledger.Succeeded {
		t.Fatalf("the root: %s, want Succeeded", got.State)
	}
	if l := r.get(t, leaf); l.State != ledger.Failed || l.Attempt != 0 {
		t.Fatalf("the deleted job's child: %s (attempt %d), want Failed unrun: waiting on a job that ended, for good", l.State, l.Attempt)
	}
	if n := r.runs(leaf) + r.runs(mid); n != 0 {
		t.Fatalf("%d runs of the deleted job and its child, want none", n)
	}
}
