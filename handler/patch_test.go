package handler_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type patchJob struct{}

func (patchJob) Kind() string { return "patch-job" }

// patchHandler is a deploy of patchJob's code that knows patches.
func patchHandler(t *testing.T, e *nexjobtest.Env, patches []string, took map[string]string, mu *sync.Mutex) *handler.Handler {
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[patchJob](func(ctx context.Context, j *handler.Job[patchJob]) error {
		if _, err := handler.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return err
		}
		if err := handler.Sleep(ctx, "cool-off", time.Hour); err != nil {
			return err
		}
		branch := "ship-v1"
		if handler.Patched(ctx, "ship-v2") {
			branch = "ship-v2"
		}
		if _, err := handler.Step(ctx, branch, func(context.Context) (int, error) { return 2, nil }); err != nil {
			return err
		}
		mu.Lock()
		took[j.ID] = branch
		mu.Unlock()
		return nil
	}), &handler.KindOptions{Patches: patches})
	return e.Handler(t, reg, &handler.Options{Logger: quiet})
}

// Patches (issue 40 item 1): a job that slept through the deploy that
// added a patch takes the old branch after its sleep; a job begun after
// takes the new one; each records what it took once; a job whose first
// run failed before the worker ran takes the new one.
func TestPatchedBranchesByWhenTheJobBegan(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	ft := faults.New(nil)
	e.Cfg = faults.Config(e.Cfg, ft)
	var mu sync.Mutex
	took := map[string]string{}
	old := patchHandler(t, e, nil, took, &mu)
	before := enqueueOne(t, e.Client, patchJob{}, nil)
	e.DrainNow(t, old) // charged, asleep: the deploy comes now
	if rec := e.Get(t, before); rec.State != ledger.Scheduled {
		t.Fatalf("before the deploy: %s", rec.State)
	}
	deployed := patchHandler(t, e, []string{"ship-v2"}, took, &mu)
	after := enqueueOne(t, e.Client, patchJob{}, nil)
	// A third job's first write of its patches is throttled past the
	// SDK's retries: its run fails before the worker ran.
	thr := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), "nexjob:patches") }, Fault: faults.Throttle, Times: 4})
	failedFirst := enqueueOne(t, e.Client, patchJob{}, nil)
	for _, id := range []string{before, after, failedFirst} {
		if rec := e.RunToEnd(t, deployed, id); rec.State != ledger.Succeeded {
			t.Fatalf("job %s: %s (%s)", id, rec.State, rec.LastError)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if took[before] != "ship-v1" || took[after] != "ship-v2" || took[failedFirst] != "ship-v2" || thr.Fired() == 0 {
		t.Fatalf("the job begun before the deploy took %s, the one after %s, the one whose first write failed %s (fired %d); want ship-v1, ship-v2, ship-v2", took[before], took[after], took[failedFirst], thr.Fired())
	}
	if got := e.Get(t, before).Steps["nexjob:patches"]; got != "[]" {
		t.Fatalf("the old job's recorded patches: %q, want []", got)
	}
	if got := e.Get(t, after).Steps["nexjob:patches"]; got != `["ship-v2"]` {
		t.Fatalf("the new job's recorded patches: %q", got)
	}
}
