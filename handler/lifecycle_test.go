package handler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

func ok(context.Context, *handler.Job[email]) error { return nil }

// TestTwoHourSchedule: a job two hours ahead waits as Scheduled, carried
// forward message by message (one-second hops here, 900 s on AWS) without a
// DynamoDB write or a receive count that could reach the DLQ, deduplicates
// like any active job, and runs once when the clock reaches it.
func TestTwoHourSchedule(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{queue: &awstest.QueueOptions{MaxReceiveCount: 1}})
	res, err := r.prod.Enqueue(context.Background(), email{To: "report@example.com"}, &enqueue.Opts{IdempotencyKey: "report-1", Delay: 2 * time.Hour})
	if err != nil || res.State != ledger.Scheduled {
		t.Fatalf("schedule: %+v %v", res, err)
	}
	dup, err := r.prod.Enqueue(context.Background(), email{To: "report@example.com"}, &enqueue.Opts{IdempotencyKey: "report-1", DuplicatePolicy: enqueue.RejectAlways})
	if err != nil || !dup.Duplicate || dup.ID != res.ID || dup.State != ledger.Scheduled {
		t.Fatalf("duplicate of a scheduled job: %+v %v", dup, err)
	}
	before := r.get(t, res.ID)
	r.pollFor(t, 3500*time.Millisecond) // at least two hops
	if r.calls.Load() != 0 {
		t.Fatal("ran before its time")
	}
	if after := r.get(t, res.ID); after.UpdatedAt != before.UpdatedAt || after.State != ledger.Scheduled {
		t.Fatalf("carrying forward wrote the record: %+v", after)
	}
	r.clock.Advance(2 * time.Hour)
	for end := time.Now().Add(30 * time.Second); r.get(t, res.ID).State != ledger.Succeeded; {
		if time.Now().After(end) {
			t.Fatalf("not run after the clock reached it: queue depth %d, DLQ depth %d",
				r.e.QueueDepth(t, r.e.QueueURL), r.e.QueueDepth(t, r.e.DLQURL))
		}
		r.pollFor(t, 200*time.Millisecond)
	}
	expect(t, r.get(t, res.ID), ledger.Succeeded, 1, "")
	if r.calls.Load() != 1 {
		t.Fatalf("ran %d times", r.calls.Load())
	}
	if n := r.e.QueueDepth(t, r.e.DLQURL); n != 0 {
		t.Fatalf("%d messages reached the DLQ", n)
	}
}

// TestThirtySecondDelay: within SQS's 900 s a single delayed message does
// it; the message is not visible before.
func TestThirtySecondDelay(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{hopts: &handler.Options{MaxDelay: enqueue.MaxSQSDelay}})
	start := time.Now()
	id := r.enqueue(t, email{To: "later@example.com"}, &enqueue.Opts{Delay: 30 * time.Second})
	if n, _ := r.poll.Poll(context.Background()); n != 0 {
		t.Fatal("the delayed message was visible at once")
	}
	r.drain(t)
	expect(t, r.get(t, id), ledger.Succeeded, 1, "")
	rec := r.get(t, id)
	if ran := ledger.Millis(rec.UpdatedAt); ran.Before(start.Add(29 * time.Second)) {
		t.Fatalf("ran %s after enqueue, before its 30 s delay", ran.Sub(start))
	}
}

func TestContinuationsReleasedOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ctx := context.Background()
	parent := r.enqueue(t, email{To: "parent@example.com"}, nil)
	var kids []string
	for i := range 3 {
		res, err := r.prod.ContinueWith(ctx, parent, email{To: fmt.Sprintf("child%d@example.com", i)}, &enqueue.Opts{IdempotencyKey: fmt.Sprintf("child-%d", i)})
		if err != nil || res.State != ledger.AwaitingContinuation {
			t.Fatalf("continue: %+v %v", res, err)
		}
		kids = append(kids, res.ID)
	}
	// A continuation's key deduplicates like any active job.
	dup, err := r.prod.ContinueWith(ctx, parent, email{To: "child0@example.com"}, &enqueue.Opts{IdempotencyKey: "child-0"})
	if err != nil || !dup.Duplicate || dup.ID != kids[0] {
		t.Fatalf("duplicate continuation: %+v %v", dup, err)
	}
	msgs := r.e.Messages(t, r.e.QueueURL) // only the parent's message so far
	if len(msgs) != 1 {
		t.Fatalf("%d messages before the parent ran, want 1", len(msgs))
	}
	// The parent's message, then the same message again (its completion
	// replayed): the children are released once.
	r.deliver(t, msgs, 2)
	r.drain(t)
	for _, k := range append(kids, parent) {
		expect(t, r.get(t, k), ledger.Succeeded, 1, "")
		if n := r.runs(k); n != 1 {
			t.Errorf("job %s ran %d times, want once", k, n)
		}
	}
}

func TestContinuationAfterParentSucceeded(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	parent := r.enqueue(t, email{To: "p@example.com"}, nil)
	r.drain(t)
	res, err := r.prod.ContinueWith(context.Background(), parent, email{To: "late@example.com"}, nil)
	if err != nil || res.State != ledger.Enqueued || res.Duplicate {
		t.Fatalf("late continuation: %+v %v", res, err)
	}
	r.drain(t)
	expect(t, r.get(t, res.ID), ledger.Succeeded, 1, "")
	if _, err := r.prod.ContinueWith(context.Background(), "aaaaaaaaaaaaaaaaaaaaaaaaaa", email{}, nil); !errors.Is(err, enqueue.ErrInvalidInput) {
		t.Fatalf("continuation of an unknown parent: %v", err)
	}
}

// TestFailedParentHookReleasesChildren: the dead-letter hook of a failed parent
// may release its children; they run (ended only if it does not).
func TestFailedParentHookReleasesChildren(t *testing.T) {
	t.Parallel()
	var r *rig
	release := make(chan struct{})
	r = newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Args.To == "parent@example.com" {
			return handler.Permanent(errors.New("parent broke"))
		}
		return nil
	}, rigConfig{hook: func(ctx context.Context, rec ledger.Record, _ error) error {
		<-release
		return r.prod.ReleaseContinuations(ctx, rec)
	}})
	parent := r.enqueue(t, email{To: "parent@example.com"}, nil)
	child, err := r.prod.ContinueWith(context.Background(), parent, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	r.drain(t)
	expect(t, r.get(t, parent), ledger.Failed, 1, "parent broke")
	expect(t, r.get(t, child.ID), ledger.Succeeded, 1, "") // released by the hook
}

// TestFailedParentChildrenEndWithIt: with no hook to release them, the
// children of a Failed parent end Failed, naming it (none waits forever
// holding its key).
func TestFailedParentChildrenEndWithIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error { return handler.Permanent(errors.New("no")) }, nil)
	parent := r.enqueue(t, email{To: "parent@example.com"}, nil)
	child, err := r.prod.ContinueWith(context.Background(), parent, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, parent), ledger.Failed, 1, "no")
	expect(t, r.get(t, child.ID), ledger.Failed, 0, "parent job "+parent+" ended Failed")
	if r.runs(child.ID) != 0 {
		t.Fatal("the child of a failed parent ran")
	}
}

func TestRequeue(t *testing.T) {
	t.Parallel()
	fail := true
	var mu sync.Mutex
	r := newRig(t, func(context.Context, *handler.Job[email]) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return handler.Permanent(errors.New("down"))
		}
		return nil
	}, nil)
	ctx := context.Background()
	failed := r.enqueue(t, email{To: "f@example.com"}, &enqueue.Opts{IdempotencyKey: "req-f"})
	r.drain(t)
	expect(t, r.get(t, failed), ledger.Failed, 1, "down")
	mu.Lock()
	fail = false
	mu.Unlock()
	succeeded := r.enqueue(t, email{To: "s@example.com"}, nil)
	r.drain(t)
	for _, id := range []string{failed, succeeded} {
		res, err := r.prod.Requeue(ctx, id)
		if err != nil || res.State != ledger.Enqueued {
			t.Fatalf("requeue %s: %+v %v", id, res, err)
		}
		rec := r.get(t, id)
		if rec.Attempt != 0 || rec.ExpiresAt != 0 {
			t.Fatalf("requeued record keeps its old budget or TTL: %+v", rec)
		}
	}
	// Requeued, the job is active: its key deduplicates to it.
	dup, err := r.prod.Enqueue(ctx, email{To: "f@example.com"}, &enqueue.Opts{IdempotencyKey: "req-f", DuplicatePolicy: enqueue.RejectIfFailed})
	if err != nil || !dup.Duplicate || dup.ID != failed {
		t.Fatalf("enqueue after requeue: %+v %v", dup, err)
	}
	var nt *enqueue.NotTerminalError
	if _, err := r.prod.Requeue(ctx, failed); !errors.As(err, &nt) {
		t.Fatalf("requeue of an active job: %v", err)
	}
	r.drain(t)
	expect(t, r.get(t, failed), ledger.Succeeded, 1, "down")
	expect(t, r.get(t, succeeded), ledger.Succeeded, 1, "")
	if r.runs(failed) != 2 || r.runs(succeeded) != 2 {
		t.Fatalf("runs: failed job %d, succeeded job %d; want 2 each", r.runs(failed), r.runs(succeeded))
	}
}

// TestRequeueRacesDuplicateEnqueue: a requeue and enqueues of the same key
// race on a Failed job; afterwards exactly one job is active for the key
// and every caller agrees which.
func TestRequeueRacesDuplicateEnqueue(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error { return handler.Permanent(errors.New("x")) }, nil)
	ctx := context.Background()
	for round := range 8 {
		key := fmt.Sprintf("race-%d", round)
		old := r.enqueue(t, email{To: "r@example.com"}, &enqueue.Opts{IdempotencyKey: key})
		r.drain(t)
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			ids       = map[string]bool{}
			requeued  bool
			requeueEr error
		)
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			_, err := r.prod.Requeue(ctx, old)
			mu.Lock()
			requeued, requeueEr = err == nil, err
			mu.Unlock()
		})
		for range 10 {
			wg.Go(func() {
				<-start
				res, err := r.prod.Enqueue(ctx, email{To: "r@example.com"}, &enqueue.Opts{IdempotencyKey: key})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("enqueue: %v", err)
					return
				}
				ids[res.ID] = true
			})
		}
		close(start)
		wg.Wait()
		if len(ids) != 1 {
			t.Fatalf("round %d: callers got %d ids", round, len(ids))
		}
		switch {
		case requeued && !ids[old]:
			t.Fatalf("round %d: requeue won but enqueues made a new job", round)
		case !requeued && (!errors.Is(requeueEr, ledger.ErrKeyReused) || ids[old]):
			t.Fatalf("round %d: requeue lost with %v; enqueues got the old id: %v", round, requeueEr, ids[old])
		}
		active := 0
		for _, rec := range r.e.Records(t) {
			if rec.KeyHash == r.prod.Store().HashKey(key) && rec.State.Active() {
				active++
			}
		}
		if active != 1 {
			t.Fatalf("round %d: %d active jobs hold the key", round, active)
		}
		r.drain(t)
	}
}

func TestDeadLetterHookOncePerFailedJob(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	hooked := map[string]int{}
	causes := map[string]error{}
	r := newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Args.To == "perm@example.com" {
			return handler.Permanent(errors.New("perm"))
		}
		return errors.New("transient")
	}, rigConfig{hook: func(_ context.Context, rec ledger.Record, cause error) error {
		mu.Lock()
		hooked[rec.ID]++
		causes[rec.ID] = cause
		n := len(hooked)
		mu.Unlock()
		if n == 1 {
			panic("a hook that panics must not block the batch")
		}
		return errors.New("a hook that fails is logged")
	}})
	ids := []string{
		r.enqueue(t, email{To: "perm@example.com"}, nil),
		r.enqueue(t, email{To: "a@example.com"}, &enqueue.Opts{MaxAttempts: 2}),
		r.enqueue(t, email{To: "b@example.com"}, &enqueue.Opts{MaxAttempts: 3}),
	}
	ok := r.enqueue(t, email{To: "never-fails@example.com"}, &enqueue.Opts{MaxAttempts: 1, Deadline: r.clock.Now().Add(time.Hour)})
	_ = ok
	r.drain(t)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if hooked[id] != 1 {
			t.Errorf("hook called %d times for %s", hooked[id], id)
		}
		if rec := r.get(t, id); rec.State != ledger.Failed {
			t.Errorf("%s is %s", id, rec.State)
		}
	}
	var perm *handler.PermanentError
	if !errors.As(causes[ids[0]], &perm) || causes[ids[1]] == nil || causes[ids[1]].Error() != "transient" {
		t.Errorf("hook causes: %v, %v", causes[ids[0]], causes[ids[1]])
	}
}

// TestRetentionFreesKey: a terminal record past its retention frees its
// key at once, although DynamoDB (and the emulator) have not deleted it.
func TestRetentionFreesKey(t *testing.T) {
	t.Parallel()
	fail := map[string]bool{"failed@example.com": true}
	r := newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if fail[j.Args.To] {
			return handler.Permanent(errors.New("bounced"))
		}
		return nil
	}, rigConfig{hopts: &handler.Options{Retention: &handler.Retention{Succeeded: time.Hour, Failed: 2 * time.Hour}}})
	ctx := context.Background()
	s := r.enqueue(t, email{To: "ok@example.com"}, &enqueue.Opts{IdempotencyKey: "ret-s"})
	f := r.enqueue(t, email{To: "failed@example.com"}, &enqueue.Opts{IdempotencyKey: "ret-f"})
	r.drain(t)
	if _, err := r.prod.Enqueue(ctx, email{To: "failed@example.com"}, &enqueue.Opts{IdempotencyKey: "ret-f", DuplicatePolicy: enqueue.RejectIfFailed}); err == nil {
		t.Fatal("a Failed job within retention did not reject under RejectIfFailed")
	}
	if _, err := r.prod.Enqueue(ctx, email{To: "ok@example.com"}, &enqueue.Opts{IdempotencyKey: "ret-s", DuplicatePolicy: enqueue.RejectAlways}); err == nil {
		t.Fatal("a Succeeded job within retention did not reject under RejectAlways")
	}
	r.clock.Advance(3 * time.Hour)
	for _, c := range []struct {
		key, old string
		policy   ledger.DuplicatePolicy
	}{
		{"ret-f", f, enqueue.RejectIfFailed}, // would reject within retention
		{"ret-s", s, enqueue.RejectAlways},   // would reject within retention (RejectIfFailed never rejects Succeeded)
	} {
		if _, err := r.prod.Store().Get(ctx, c.old); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("record past retention still readable: %v", err)
		}
		res, err := r.prod.Enqueue(ctx, email{To: "x@example.com"}, &enqueue.Opts{IdempotencyKey: c.key, DuplicatePolicy: c.policy})
		if err != nil || res.Duplicate || res.ID == c.old {
			t.Fatalf("%s under %s past retention: %+v %v", c.key, c.policy, res, err)
		}
	}
	// The rows are still physically there: the emulator never deletes.
	if n := len(r.e.Records(t)); n < 2 {
		t.Fatalf("%d records", n)
	}
}

func TestListFailedPaginated(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error { return handler.Permanent(errors.New("nope")) }, nil)
	var want []string
	for i := range 5 {
		want = append(want, r.enqueue(t, email{To: fmt.Sprintf("%d@example.com", i)}, nil))
		r.drain(t) // one at a time: a clear order of failure
		r.clock.Advance(time.Millisecond)
	}
	var got []string
	cursor, pages := "", 0
	for {
		recs, next, err := r.prod.Store().List(context.Background(), ledger.Failed, 2, cursor)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(recs) > 2 {
			t.Fatalf("page of %d", len(recs))
		}
		for _, rec := range recs {
			got = append(got, rec.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	for i, id := range got {
		if i >= len(want) || id != want[len(want)-1-i] {
			t.Fatalf("listed %v, want newest first %v", got, want)
		}
	}
	if len(got) != 5 || pages < 3 {
		t.Fatalf("listed %d jobs in %d pages", len(got), pages)
	}
	if _, _, err := r.prod.Store().List(context.Background(), ledger.Succeeded, 2, ""); !errors.Is(err, ledger.ErrNotIndexed) {
		t.Fatalf("listing Succeeded without IndexAllStates: %v", err)
	}
}

// TestAttemptHistory: the record keeps its last three runs' ends, newest
// first, written by the Finish that already happens (no extra request:
// one UpdateItem per claim and per finish); a success clears the last
// error, the history keeps the retries'; a requeue keeps the history.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	r := newRigWith(t, func(context.Context, *handler.Job[email]) error {
		if n := runs.Add(1); n <= 3 {
			return fmt.Errorf("smtp 451 (try %d)", n)
		}
		return nil
	}, rigConfig{faults: true})
	id := r.enqueue(t, email{To: "history@example.com"}, &enqueue.Opts{MaxAttempts: 3})
	r.drain(t)
	rec := r.get(t, id)
	got := rec.Attempts()
	if rec.State != ledger.Failed || len(got) != 3 || got[0].N != 3 || got[0].State != ledger.Failed || got[2].N != 1 || got[2].State != ledger.Scheduled ||
		!strings.Contains(got[1].Error, "try 2") || got[0].At < got[1].At {
		t.Fatalf("after three failed runs: %s %+v", rec.State, got)
	}
	if n := strings.Count(strings.Join(r.ft.Ops(), " "), "DynamoDB.UpdateItem"); n != 6 {
		t.Fatalf("%d UpdateItems for three runs, want 6 (a claim and a finish each)", n)
	}
	if _, err := r.prod.Requeue(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	rec = r.get(t, id)
	got = rec.Attempts()
	if rec.State != ledger.Succeeded || rec.LastError != "" || len(got) != 3 || got[0].State != ledger.Succeeded || got[0].Error != "" ||
		!strings.Contains(got[1].Error, "try 3") || !strings.Contains(got[2].Error, "try 2") {
		t.Fatalf("after the requeue's success: %s %q %+v", rec.State, rec.LastError, got)
	}
}

// TestRequeueAndContinuations: a Failed parent's child ends Failed
// ("parent ended"). Requeueing the child is refused while the parent has
// not succeeded (it ran the child for a parent that never succeeded);
// requeueing the parent brings the child back to waiting, and when the
// parent then Succeeds the child runs (it stayed Failed).
func TestRequeueAndContinuations(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	broken.Store(true)
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error {
		if broken.Load() && j.Args.To == "parent@example.com" {
			return handler.Permanent(errors.New("mailbox full"))
		}
		return nil
	}, nil)
	ctx := context.Background()
	parent := r.enqueue(t, email{To: "parent@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	child, err := r.prod.ContinueWith(ctx, parent, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, parent), ledger.Failed, 1, "mailbox full")
	expect(t, r.get(t, child.ID), ledger.Failed, 0, "parent job "+parent+" ended Failed")

	var pns *enqueue.ParentNotSucceededError
	if _, err := r.prod.Requeue(ctx, child.ID); !errors.As(err, &pns) || pns.ParentID != parent {
		t.Fatalf("requeue of the child of a Failed parent: %v", err)
	}
	if r.runs(child.ID) != 0 || r.get(t, child.ID).State != ledger.Failed {
		t.Fatal("the refused requeue changed the child")
	}

	broken.Store(false)
	if _, err := r.prod.Requeue(ctx, parent); err != nil {
		t.Fatal(err)
	}
	if st := r.get(t, child.ID).State; st != ledger.AwaitingContinuation {
		t.Fatalf("after the parent's requeue the child is %s, want AwaitingContinuation", st)
	}
	r.drain(t)
	r.ranAs(t, parent, ledger.Succeeded, 1, "mailbox full", 2)
	r.ranAs(t, child.ID, ledger.Succeeded, 1, "", 1)
}

// TestRewaitUnderFaults: requeueing a parent puts its ended child back to
// waiting; that write applied with its reply lost, then its resends
// throttled past the SDK's retries, is read back and recognised, so the
// requeue reports no error and the child runs once after the parent.
func TestRewaitUnderFaults(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	broken.Store(true)
	r := newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if broken.Load() && j.Args.To == "parent@example.com" {
			return handler.Permanent(errors.New("mailbox full"))
		}
		return nil
	}, rigConfig{faults: true})
	ctx := context.Background()
	parent := r.enqueue(t, email{To: "parent@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	child, err := r.prod.ContinueWith(ctx, parent, email{To: "child@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, child.ID), ledger.Failed, 0, "ended Failed")
	broken.Store(false)
	isRewait := func(b []byte) bool { return parseUpdate(b).setsState() == ledger.AwaitingContinuation }
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isRewait, Fault: faults.LostReply})
	throttled := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isRewait, Fault: faults.Throttle, Times: faults.Attempts - 1})
	if _, err := r.h.Producer().Requeue(ctx, parent); err != nil {
		t.Fatalf("requeue with the child's rewait applied, then throttled: %v", err)
	}
	fired(t, lost, 1)
	fired(t, throttled, faults.Attempts-1)
	r.drain(t)
	r.ranAs(t, child.ID, ledger.Succeeded, 1, "", 1)
}
