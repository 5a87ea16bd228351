package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Waiting on several events (issue 39 item 9): a job waits for whichever
// comes first of two named signals and a timer, with exactly one outcome,
// the same on every run.

type selecting struct {
	FailOnce bool `json:"failOnce"` // fail the first run after the wait: its retry replays the choice
}

func (selecting) Kind() string { return "selecting" }

func TestWaitForAnyOfTwoSignalsAndATimer(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	cfg := e.Cfg
	meter := awstest.NewMeter(&cfg, e.DB)
	e.Cfg = cfg
	var mu sync.Mutex
	outcome := map[string][]string{} // job id: the outcome each run saw
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[selecting](func(ctx context.Context, j *handler.Job[selecting]) error {
		got, err := handler.WaitForAny(ctx, []string{"approved", "rejected"}, time.Hour)
		var timeout *handler.SignalTimeoutError
		var what string
		switch {
		case errors.As(err, &timeout):
			what = "timed out"
		case err != nil:
			return err
		default:
			var by approval
			if err := got.Decode(&by); err != nil {
				return handler.Permanent(err)
			}
			what = got.Name + " by " + by.By
		}
		mu.Lock()
		outcome[j.ID] = append(outcome[j.ID], what)
		mu.Unlock()
		if j.Args.FailOnce && j.Attempt == 1 {
			return errors.New("a failure after the wait: the retry replays its outcome")
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	enq := func(a selecting) string { return enqueueOne(t, e.Client, a, nil) }
	signal := func(id, name, by string) error { return e.Client.Signal(ctx, id, name, approval{By: by}) }
	rejected, early, timedOut, replayed := enq(selecting{}), enq(selecting{}), enq(selecting{}), enq(selecting{FailOnce: true})
	// Both sent before the wait: the first of the names, in their order.
	if err := signal(early, "rejected", "bo"); err != nil {
		t.Fatal(err)
	}
	if err := signal(early, "approved", "ada"); err != nil {
		t.Fatal(err)
	}
	meter.Reset()
	e.DrainNow(t, h) // the others wait, asleep
	// Cost (docs/durable-jobs.md): a run that begins to wait is its claim,
	// one UpdateItem per name, its end, a send and one read; the early
	// job's run, its claim, the choice and its end.
	calls := strings.Join(dynamoAndSQS(meter), " ")
	if n := strings.Count(calls, "UpdateItem"); n != 3*4+3 {
		t.Errorf("three runs that begin to wait and one that chooses at once: %d UpdateItems (%s), want 15", n, calls)
	}
	if n := strings.Count(calls, "GetItem"); n != 3 {
		t.Errorf("three runs that begin to wait: %d reads, want 3 (one each: a signal meanwhile)", n)
	}
	for _, id := range []string{rejected, timedOut, replayed} {
		if rec := e.Get(t, id); rec.State != ledger.Scheduled || rec.Attempt != 0 {
			t.Fatalf("job %s in its wait: %s attempt %d, want Scheduled, no attempt spent", id, rec.State, rec.Attempt)
		}
	}
	if err := signal(rejected, "rejected", "cy"); err != nil {
		t.Fatal(err)
	}
	if err := signal(replayed, "approved", "ada"); err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, h) // the replayed job chose, then failed: its retry a second on
	if rec := e.Get(t, rejected); rec.State != ledger.Succeeded {
		t.Fatalf("the job signalled %q, its second name: %s, want woken and Succeeded with no clock moved", "rejected", rec.State)
	}
	if rec := e.Get(t, replayed); rec.State != ledger.Scheduled || rec.Attempt != 1 {
		t.Fatalf("the job that chose and failed: %s attempt %d, want Scheduled for its retry", rec.State, rec.Attempt)
	}
	// A second signal after the choice is recorded, never returned.
	if err := signal(replayed, "rejected", "bo"); err != nil {
		t.Fatalf("a second signal after the choice: %v", err)
	}
	e.Advance(t, 2*time.Second)
	e.Drain(t, h) // the replayed job's retry
	e.Advance(t, time.Hour+time.Minute)
	e.Drain(t, h)
	var tooLate *ledger.SignalRefusedError
	if err := signal(timedOut, "approved", "late"); !errors.As(err, &tooLate) {
		t.Errorf("a signal after the wait for any timed out: %v, want refused", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, want := range map[string][]string{
		rejected: {"rejected by cy"}, early: {"approved by ada"}, timedOut: {"timed out"},
		replayed: {"approved by ada", "approved by ada"},
	} {
		rec := e.Get(t, id)
		if rec.State != ledger.Succeeded || len(outcome[id]) != len(want) || outcome[id][0] != want[0] || outcome[id][len(want)-1] != want[len(want)-1] {
			t.Errorf("job %s: %s (%s), outcomes %q; want Succeeded with %q", id, rec.State, rec.LastError, outcome[id], want)
		}
	}
}
