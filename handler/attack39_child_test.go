package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Attacks on child jobs' promises (docs/durable-jobs.md "Child jobs with
// results"; go doc handler.Invoke, InvokeAsync, Await, AwaitAll).

// kid39 is the child kind's work: "" returns kid-N; "sleep" sleeps H hours
// first; "fail" fails (not permanently); "invoke" invokes a grandchild
// (N+100) that sleeps H hours and returns its result.
func kid39(r **rig39) func(ctx context.Context, j *handler.Job[a39Kid]) (string, error) {
	return func(ctx context.Context, j *handler.Job[a39Kid]) (string, error) {
		switch j.Args.Mode {
		case "sleep":
			if err := handler.Sleep(ctx, "nap", time.Duration(j.Args.H)*time.Hour); err != nil {
				return "", err
			}
		case "fail":
			(*r).call("kid %d", j.Args.N)
			return "", fmt.Errorf("kid %d broke", j.Args.N)
		case "invoke":
			v, err := handler.Invoke[string](ctx, "grand", a39Kid{N: j.Args.N + 100, Mode: "sleep", H: j.Args.H}, &handler.InvokeOptions{Timeout: 48 * time.Hour})
			if err != nil {
				return "", err
			}
			(*r).call("kid %d", j.Args.N)
			return "via-" + v, nil
		}
		(*r).call("kid %d", j.Args.N)
		return fmt.Sprint("kid-", j.Args.N), nil
	}
}

// childID is the id of the child the caller started under name.
func childID(t *testing.T, r *rig39, caller, name string) string {
	t.Helper()
	v, ok := r.e.Get(t, caller).Steps[ledger.InvokeStep(name)]
	if !ok {
		t.Fatalf("caller %s started no child %q", caller, name)
	}
	var id string
	if err := json.Unmarshal([]byte(v), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

type awaitOut struct {
	vals []string
	err  error
}

// awaitRig: a caller that starts one child per kid (names given) and
// awaits them all for wait; what each run's AwaitAll returned is kept.
func awaitRig(t *testing.T, names []string, kids []a39Kid, wait time.Duration, io *handler.InvokeOptions) (*rig39, *sync.Mutex, *[]awaitOut) {
	var mu sync.Mutex
	var outs []awaitOut
	var r *rig39
	r = newRig39(t, rig39Opts{kid: kid39(&r), work: func(ctx context.Context, j *handler.Job[a39]) error {
		r.call("caller")
		var cs []handler.Child
		for i, k := range kids {
			c, err := handler.InvokeAsync(ctx, names[i], k, io)
			if err != nil {
				return err
			}
			cs = append(cs, c)
		}
		vals, err := handler.AwaitAll[string](ctx, cs, wait)
		if handler.IsSleep(err) {
			return err
		}
		mu.Lock()
		outs = append(outs, awaitOut{vals, err})
		mu.Unlock()
		return nil
	}})
	return r, &mu, &outs
}

// "AwaitAll returns the results in the children's order", children ending
// in the reverse order, one failing (its attempts spent) and one whose
// wait ends first: the successes set, a *ChildrenError listing the others
// in the children's order (a *ChildFailedError with its last error, a
// *ChildTimeoutError). Names with every printable ASCII character.
func TestAttack39AwaitAllOrderAndErrors(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for c := byte(' '); c <= '~'; c++ {
		b.WriteByte(c)
	}
	all := b.String()
	names := []string{all, "b", all[:50], "d", "e"}
	kids := []a39Kid{{N: 0, Mode: "sleep", H: 4}, {N: 1, Mode: "fail"}, {N: 2, Mode: "sleep", H: 2}, {N: 3, Mode: "sleep", H: 30}, {N: 4}}
	r, mu, outs := awaitRig(t, names, kids, 10*time.Hour, &handler.InvokeOptions{Enqueue: enqueue.Opts{MaxAttempts: 1}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	for range 12 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Hour+time.Minute)
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Succeeded || len(*outs) != 1 {
		t.Fatalf("caller %s (%s), %d ends of its wait", rec.State, rec.LastError, len(*outs))
	}
	o := (*outs)[0]
	want := []string{"kid-0", "", "kid-2", "", "kid-4"}
	for i, w := range want {
		if len(o.vals) != 5 || o.vals[i] != w {
			t.Fatalf("promise \"AwaitAll returns the results in the children's order\": %q, want %q", o.vals, want)
		}
	}
	var ce *handler.ChildrenError
	if !errors.As(o.err, &ce) || len(ce.Errs) != 2 {
		t.Fatalf("promise: a *ChildrenError lists the others: %v", o.err)
	}
	var failed *handler.ChildFailedError
	var late *handler.ChildTimeoutError
	if !errors.As(ce.Errs[0], &failed) || failed.Child.Name != "b" || failed.State != ledger.Failed || !strings.Contains(failed.Err, "kid 1 broke") {
		t.Errorf("promise \"a child that failed ... is a *ChildFailedError (its state and last error)\", in order: %v", ce.Errs[0])
	}
	if !errors.As(ce.Errs[1], &late) || late.Child.Name != "d" {
		t.Errorf("promise \"a wait that ended first a *ChildTimeoutError\", in order: %v", ce.Errs[1])
	}
	for i := range 5 {
		if i != 3 && r.n("kid %d", i) != 1 {
			t.Errorf("kid %d ran %d times, want once", i, r.n("kid %d", i))
		}
	}
	// "A timeout is recorded in the child's place: the child goes on, and
	// its later end is not read."
	for range 20 {
		r.e.Advance(t, time.Hour+time.Minute)
		r.e.Drain(t, r.h)
	}
	d := r.e.Get(t, childID(t, r, id, "d"))
	if d.State != ledger.Succeeded || r.n("kid 3") != 1 {
		t.Errorf("promise \"the child goes on\": the timed-out child d is %s (%s), ran %d times", d.State, d.LastError, r.n("kid 3"))
	}
}

// "The child is enqueued under a key made of the caller's id and the
// name": the child's enqueue and its start's record with their replies
// lost (applied, then 500), the caller's message delivered again while it
// runs: one child each, each run once, the caller's attempt unspent.
func TestAttack39InvokeOnceUnderLostRepliesAndDuplicates(t *testing.T) {
	t.Parallel()
	r, mu, outs := awaitRig(t, []string{"a", "b", "c"}, []a39Kid{{N: 0}, {N: 1}, {N: 2}}, 24*time.Hour, nil)
	lostSend := r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.LostReply, Times: 3,
		Match: func(b []byte) bool { return strings.Contains(string(b), "a39-kid") }})
	lostStep := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.LostReply,
		Match: func(b []byte) bool { return strings.Contains(string(b), ledger.InvokeStep("b")) }})
	lostTx := r.ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.LostReply,
		Match: func(b []byte) bool { return strings.Contains(string(b), "a39-kid") }})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	ctx := context.Background()
	for k := range 3 {
		r.deliver(ctx, id, "a39", fmt.Sprint("dup", k))
	}
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	t.Logf("lost replies: %d sends, %d step records, %d transactions", lostSend.Fired(), lostStep.Fired(), lostTx.Fired())
	kids := 0
	for _, x := range r.e.Scan(t) {
		if x.Kind == "a39-kid" {
			kids++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if kids != 3 {
		t.Fatalf("promise \"the child is enqueued once\" (a key of the caller's id and the name): %d children", kids)
	}
	if rec.State != ledger.Succeeded || rec.Attempt != 1 || len(*outs) != 1 || (*outs)[0].err != nil {
		t.Fatalf("caller %s at attempt %d (%s), outcomes %v", rec.State, rec.Attempt, rec.LastError, *outs)
	}
	for i := range 3 {
		if r.n("kid %d", i) != 1 || (*outs)[0].vals[i] != fmt.Sprint("kid-", i) {
			t.Errorf("kid %d ran %d times, read %q", i, r.n("kid %d", i), (*outs)[0].vals[i])
		}
	}
}

// "Cancelling a job ... cancels the children it started that have not
// ended, and theirs; each tells the caller it ended": a caller waiting on
// a child that waits on a grandchild asleep.
func TestAttack39CancelReachesGrandchildren(t *testing.T) {
	t.Parallel()
	r, _, _ := awaitRig(t, []string{"k"}, []a39Kid{{N: 0, Mode: "invoke", H: 5}}, 24*time.Hour, nil)
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	for range 3 {
		r.e.Drain(t, r.h)
	}
	kid := childID(t, r, id, "k")
	grand := childID(t, r, kid, "grand")
	if g := r.e.Get(t, grand); g.State.Terminal() {
		t.Fatalf("the grandchild is %s before the cancel", g.State)
	}
	_, cerr := r.e.Client.Cancel(context.Background(), id, "", 0)
	r.e.Drain(t, r.h)
	r.e.Advance(t, 6*time.Hour)
	r.e.Drain(t, r.h)
	rec, k, g := r.e.Get(t, id), r.e.Get(t, kid), r.e.Get(t, grand)
	if rec.State != ledger.Failed || !rec.Cancelled {
		t.Fatalf("caller %s cancelled=%v (Cancel: %v)", rec.State, rec.Cancelled, cerr)
	}
	if k.State != ledger.Failed || !k.Cancelled || g.State != ledger.Failed || !g.Cancelled || r.n("kid 100") != 0 {
		t.Fatalf("promise \"cancels the children it started that have not ended, and theirs\": child %s cancelled=%v, grandchild %s cancelled=%v (ran %d times)", k.State, k.Cancelled, g.State, g.Cancelled, r.n("kid 100"))
	}
	if o := rec.Steps[ledger.ChildStep(kid)]; !strings.Contains(o, `"cancelled":true`) {
		t.Errorf("promise \"each tells the caller it ended\": the child's end in the caller: %q", o)
	}
	if o := k.Steps[ledger.ChildStep(grand)]; !strings.Contains(o, `"cancelled":true`) {
		t.Errorf("promise \"each tells the caller it ended\": the grandchild's end in the child: %q", o)
	}
}

// "A caller that fails for good, or whose wait times out, leaves its
// children running": a caller whose wait of an hour times out fails for
// good on it; its child, asleep for three, ends Succeeded all the same.
// "A deleted child tells its caller nothing: the wait times out."
func TestAttack39CallerFailsChildGoesOn(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var errs []error
	var r *rig39
	r = newRig39(t, rig39Opts{kid: kid39(&r), work: func(ctx context.Context, j *handler.Job[a39]) error {
		_, err := handler.Invoke[string](ctx, "k", a39Kid{N: j.Args.N, Mode: "sleep", H: 3}, &handler.InvokeOptions{Timeout: time.Hour})
		if handler.IsSleep(err) {
			return err
		}
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		if err != nil {
			return handler.Permanent(err)
		}
		return nil
	}})
	ctx := context.Background()
	goes := enqueueOne(t, r.e.Client, a39{N: 0}, nil)
	deleted := enqueueOne(t, r.e.Client, a39{N: 1}, nil)
	r.e.Drain(t, r.h)
	if err := r.e.Client.Delete(ctx, childID(t, r, deleted, "k")); err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	for range 4 {
		r.e.Advance(t, time.Hour+time.Minute)
		r.e.Drain(t, r.h)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 2 {
		t.Fatalf("%d callers read their wait: %v", len(errs), errs)
	}
	for _, err := range errs {
		var late *handler.ChildTimeoutError
		if !errors.As(err, &late) {
			t.Errorf("promise \"a deleted child tells its caller nothing: the wait times out\" / a wait that ended first: %v", err)
		}
	}
	for _, id := range []string{goes, deleted} {
		if rec := r.e.Get(t, id); rec.State != ledger.Failed {
			t.Errorf("caller %s: %s", id, rec.State)
		}
	}
	child := r.e.Get(t, childID(t, r, goes, "k"))
	if child.State != ledger.Succeeded || child.Cancelled || r.n("kid 0") != 1 {
		t.Errorf("promise \"a caller that fails for good ... leaves its children running\": the child is %s cancelled=%v, ran %d times", child.State, child.Cancelled, r.n("kid 0"))
	}
}

// A wait longer than MaxWait is refused with a *WaitTooLongError, as
// MaxWait's doc says of sleeps and waits; Invoke's zero Timeout is
// "MaxWait when zero": the child's result is read.
func TestAttack39AwaitOverMaxWaitAndInvokeZero(t *testing.T) {
	t.Parallel()
	t.Run("AwaitAll over MaxWait", func(t *testing.T) {
		t.Parallel()
		r, mu, outs := awaitRig(t, []string{"k"}, []a39Kid{{N: 0}}, handler.MaxWait+time.Hour, nil)
		enqueueOne(t, r.e.Client, a39{}, nil)
		r.e.Drain(t, r.h)
		mu.Lock()
		defer mu.Unlock()
		var long *handler.WaitTooLongError
		if len(*outs) != 1 || !errors.As((*outs)[0].err, &long) {
			t.Fatalf("a wait of MaxWait and an hour: %v, want a *WaitTooLongError", *outs)
		}
		t.Logf("refused: %v (Signal=%v)", long, long.Signal)
	})
	t.Run("Invoke with a zero Timeout", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var got []awaitOut
		var r *rig39
		r = newRig39(t, rig39Opts{kid: kid39(&r), work: func(ctx context.Context, j *handler.Job[a39]) error {
			v, err := handler.Invoke[string](ctx, "k", a39Kid{N: 0, Mode: "sleep", H: 2}, &handler.InvokeOptions{})
			if handler.IsSleep(err) {
				return err
			}
			mu.Lock()
			got = append(got, awaitOut{[]string{v}, err})
			mu.Unlock()
			return err
		}})
		id := enqueueOne(t, r.e.Client, a39{}, nil)
		r.e.Drain(t, r.h)
		r.e.Advance(t, 2*time.Hour+time.Minute)
		r.e.Drain(t, r.h)
		mu.Lock()
		defer mu.Unlock()
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || len(got) != 1 || got[0].vals[0] != "kid-0" {
			t.Fatalf("promise \"Timeout bounds Invoke's wait for the child: MaxWait when zero\": caller %s (%s), read %v", rec.State, rec.LastError, got)
		}
	})
}

// BREAK: "Await waits up to timeout (at most MaxWait) for child c's end
// ... a *ChildTimeoutError when the wait ended first" (go doc
// handler.Await; AwaitAll alike): a zero or negative timeout, within "at
// most MaxWait", is refused as a *WaitTooLongError ("wait for signal "k"
// of 0s is longer than the longest, 8784h0m0s"): the caller fails
// permanently where it should read the child or a *ChildTimeoutError.
func TestAttack39AwaitZeroTimeoutRefusedAsTooLong(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, -time.Hour} {
		t.Run(fmt.Sprint(wait), func(t *testing.T) {
			t.Parallel()
			r, mu, outs := awaitRig(t, []string{"k"}, []a39Kid{{N: 0}}, wait, nil)
			id := enqueueOne(t, r.e.Client, a39{}, nil)
			r.e.Drain(t, r.h)
			rec := r.e.Get(t, id)
			mu.Lock()
			defer mu.Unlock()
			if len(*outs) != 1 {
				t.Fatalf("caller %s (%s): %d reads", rec.State, rec.LastError, len(*outs))
			}
			o := (*outs)[0]
			var long *handler.WaitTooLongError
			var ce *handler.ChildrenError
			if errors.As(o.err, &long) {
				t.Fatalf("promise \"Await waits up to timeout (at most MaxWait)\": AwaitAll with a timeout of %s (not more than MaxWait) refused: %v", wait, o.err)
			}
			if o.err != nil && !errors.As(o.err, &ce) {
				t.Fatalf("AwaitAll with a timeout of %s: %v, want the result or a *ChildrenError", wait, o.err)
			}
		})
	}
}
