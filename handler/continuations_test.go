package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

// failing is a worker that fails for good the jobs sent to an address
// starting with "fail".
func failing(_ context.Context, j *handler.Job[email]) error {
	if strings.HasPrefix(j.Args.To, "fail") {
		return handler.Permanent(errors.New("mailbox gone"))
	}
	return nil
}

// newAdmin is the operator's view of the rig's deployment.
func newAdmin(t *testing.T, r *rig) *admin.Admin {
	t.Helper()
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRequeueAllOfAFanInChildWaitsForItsParents: parent a failed and
// ended the fan-in child of a and b, while b waits for its time (an hour
// ahead). `requeue-all --state Failed` requeues a and the child: the
// child must wait for both parents again, not run before b ever ran. Once
// b's hour comes, it runs once, after both.
func TestRequeueAllOfAFanInChildWaitsForItsParents(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	broken.Store(true)
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error {
		if broken.Load() && j.Args.To == "a@example.com" {
			return handler.Permanent(errors.New("mailbox full"))
		}
		return nil
	}, nil)
	ctx := context.Background()
	a := r.enqueue(t, email{To: "a@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	b := r.enqueue(t, email{To: "b@example.com"}, &enqueue.Opts{Delay: time.Hour})
	child, err := r.prod.ContinueWhenAll(ctx, []string{a, b}, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, child.ID), ledger.Failed, 0, "parent job "+a+" ended Failed")
	broken.Store(false)
	rep, err := newAdmin(t, r).RequeueAll(ctx, ledger.Filter{State: ledger.Failed}, nil)
	if err != nil || rep.Err() != nil {
		t.Fatalf("requeue-all: %v %v", err, rep.Err())
	}
	r.drain(t)
	if n := r.runs(child.ID); n != 0 {
		t.Fatalf("requeue-all ran the fan-in child %d times before its parent %s ever ran (%s)", n, b, r.get(t, b).State)
	}
	if got := r.get(t, child.ID); got.State != ledger.AwaitingContinuation {
		t.Fatalf("after requeue-all the fan-in child is %s, want AwaitingContinuation", got.State)
	}
	r.ranAs(t, a, ledger.Succeeded, 1, "mailbox full", 2)
	r.clock.Advance(time.Hour)
	r.drain(t)
	r.ranAs(t, b, ledger.Succeeded, 1, "", 1)
	r.ranAs(t, child.ID, ledger.Succeeded, 1, "", 1)
}

// tree is a parent and the continuations below it: b continues root;
// fanIn continues b and x (which Succeeds); keyed continues b holding the
// key "keyed-<root>"; deep continues keyed.
type tree struct {
	root, b, x, fanIn, keyed, deep, key string
}

func growTree(t *testing.T, r *rig, root string) tree {
	t.Helper()
	ctx := context.Background()
	tr := tree{root: root, key: "keyed-" + root}
	cont := func(parent, to string, o *enqueue.Opts) string {
		res, err := r.prod.ContinueWith(ctx, parent, email{To: to}, o)
		if err != nil || res.State != ledger.AwaitingContinuation {
			t.Fatalf("ContinueWith %s: %+v %v", to, res, err)
		}
		return res.ID
	}
	tr.b = cont(root, "b@example.com", nil)
	tr.x = r.enqueue(t, email{To: "x@example.com"}, nil)
	fan, err := r.prod.ContinueWhenAll(ctx, []string{tr.b, tr.x}, email{To: "fan-in@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.fanIn = fan.ID
	tr.keyed = cont(tr.b, "keyed@example.com", &enqueue.Opts{IdempotencyKey: tr.key})
	tr.deep = cont(tr.keyed, "deep@example.com", nil)
	return tr
}

// endedBelow: every continuation below the root ended unrun, Failed or
// as want, and the keyed one's key is free for a new job.
func (tr tree) endedBelow(t *testing.T, r *rig, want ledger.State) {
	t.Helper()
	for name, id := range map[string]string{"its continuation": tr.b, "the fan-in child below it": tr.fanIn, "the keyed child below it": tr.keyed, "the child of the keyed child": tr.deep} {
		rec := r.get(t, id)
		if (rec.State != want && rec.State != ledger.Failed) || rec.Attempt != 0 || r.runs(id) != 0 || rec.LastError == "" {
			t.Errorf("%s %s is %s after %d runs (%q); want it ended unrun as the root %s ended", name, id, rec.State, r.runs(id), rec.LastError, tr.root)
		}
	}
	r.ranAs(t, tr.x, ledger.Succeeded, 1, "", 1)
	res, err := r.prod.Enqueue(context.Background(), email{To: "keyed@example.com"}, &enqueue.Opts{IdempotencyKey: tr.key})
	if err != nil || res.Duplicate {
		t.Errorf("the keyed child's key: %+v %v; want it free for a new job", res, err)
	}
}

// TestEndingCascadesDownTheTree: whatever ends a job without success (a
// failed run, a deadline, the DLQ consumer, an operator's Cancel), every
// continuation below it ends too, however deep: a fan-in child of its
// continuation, a keyed child (its key freed), that one's own child.
func TestEndingCascadesDownTheTree(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		want ledger.State
		opts func(r *rig) *enqueue.Opts
		end  func(t *testing.T, r *rig, root string)
	}{
		{"a failed run", ledger.Failed, func(*rig) *enqueue.Opts { return &enqueue.Opts{MaxAttempts: 1} }, func(*testing.T, *rig, string) {}},
		{"a deadline", ledger.Expired, func(r *rig) *enqueue.Opts { return &enqueue.Opts{Deadline: r.clock.Now().Add(time.Minute)} },
			func(_ *testing.T, r *rig, _ string) { r.clock.Advance(2 * time.Minute) }},
		{"the DLQ consumer", ledger.Failed, func(*rig) *enqueue.Opts { return &enqueue.Opts{MaxAttempts: 1} },
			func(t *testing.T, r *rig, root string) {
				if _, err := r.prod.Store().Claim(context.Background(), root, time.Minute); err != nil { // the run that died
					t.Fatal(err)
				}
				r.clock.Advance(time.Hour)
				m := events.SQSMessage{MessageId: root, Body: enqueue.Message{V: 1, ID: root, Kind: "email"}.Encode(), Attributes: map[string]string{"ApproximateReceiveCount": "5"}}
				if resp, err := r.h.HandleDeadLetters(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m}}); err != nil || len(resp.BatchItemFailures) != 0 {
					t.Fatalf("dead letter: %+v %v", resp, err)
				}
			}},
		{"an operator's Cancel", ledger.Failed, func(*rig) *enqueue.Opts { return &enqueue.Opts{Delay: time.Hour} },
			func(t *testing.T, r *rig, root string) {
				if _, err := newAdmin(t, r).Cancel(context.Background(), root, "not wanted"); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, failing, nil)
			root := r.enqueue(t, email{To: "fail@example.com"}, c.opts(r))
			tr := growTree(t, r, root)
			c.end(t, r, root)
			r.drain(t)
			if st := r.get(t, root).State; st != c.want {
				t.Fatalf("the root is %s, want %s", st, c.want)
			}
			tr.endedBelow(t, r, c.want)
		})
	}
}

// TestDeleteOfAParentEndsItsWaitingChildren: deleting a parent that has
// not run ends every continuation waiting on it, down the tree, and frees
// a keyed one's key; the parent's record is gone.
func TestDeleteOfAParentEndsItsWaitingChildren(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	root := r.enqueue(t, email{To: "later@example.com"}, &enqueue.Opts{Delay: time.Hour})
	tr := growTree(t, r, root)
	if err := newAdmin(t, r).Delete(context.Background(), root); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	if _, err := r.prod.Store().Get(context.Background(), root); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the deleted parent: %v, want ErrNotFound", err)
	}
	tr.endedBelow(t, r, ledger.Failed)
}
