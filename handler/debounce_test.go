package handler_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// A burst of 50 debounced enqueues becomes one job and one run, with the
// last args; the first starts the window, the 49 others are folded into
// it. An enqueue after the job ran starts the next window.
func TestDebounceFoldsABurstIntoOneRun(t *testing.T) {
	t.Parallel()
	var seen recipients
	r := newRig(t, seen.work, nil)
	ctx := context.Background()
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "user-7:profile-changed", Period: 2 * time.Second}}
	var id string
	for i := range 50 {
		res, err := r.prod.Enqueue(ctx, email{To: fmt.Sprintf("v%d@example.com", i)}, db)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			id = res.ID
			if res.Folded {
				t.Fatal("the first enqueue was folded into something")
			}
			continue
		}
		if !res.Folded || res.ID != id {
			t.Fatalf("enqueue %d: %+v, want folded into %s", i, res, id)
		}
	}
	r.drain(t)
	if ran := seen.got(); len(ran) != 1 || ran[0] != "v49@example.com" {
		t.Fatalf("runs %v, want one with the last args", ran)
	}
	expect(t, r.get(t, id), ledger.Succeeded, 1, "")
	next, err := r.prod.Enqueue(ctx, email{To: "after@example.com"}, db)
	if err != nil || next.Folded || next.ID == id {
		t.Fatalf("after the run: %+v %v, want a new window", next, err)
	}
	r.drain(t)
	if ran := seen.got(); len(ran) != 2 || ran[1] != "after@example.com" {
		t.Fatalf("runs %v, want a second run with the new args", ran)
	}
}

// MaxWait bounds a burst that never pauses: folds move the run later,
// never past MaxWait after the first enqueue. Bad Debounce options are
// *InputErrors.
func TestDebounceMaxWait(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ctx := context.Background()
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "k", Period: time.Hour, MaxWait: 3 * time.Second}}
	before := r.clock.Now() // the window's end is taken after this, before the record's CreatedAt
	first, err := r.prod.Enqueue(ctx, email{To: "a@example.com"}, db)
	if err != nil {
		t.Fatal(err)
	}
	start := r.get(t, first.ID)
	for range 3 {
		r.clock.Advance(time.Second)
		if res, err := r.prod.Enqueue(ctx, email{To: "b@example.com"}, db); err != nil || !res.Folded {
			t.Fatalf("%+v %v", res, err)
		}
	}
	if got := r.get(t, first.ID); got.RunAt > start.CreatedAt+3000 || got.RunAt < before.UnixMilli()+3000 {
		t.Fatalf("run at +%d ms after three folds a second apart, want MaxWait: +3000 from the first enqueue, no later", got.RunAt-before.UnixMilli())
	}
	for _, bad := range []*enqueue.Opts{
		{Debounce: &enqueue.Debounce{Key: "", Period: time.Second}},
		{Debounce: &enqueue.Debounce{Key: "k", Period: time.Millisecond}},
		{Debounce: &enqueue.Debounce{Key: "k", Period: time.Minute, MaxWait: time.Millisecond}},
		{Debounce: &enqueue.Debounce{Key: "k", Period: time.Second}, IdempotencyKey: "x"},
	} {
		if _, err := r.prod.Enqueue(ctx, email{To: "x@example.com"}, bad); err == nil {
			t.Errorf("%+v accepted", bad.Debounce)
		}
	}
}

// A fold applied with its reply lost is recognised (one job, folded); a
// new window's transaction (the pointer and its job) applied with its
// reply lost meets a pointer naming our job (one job, not two).
func TestDebounceUnderFaults(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ft, cfg := r.e.Faulty()
	prod, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "faulty", Period: time.Hour}}
	lostPut := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.LostReply})
	first, err := prod.Enqueue(ctx, email{To: "a@example.com"}, db)
	if err != nil || first.Folded || lostPut.Fired() != 1 {
		t.Fatalf("with the window's reply lost: %+v %v (fired %d)", first, err, lostPut.Fired())
	}
	lostFold := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	second, err := prod.Enqueue(ctx, email{To: "b@example.com"}, db)
	if err != nil || !second.Folded || second.ID != first.ID || lostFold.Fired() != 1 {
		t.Fatalf("with the fold's reply lost: %+v %v (fired %d), want folded into %s", second, err, lostFold.Fired(), first.ID)
	}
	jobs := 0
	for _, rec := range r.e.Records(t) {
		if rec.ID != "" {
			jobs++
		}
	}
	if got := r.get(t, first.ID); jobs != 1 || got.Args != `{"To":"b@example.com"}` {
		t.Fatalf("%d jobs, args %s; want one job with the last args", jobs, got.Args)
	}
}

// TestDebounceThrottledPastTheRetries: each of a debounced enqueue's
// writes throttled past the SDK's retries (a new window's transaction of
// the pointer and its job, a fold) fails the call with an error, never a
// silent success, and writes nothing; the caller's retry of the same
// enqueue leaves exactly one pending job with the last args, which runs
// once.
func TestDebounceThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	var seen recipients
	r := newRig(t, seen.work, nil)
	ft, cfg := r.e.Faulty()
	prod, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quiet, Ledger: ledger.Options{Now: r.clock.Now}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	window := func(key string) *enqueue.Opts {
		return &enqueue.Opts{Debounce: &enqueue.Debounce{Key: key, Period: 2 * time.Second}}
	}
	for i, c := range []struct {
		key  string
		rule faults.Rule
	}{
		{"a", faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: faults.Attempts}}, // a new window
		{"b", faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: faults.Attempts}}, // another
		{"b", faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts}},         // a fold into b's job
	} {
		h := ft.Add(c.rule)
		to := fmt.Sprintf("try%d@example.com", i)
		before := r.e.Records(t)
		if res, err := prod.Enqueue(ctx, email{To: to}, window(c.key)); err == nil || h.Fired() != faults.Attempts {
			t.Fatalf("write %d throttled past the retries: %+v, %v (fired %d), want an error", i, res, err, h.Fired())
		}
		if after := r.e.Records(t); !slices.EqualFunc(before, after, func(a, b ledger.Record) bool { return a.PK == b.PK && a.Args == b.Args }) {
			t.Fatalf("write %d throttled past the retries wrote: %d items before, %d after", i, len(before), len(after))
		}
		h.Remove()
		if _, err := prod.Enqueue(ctx, email{To: to}, window(c.key)); err != nil {
			t.Fatalf("write %d: the caller's retry: %v", i, err)
		}
	}
	pending := map[string]string{}
	for _, rec := range r.e.Records(t) {
		if rec.ID != "" && rec.State == ledger.Scheduled {
			if _, dup := pending[rec.Args]; dup {
				t.Fatalf("two pending jobs with args %s", rec.Args)
			}
			pending[rec.Args] = rec.ID
		}
	}
	if len(pending) != 2 || pending[`{"To":"try0@example.com"}`] == "" || pending[`{"To":"try2@example.com"}`] == "" {
		t.Fatalf("pending jobs %v, want a's (try0) and b's with the last args (try2)", pending)
	}
	r.clock.Advance(3 * time.Second)
	r.drain(t)
	ran := seen.got()
	slices.Sort(ran)
	if !slices.Equal(ran, []string{"try0@example.com", "try2@example.com"}) {
		t.Fatalf("runs %v, want one per window, each with its last args", ran)
	}
}

// recipients records the To of every run, in order.
type recipients struct {
	mu  sync.Mutex
	ran []string
}

func (r *recipients) work(_ context.Context, j *handler.Job[email]) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran = append(r.ran, j.Args.To)
	return nil
}

func (r *recipients) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran)
}
