package nexjobtest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
)

// TestTimeControl: a job an hour ahead and a retry ten minutes ahead are
// left Scheduled by Drain (it used to wait a minute on them and fail);
// Advance, or RunNow, makes them due, and the next Drain runs them.
func TestTimeControl(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var runs atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[greet](func(_ context.Context, j *handler.Job[greet]) error {
		runs.Add(1)
		if j.Args.Name == "flaky" && j.Attempt == 1 {
			return handler.RetryAfter(10*time.Minute, errors.New("try later"))
		}
		return nil
	}), nil)
	h := e.Handler(t, reg, nil)
	ctx := context.Background()
	later, err := e.Client.Enqueue(ctx, greet{Name: "later"}, &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	flaky, err := e.Client.Enqueue(ctx, greet{Name: "flaky"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, h)
	e.RequireState(t, later.ID, ledger.Scheduled)
	if rec := e.RequireState(t, flaky.ID, ledger.Scheduled); rec.Attempt != 1 {
		t.Fatalf("flaky: attempt %d", rec.Attempt)
	}
	e.Drain(t, h) // follows the retry's 10 minutes, not the hour's delay
	e.RequireState(t, flaky.ID, ledger.Succeeded)
	e.RequireState(t, later.ID, ledger.Scheduled)
	e.RunNow(t, later.ID) // the hour
	e.Drain(t, h)
	e.RequireState(t, later.ID, ledger.Succeeded)
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d runs, want 3", n)
	}
}

// TestFireRecurring: a recurring job's firing in a test, with no
// Scheduler and no ARNs: SkipIfRunning while the run is active, a new
// run once it ended, and a firing delivered twice runs once.
func TestFireRecurring(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[greet](func(context.Context, *handler.Job[greet]) error { return nil }), nil)
	at := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	first := e.FireRecurring(t, "nightly-greet", greet{Name: "ops"}, nil, at)
	busy := e.FireRecurring(t, "nightly-greet", greet{Name: "ops"}, nil, at.Add(24*time.Hour))
	if first.Duplicate || !busy.Duplicate || busy.ID != first.ID {
		t.Fatalf("while active: %+v then %+v", first, busy)
	}
	e.Drain(t, e.Handler(t, reg, nil))
	e.RequireState(t, first.ID, ledger.Succeeded)
	if again := e.FireRecurring(t, "nightly-greet", greet{Name: "ops"}, nil, at); !again.Duplicate || again.ID != first.ID {
		t.Fatalf("the first firing delivered again: %+v", again)
	}
	next := e.FireRecurring(t, "nightly-greet", greet{Name: "ops"}, &recurring.Opts{}, at.Add(48*time.Hour))
	if next.Duplicate || next.ID == first.ID {
		t.Fatalf("the next firing after the run ended: %+v", next)
	}
}

// TestDrainNeverWaits: a retry with the default backoff passes on the
// kit's clock, not in real time, with one outcome every run (before: the
// jittered backoff put the retry 16 to 74 s out, so after one Drain the
// job was Succeeded in 2 runs of 6 and Scheduled in 4, and Drain waited
// up to 30 s of real time for it). The kit's handlers retry after
// handler.FloorBackoff; DrainNow runs only what is due and leaves the
// retry Scheduled; Drain moves the Env's clock to it and runs it. A
// 1-hour delay and a 30-day schedule wait for Advance.
func TestDrainNeverWaits(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[greet](func(_ context.Context, j *handler.Job[greet]) error {
		if j.Args.Name == "flaky" && j.Attempt == 1 {
			return errors.New("not yet")
		}
		return nil
	}), nil)
	h := e.Handler(t, reg, nil)
	ctx := context.Background()
	flaky, err := e.Client.Enqueue(ctx, greet{Name: "flaky"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hour, err := e.Client.Enqueue(ctx, greet{Name: "hour"}, &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	month, err := e.Client.Enqueue(ctx, greet{Name: "month"}, &enqueue.Opts{RunAt: e.Now().Add(30 * 24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	start, wallStart := e.Now(), time.Now()
	e.DrainNow(t, h)
	rec := e.RequireState(t, flaky.ID, ledger.Scheduled)
	if wait := ledger.Millis(rec.RunAt).Sub(start); rec.Attempt != 1 || wait < handler.FloorBackoff(1) || wait > handler.FloorBackoff(1)+time.Second {
		t.Fatalf("after DrainNow: attempt %d, retry %s out; want attempt 1, retry %s out (the backoff's floor)", rec.Attempt, wait, handler.FloorBackoff(1))
	}
	e.Drain(t, h)
	if rec := e.RequireState(t, flaky.ID, ledger.Succeeded); rec.Attempt != 2 {
		t.Fatalf("after Drain: attempt %d, want 2", rec.Attempt)
	}
	// The Env's clock is the wall clock plus what Drain and Advance
	// added: what Drain added (the jump) is the clock's reading less the
	// real time the test took, which a busy machine stretches.
	moved := e.Now().Sub(start)
	if jump := moved - time.Since(wallStart); moved < handler.FloorBackoff(1) || jump > handler.FloorBackoff(1)+2*time.Second {
		f := e.Get(t, flaky.ID)
		t.Fatalf("Drain moved the clock %s (%s of it a jump); want a jump to the retry (%s); the flaky job: %s, attempt %d, cut-offs %d, defers %d, runs %+v; pending:\n%s", moved, jump, handler.FloorBackoff(1), f.State, f.Attempt, f.CutOffs, f.Defers, f.Attempts(), e.Pending(t))
	}
	e.RequireState(t, hour.ID, ledger.Scheduled)
	e.RequireState(t, month.ID, ledger.Scheduled)
	e.Advance(t, time.Hour)
	e.Drain(t, h)
	e.RequireState(t, hour.ID, ledger.Succeeded)
	e.RequireState(t, month.ID, ledger.Scheduled)
	e.Advance(t, 30*24*time.Hour)
	e.Drain(t, h)
	e.RequireState(t, month.ID, ledger.Succeeded)
}

// TestDrainRunsEveryRetry (issue 41 item 1): a job that fails four times
// runs its fifth attempt in one Drain, whatever the backoffs (16 s, 31 s,
// 61 s, 121 s: the kit's FloorBackoff), and a job a day away is left
// Scheduled; a job retried past DrainSteps fails the Drain naming it
// (checked through a stand-in testing.TB).
func TestDrainRunsEveryRetry(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[greet](func(_ context.Context, j *handler.Job[greet]) error {
		if j.Args.Name == "flaky" && j.Attempt < 5 {
			return errors.New("not yet")
		}
		return nil
	}), nil)
	h := e.Handler(t, reg, nil)
	ctx := context.Background()
	flaky, err := e.Client.Enqueue(ctx, greet{Name: "flaky"}, &enqueue.Opts{MaxAttempts: 6})
	if err != nil {
		t.Fatal(err)
	}
	day, err := e.Client.Enqueue(ctx, greet{Name: "day"}, &enqueue.Opts{Delay: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	start := e.Now()
	e.Drain(t, h)
	rec := e.RequireState(t, flaky.ID, ledger.Succeeded)
	var backoffs time.Duration
	for n := 1; n < 5; n++ {
		backoffs += handler.FloorBackoff(n)
	}
	if moved := e.Now().Sub(start); rec.Attempt != 5 || moved < backoffs {
		t.Fatalf("attempt %d, the clock moved %s; want attempt 5 after the four backoffs (%s)", rec.Attempt, moved, backoffs)
	}
	e.RequireState(t, day.ID, ledger.Scheduled)
}
