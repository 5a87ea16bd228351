package handler_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type careless struct {
	Wait bool `json:"wait"`
}

func (careless) Kind() string { return "careless" }

// A worker that drops the error of Sleep or WaitForSignal (issue 38 item
// 7) silently skipped the sleep, or went on with a zero payload, and
// succeeded. Now the run ends in the sleep it met all the same: a step
// after it returns the sleep again without running, and the run's nil is
// not a success.
func TestADroppedSleepErrorStillSleeps(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var mu sync.Mutex
	shipped := map[string][]string{} // job id: the approver each shipment saw
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[careless](func(ctx context.Context, j *handler.Job[careless]) error {
		var by approval
		if j.Args.Wait {
			by, _ = handler.WaitForSignal[approval](ctx, "approval", time.Hour) // error dropped
		} else {
			_ = handler.Sleep(ctx, "cool-off", time.Hour) // error dropped
		}
		_, err := handler.Step(ctx, "ship", func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			shipped[j.ID] = append(shipped[j.ID], by.By)
			return true, nil
		})
		if err != nil && !handler.IsSleep(err) {
			return err
		}
		return nil // a success, the worker thinks
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	slept, waited := enqueueOne(t, e.Client, careless{}, nil), enqueueOne(t, e.Client, careless{Wait: true}, nil)
	e.Drain(t, h)
	mu.Lock()
	before := map[string]int{slept: len(shipped[slept]), waited: len(shipped[waited])}
	mu.Unlock()
	for id, n := range before {
		if rec := e.Get(t, id); rec.State != ledger.Scheduled || n != 0 {
			t.Errorf("job %s after a run that dropped its sleep's error: %s, shipped %d times; want Scheduled in its sleep, not shipped", id, rec.State, n)
		}
	}
	if err := e.Client.Signal(ctx, waited, "approval", approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	e.Advance(t, time.Hour+time.Minute)
	e.Drain(t, h)
	mu.Lock()
	defer mu.Unlock()
	for id, want := range map[string]string{slept: "", waited: "ada"} {
		rec := e.Get(t, id)
		if rec.State != ledger.Succeeded || len(shipped[id]) != 1 || shipped[id][0] != want {
			t.Errorf("job %s: %s, shipments %q; want Succeeded, shipped once (approved by %q)", id, rec.State, shipped[id], want)
		}
	}
}
