package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Parallel (issue 39 item 5): branches of their own run concurrently,
// each branch's steps memoized on their own.

type parallelJob struct {
	NilBranch bool `json:"nilBranch,omitempty"`
}

func (parallelJob) Kind() string { return "parallel-job" }

type parallelRig struct {
	e       *nexjobtest.Env
	h       *handler.Handler
	mu      sync.Mutex
	calls   map[string]int
	results map[int]handler.MapResult[string]
	errs    map[int]error
}

func newParallelRig(t *testing.T) *parallelRig {
	t.Helper()
	r := &parallelRig{e: nexjobtest.New(t, nil), calls: map[string]int{}, results: map[int]handler.MapResult[string]{}, errs: map[int]error{}}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[parallelJob](func(ctx context.Context, j *handler.Job[parallelJob]) error {
		count := func(what string) int {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.calls[what]++
			return r.calls[what]
		}
		// On the first attempt no branch ends before all three began, so
		// each one's outcome is decided in that run.
		var began sync.WaitGroup
		began.Add(3)
		start := func() {
			if j.Attempt == 1 {
				began.Done()
				began.Wait()
			}
		}
		branches := []func(context.Context) (string, error){
			func(ctx context.Context) (string, error) { // two steps of its own; the second fails once
				start()
				count("charge")
				auth, err := handler.Step(ctx, "charge.auth", func(context.Context) (string, error) {
					count("charge.auth")
					return "auth-1", nil
				})
				if err != nil {
					return "", err
				}
				capt, err := handler.Step(ctx, "charge.capture", func(context.Context) (string, error) {
					if count("charge.capture") == 1 {
						return "", errors.New("the provider timed out")
					}
					return "captured", nil
				})
				if err != nil {
					return "", err
				}
				return auth + "/" + capt, nil
			},
			func(context.Context) (string, error) { // succeeds at once
				start()
				count("email")
				return "emailed", nil
			},
			func(context.Context) (string, error) { // fails once
				start()
				if count("reserve") == 1 {
					return "", errors.New("the warehouse is busy")
				}
				return "reserved", nil
			},
		}
		if j.Args.NilBranch {
			branches = append(branches[:1:1], nil)
		}
		res, err := handler.Parallel(ctx, "order", branches, nil)
		r.mu.Lock()
		r.results[j.Attempt], r.errs[j.Attempt] = res, err
		r.mu.Unlock()
		return err
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

// Each branch is a step: the first run keeps the branch that succeeded
// and the step that succeeded inside a failing branch; the retry calls
// neither again, runs the two failed branches, and the results come in
// the branches' order.
func TestParallelReplaysFinishedBranchesAndTheirSteps(t *testing.T) {
	t.Parallel()
	r := newParallelRig(t)
	id := enqueueOne(t, r.e.Client, parallelJob{}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	var failed *handler.MapFailedError
	if !errors.As(r.errs[1], &failed) || len(failed.Failures) != 2 || failed.Failures[0].Index != 0 || failed.Failures[1].Index != 2 {
		t.Fatalf("the first run's Parallel: %v, want a *MapFailedError naming branches 0 and 2", r.errs[1])
	}
	if rec.State != ledger.Succeeded || rec.Attempt != 2 || r.errs[2] != nil {
		t.Fatalf("job %s at attempt %d (%s), the second run's Parallel: %v", rec.State, rec.Attempt, rec.LastError, r.errs[2])
	}
	want := map[string]int{"charge": 2, "charge.auth": 1, "charge.capture": 2, "email": 1, "reserve": 2}
	for what, n := range want {
		if r.calls[what] != n {
			t.Errorf("%s called %d times, want %d (calls: %v)", what, r.calls[what], n, r.calls)
		}
	}
	if got := strings.Join(r.results[2].Values, ","); got != "auth-1/captured,emailed,reserved" {
		t.Errorf("the second run's results %q, want the branches' in order", got)
	}
	for i, done := range r.results[2].Done {
		if !done {
			t.Errorf("branch %d not done after the retry", i)
		}
	}
}

// A nil branch fails the job for good before any branch runs.
func TestParallelRefusesANilBranch(t *testing.T) {
	t.Parallel()
	r := newParallelRig(t)
	id := enqueueOne(t, r.e.Client, parallelJob{NilBranch: true}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.State != ledger.Failed || rec.Attempt != 1 || !strings.Contains(rec.LastError, `parallel "order": branch 1 is nil`) {
		t.Fatalf("job %s at attempt %d (%q), want Failed at its first attempt naming the nil branch", rec.State, rec.Attempt, rec.LastError)
	}
	if len(r.calls) != 0 {
		t.Errorf("branches ran beside a nil one: %v", r.calls)
	}
}
