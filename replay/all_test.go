package replay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/replay"
)

type flow struct{ N int }

func (flow) Kind() string { return "replay.flow" }

type kid struct{ N int }

func (kid) Kind() string { return "replay.kid" }

// flowRegistry is a kind that uses every durable call a replay meets: a
// patch, a map, a compensation, a child awaited, a wait for any of two
// signals, a condition polled. looks counts the condition's checks.
func flowRegistry(looks *int, calls *atomic.Int64) *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[kid, int](func(_ context.Context, j *handler.Job[kid]) (int, error) {
		return j.Args.N * 10, nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[flow](func(ctx context.Context, j *handler.Job[flow]) error {
		if !handler.Patched(ctx, "v2") {
			return handler.Permanent(errPatch)
		}
		if _, err := handler.Map(ctx, "items", []int{1, 2, 3}, func(ctx context.Context, _ int, n int) (int, error) {
			calls.Add(1)
			return n * 2, nil
		}, nil); err != nil {
			return err
		}
		if err := handler.Compensate(ctx, "undo", func(context.Context) error { calls.Add(1); return nil }); err != nil {
			return err
		}
		if _, err := handler.Invoke[int](ctx, "kid", kid{N: j.Args.N}, &handler.InvokeOptions{Timeout: time.Hour}); err != nil {
			return err
		}
		if _, err := handler.WaitForAny(ctx, []string{"a", "b"}, time.Hour); err != nil {
			return err
		}
		if _, err := handler.WaitForCondition(ctx, "settled", func(context.Context) (int, bool, error) {
			*looks++
			return 0, false, nil
		}, &handler.ConditionOptions{Every: time.Minute, Timeout: 24 * time.Hour}); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "end", func(context.Context) (int, error) { calls.Add(1); return 1, nil })
		return err
	}), &handler.KindOptions{Patches: []string{"v2"}})
	return reg
}

var errPatch = errorString("the job started before patch v2")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestReplayOfEveryDurableCall: a job met at each of its waits (a child,
// two signals, a condition between two looks, a condition's look due)
// replays against its own code with no divergence, no step's function,
// no compensation and no condition's check called.
func TestReplayOfEveryDurableCall(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	looks := 0
	calls := new(atomic.Int64)
	reg := flowRegistry(&looks, calls)
	h := e.Handler(t, reg, nil)
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, flow{N: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	check := func(stage string) {
		t.Helper()
		before, lookedBefore := calls.Load(), looks
		rep, err := replay.Check(ctx, reg, e.Export(t, "replay.flow", nil))
		if err != nil {
			t.Fatal(err)
		}
		if rep.Jobs != 1 || len(rep.Divergences) != 0 {
			t.Fatalf("%s: %d jobs replayed, divergences: %v", stage, rep.Jobs, rep.Err())
		}
		if calls.Load() != before || looks != lookedBefore {
			t.Fatalf("%s: the replay called %d functions and %d checks, want none", stage, calls.Load()-before, looks-lookedBefore)
		}
	}
	e.Drain(t, h) // the map, the child and its end: the job waits for a or b
	if rec := e.RequireState(t, res.ID, ledger.Scheduled); rec.Steps[ledger.WaitStep("a")] == "" {
		t.Fatalf("the job does not wait for its signals: %+v", rec.Steps)
	}
	check("waiting for a signal")
	if err := e.Client.Signal(ctx, res.ID, "b", 1); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h) // the first look: false, a minute's sleep
	if looks != 1 {
		t.Fatalf("the condition was checked %d times, want 1", looks)
	}
	check("between two looks")
	e.Advance(t, 2*time.Minute) // the next look is due, not yet taken
	check("a look due")
}
