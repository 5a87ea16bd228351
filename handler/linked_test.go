package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// producerOps are the requests a producer makes.
var producerOps = []string{"DynamoDB.GetItem", "DynamoDB.PutItem", "DynamoDB.UpdateItem", "DynamoDB.DeleteItem",
	"DynamoDB.TransactWriteItems", "SQS.SendMessage"}

// killAt kills the goroutine that makes the n-th request (from 1) through
// ft, as a process killed there: before the request is sent, or once it
// was applied (applied), before its reply is read. killed is closed when
// it happened; the goroutine makes no request after that.
func killAt(ft *faults.Transport, n int, applied bool) (killed <-chan struct{}) {
	var seen atomic.Int32
	ch := make(chan struct{})
	fault := faults.Throttle // not forwarded
	if applied {
		fault = faults.Pass
	}
	for _, op := range producerOps {
		ft.Add(faults.Rule{Op: op, Fault: fault,
			Match: func([]byte) bool { return seen.Add(1) == int32(n) },
			After: func() { close(ch); runtime.Goexit() }})
	}
	return ch
}

// TestNoKillStrandsAContinuation: a producer killed at any request of a
// ContinueWith or a ContinueWhenAll (before the request is sent, or once
// it was applied) leaves no child waiting for ever: once every parent
// Succeeded, each child that the killed calls left is Succeeded after
// one run, or ended saying why, never AwaitingContinuation.
func TestNoKillStrandsAContinuation(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ctx := context.Background()
	calls := []struct {
		name    string
		parents int
		do      func(c *enqueue.Client, parents []string, args email) error
	}{
		{"ContinueWith", 1, func(c *enqueue.Client, parents []string, args email) error {
			_, err := c.ContinueWith(ctx, parents[0], args, nil)
			return err
		}},
		{"ContinueWhenAll", 2, func(c *enqueue.Client, parents []string, args email) error {
			_, err := c.ContinueWhenAll(ctx, parents, args, nil)
			return err
		}},
	}
	where := map[string]string{} // a child's To → where its call was killed
	for _, call := range calls {
		for _, applied := range []bool{false, true} {
			for n := 1; ; n++ {
				if n > 20 {
					t.Fatalf("%s: still killed at its 20th request", call.name)
				}
				ft, cfg := r.e.Faulty()
				prod, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quiet, Ledger: ledger.Options{Now: r.clock.Now}})
				if err != nil {
					t.Fatal(err)
				}
				var parents []string
				for i := range call.parents {
					parents = append(parents, r.enqueue(t, email{To: fmt.Sprintf("parent-%d@example.com", i)}, nil))
				}
				args := email{To: fmt.Sprintf("%s-%d-%v@example.com", call.name, n, applied)}
				where[args.To] = fmt.Sprintf("%s killed at its request %d (applied: %v)", call.name, n, applied)
				killed := killAt(ft, n, applied)
				returned := make(chan error, 1)
				go func() { returned <- call.do(prod, parents, args) }()
				var done bool
				select {
				case <-killed:
				case err := <-returned: // made fewer than n requests
					if err != nil {
						t.Fatalf("%s with no kill: %v", call.name, err)
					}
					done = true
				}
				if done {
					break
				}
			}
		}
	}
	r.drain(t)
	children := 0
	for _, rec := range r.e.Records(t) {
		if rec.ParentID == "" && len(rec.Parents) == 0 {
			continue
		}
		children++
		var args email
		_ = json.Unmarshal([]byte(rec.Args), &args)
		switch {
		case rec.State == ledger.AwaitingContinuation:
			t.Errorf("%s: its child %s is AwaitingContinuation after every parent Succeeded", where[args.To], rec.ID)
		case rec.State == ledger.Succeeded && r.runs(rec.ID) != 1:
			t.Errorf("%s: its child %s Succeeded after %d runs", where[args.To], rec.ID, r.runs(rec.ID))
		case rec.State != ledger.Succeeded && (rec.LastError == "" || r.runs(rec.ID) != 0):
			t.Errorf("%s: its child %s is %s after %d runs, saying %q", where[args.To], rec.ID, rec.State, r.runs(rec.ID), rec.LastError)
		}
	}
	if children == 0 {
		t.Fatal("no call wrote a child")
	}
}

// continuationCalls are ContinueWith and ContinueWhenAll, each with its
// number of parents.
var continuationCalls = []struct {
	name    string
	parents int
	do      func(c *enqueue.Client, parents []string, args email) (enqueue.Result, error)
}{
	{"ContinueWith", 1, func(c *enqueue.Client, parents []string, args email) (enqueue.Result, error) {
		return c.ContinueWith(context.Background(), parents[0], args, nil)
	}},
	{"ContinueWhenAll", 3, func(c *enqueue.Client, parents []string, args email) (enqueue.Result, error) {
		return c.ContinueWhenAll(context.Background(), parents, args, nil)
	}},
}

// TestContinuationWriteReplyLost: the transaction that writes a child and
// its links is applied and its reply lost, then the SDK's resend meets
// it (reply lost), or its resends are throttled past the retries (then
// throttled): either way the call reads its own child and returns it,
// created; it runs once, after every parent.
func TestContinuationWriteReplyLost(t *testing.T) {
	t.Parallel()
	for _, call := range continuationCalls {
		for _, then := range []string{"reply lost", "then throttled"} {
			t.Run(call.name+" "+then, func(t *testing.T) {
				t.Parallel()
				r := newRig(t, ok, nil)
				ft, prod := faultyProducer(t, r)
				var parents []string
				for i := range call.parents {
					parents = append(parents, r.enqueue(t, email{To: fmt.Sprintf("parent-%d@example.com", i)}, nil))
				}
				lost := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.LostReply})
				if then == "then throttled" {
					ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: faults.Attempts - 1})
				}
				res, err := call.do(prod, parents, email{To: "child@example.com"})
				if err != nil || res.Duplicate || res.State != ledger.AwaitingContinuation {
					t.Fatalf("%s with its write applied, reply lost: %+v %v; want the child, created", call.name, res, err)
				}
				fired(t, lost, 1)
				for _, p := range parents {
					if got := r.get(t, p); len(got.Children) != 1 || got.Children[0] != res.ID {
						t.Fatalf("parent %s counts %v, want the child %s", p, got.Children, res.ID)
					}
				}
				r.drain(t)
				ranAfter(t, r, parents, res.ID)
			})
		}
	}
}

// TestContinuationWriteThrottledPastTheRetries (the short soak's seed 2
// found the link of separate writes throttled, the child left waiting):
// the transaction throttled past the SDK's retries is an error, and
// nothing is written, neither the child nor a link; the caller's retry
// makes a child that runs once, after every parent.
func TestContinuationWriteThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	for _, call := range continuationCalls {
		t.Run(call.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, ok, nil)
			ft, prod := faultyProducer(t, r)
			var parents []string
			for i := range call.parents {
				parents = append(parents, r.enqueue(t, email{To: fmt.Sprintf("parent-%d@example.com", i)}, nil))
			}
			h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: faults.Attempts})
			if res, err := call.do(prod, parents, email{To: "child@example.com"}); err == nil {
				t.Fatalf("%s throttled past the retries: %+v, want an error", call.name, res)
			}
			fired(t, h, faults.Attempts)
			for _, rec := range r.e.Records(t) {
				if rec.ParentID != "" || len(rec.Parents) > 0 || len(rec.Children) > 0 {
					t.Fatalf("the failed call wrote %s (%s, children %v)", rec.ID, rec.State, rec.Children)
				}
			}
			res, err := call.do(prod, parents, email{To: "child@example.com"})
			if err != nil {
				t.Fatal(err)
			}
			r.drain(t)
			ranAfter(t, r, parents, res.ID)
		})
	}
}

// ranAfter is ranOnceAfterAll for a fan-in child, and for a single
// parent's: each parent ran once and Succeeded, the child after it, once.
func ranAfter(t *testing.T, r *rig, parents []string, child string) {
	t.Helper()
	if len(parents) > 1 {
		ranOnceAfterAll(t, r, parents, child)
		return
	}
	r.ranAs(t, parents[0], ledger.Succeeded, 1, "", 1)
	r.ranAs(t, child, ledger.Succeeded, 1, "", 1)
}
