package handler_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Map (issue 39 items 5 and 6): items run concurrently under a bound,
// each a step of its own, results in order, completion policies.

type mapJob struct {
	N           int    `json:"n"`
	Concurrency int    `json:"c"`
	Policy      string `json:"policy,omitempty"` // "", "settled", "tolerate1", "first"
	FailFirst   int    `json:"failFirst,omitempty"`
	Nap         bool   `json:"nap,omitempty"`
}

func (mapJob) Kind() string { return "map-job" }

type mapRig struct {
	e       *nexjobtest.Env
	h       *handler.Handler
	meter   *awstest.Meter
	mu      sync.Mutex
	calls   map[int]int
	running atomic.Int32
	most    atomic.Int32
	results map[string]handler.MapResult[string]
	errs    map[string]error
}

func newMapRig(t *testing.T) *mapRig {
	t.Helper()
	r := &mapRig{e: nexjobtest.New(t, nil), calls: map[int]int{}, results: map[string]handler.MapResult[string]{}, errs: map[string]error{}}
	cfg := r.e.Cfg
	r.meter = awstest.NewMeter(&cfg, r.e.DB)
	r.e.Cfg = cfg
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[mapJob](func(ctx context.Context, j *handler.Job[mapJob]) error {
		items := make([]int, j.Args.N)
		for i := range items {
			items[i] = i * 10
		}
		o := &handler.MapOptions{MaxConcurrency: j.Args.Concurrency}
		switch j.Args.Policy {
		case "settled":
			o.Completion.AllSettled = true
		case "tolerate1":
			o.Completion.ToleratedFailures = 1
		case "first":
			o.Completion.FirstSuccess = true
		}
		res, err := handler.Map(ctx, "lines", items, func(ctx context.Context, i, item int) (string, error) {
			n := r.running.Add(1)
			defer r.running.Add(-1)
			for m := r.most.Load(); n > m && !r.most.CompareAndSwap(m, n); m = r.most.Load() {
			}
			r.mu.Lock()
			r.calls[i]++
			r.mu.Unlock()
			if j.Args.FailFirst > 0 && i%j.Args.FailFirst == 1 && (j.Attempt == 1 || j.Args.Policy != "") {
				return "", fmt.Errorf("line %d declined", i)
			}
			return fmt.Sprintf("line-%d", item), nil
		}, o)
		r.mu.Lock()
		r.results[fmt.Sprint(j.Attempt)], r.errs[fmt.Sprint(j.Attempt)] = res, err
		r.mu.Unlock()
		if err != nil {
			return err
		}
		if j.Args.Nap {
			return handler.Sleep(ctx, "nap", time.Hour)
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

// A failing item fails the map (all must succeed), the job's retry replays
// the items that succeeded and runs only the rest; results come in the
// items' order; no more than MaxConcurrency items run at once.
func TestMapRunsEachItemOnceAndReplaysTheRest(t *testing.T) {
	t.Parallel()
	r := newMapRig(t)
	id := enqueueOne(t, r.e.Client, mapJob{N: 40, Concurrency: 5, FailFirst: 7}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	var failed *handler.MapFailedError
	if !errors.As(r.errs["1"], &failed) || failed.Failures[0].Index != 1 {
		t.Fatalf("the first run's map: %v, want a *MapFailedError naming item 1 first", r.errs["1"])
	}
	if rec.State != ledger.Succeeded || rec.Attempt != 2 || r.errs["2"] != nil {
		t.Fatalf("job %s at attempt %d (%s), the second run's map: %v", rec.State, rec.Attempt, rec.LastError, r.errs["2"])
	}
	for i := range 40 {
		want := 1
		if i%7 == 1 {
			want = 2 // failed, then run again
		}
		if r.calls[i] > want || r.calls[i] == 0 && i%7 != 1 && r.results["2"].Values[i] == "" {
			t.Errorf("item %d called %d times, want at most %d", i, r.calls[i], want)
		}
		if got := r.results["2"].Values[i]; got != fmt.Sprintf("line-%d", i*10) {
			t.Errorf("item %d: %q", i, got)
		}
	}
	if m := r.most.Load(); m > 5 {
		t.Errorf("%d items ran at once, the bound is 5", m)
	}
}

// The completion policies: every item settled (the failures kept and
// replayed as they were), a tolerated failure passed, the first success.
func TestMapCompletionPolicies(t *testing.T) {
	t.Parallel()
	t.Run("all settled", func(t *testing.T) {
		t.Parallel()
		r := newMapRig(t)
		id := enqueueOne(t, r.e.Client, mapJob{N: 9, Concurrency: 3, Policy: "settled", FailFirst: 4, Nap: true}, nil)
		r.e.Drain(t, r.h)
		r.mu.Lock()
		first := r.results["1"]
		callsBefore := len(r.calls)
		r.mu.Unlock()
		r.e.Advance(t, time.Hour+time.Minute)
		r.e.Drain(t, r.h)
		r.mu.Lock()
		defer r.mu.Unlock()
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded {
			t.Fatalf("job %s (%s)", rec.State, rec.LastError)
		}
		for _, i := range []int{1, 5} {
			var ie *handler.MapItemError
			if !errors.As(first.Errs[i], &ie) || ie.Index != i || !first.Done[i] {
				t.Errorf("item %d: %v (done %v), want its failure kept", i, first.Errs[i], first.Done[i])
			}
			if r.calls[i] != 1 {
				t.Errorf("item %d called %d times: its kept failure must replay, not run again", i, r.calls[i])
			}
		}
		if callsBefore != 9 || r.errs["1"] != nil {
			t.Errorf("%d items called, map error %v; want all 9, no error", callsBefore, r.errs["1"])
		}
	})
	t.Run("one failure tolerated, two not", func(t *testing.T) {
		t.Parallel()
		r := newMapRig(t)
		id := enqueueOne(t, r.e.Client, mapJob{N: 6, Concurrency: 1, Policy: "tolerate1", FailFirst: 4}, nil)
		r.e.Drain(t, r.h)
		r.mu.Lock()
		defer r.mu.Unlock()
		var failed *handler.MapFailedError
		if !errors.As(r.errs["1"], &failed) || len(failed.Failures) != 2 {
			t.Fatalf("items 1 and 5 failed with one tolerated: %v", r.errs["1"])
		}
		_ = id
	})
	t.Run("first success", func(t *testing.T) {
		t.Parallel()
		r := newMapRig(t)
		id := enqueueOne(t, r.e.Client, mapJob{N: 4, Concurrency: 1, Policy: "first", FailFirst: 2, Nap: true}, nil)
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Hour+time.Minute) // the woken run replays the map: its recorded winner
		r.e.Drain(t, r.h)
		r.mu.Lock()
		defer r.mu.Unlock()
		res := r.results["1"]
		if r.errs["1"] != nil || res.Values[0] != "line-0" || !res.Done[0] || res.Done[1] || r.calls[1] != 0 || r.calls[0] != 1 {
			t.Fatalf("first success, replayed: %v, values %q, done %v, items 0 and 1 called %d and %d times; want item 0 alone, called once", r.errs["1"], res.Values, res.Done, r.calls[0], r.calls[1])
		}
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded {
			t.Fatalf("job %s", rec.State)
		}
	})
}

// A map over 10,000 items at a concurrency of 50 in one job: each item
// called once, one PutItem each, and the claim and end around them.
func TestMapOverTenThousandItems(t *testing.T) {
	t.Parallel()
	r := newMapRig(t)
	const n = ledger.MaxJobSteps
	id := enqueueOne(t, r.e.Client, mapJob{N: n, Concurrency: 50}, nil)
	r.meter.Reset()
	p := poller.New(r.e.SQS, r.e.QueueURL, r.h.Handle, &poller.Options{WaitTime: time.Second, FunctionTimeout: 15 * time.Minute})
	for {
		rec, err := r.e.Client.Store().Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != ledger.Enqueued && rec.State != ledger.Processing {
			break
		}
		if _, err := p.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	u, calls := r.meter.Units(), r.meter.Calls()
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || len(rec.Steps) != n {
		t.Fatalf("job %s (%s), %d steps; want Succeeded with %d", rec.State, rec.LastError, len(rec.Steps), n)
	}
	for i := range n {
		if r.calls[i] != 1 || r.results["1"].Values[i] != fmt.Sprintf("line-%d", i*10) {
			t.Fatalf("item %d called %d times, result %q", i, r.calls[i], r.results["1"].Values[i])
		}
	}
	if puts := count(calls, "DynamoDB.PutItem"); puts != n || u.Write != n+2 {
		t.Errorf("%d PutItems, %d write units; want %d and %d (an item each, the claim and the end)", puts, u.Write, n, n+2)
	}
	if m := r.most.Load(); m > 50 {
		t.Errorf("%d items ran at once, the bound is 50", m)
	}
	t.Logf("a map of %d items at a concurrency of 50: %d requests, %s", n, len(calls), u)
}
