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

type renameJob struct{}

func (renameJob) Kind() string { return "rename-job" }

// Renames (issue 40 item 2): a step renamed in code while a job slept
// keeps its recorded result (StepOptions.Aliases): the charge is not made
// again. A step whose result type changed fails the job at once with a
// *ResultTypeError naming the step, the recorded shape (never its data)
// and the type asked for.
func TestRenamedStepKeepsItsResult(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var mu sync.Mutex
	charges := 0
	var afterErr error
	deploy := func(v int) *handler.Handler {
		reg := handler.NewRegistry()
		handler.AddWorker(reg, handler.WorkFunc[renameJob](func(ctx context.Context, j *handler.Job[renameJob]) error {
			charge := func(context.Context) (string, error) {
				mu.Lock()
				charges++
				mu.Unlock()
				return "ch_secret_1", nil
			}
			var err error
			switch v {
			case 1:
				_, err = handler.Step(ctx, "charge", charge)
			case 2:
				_, err = handler.StepWith(ctx, "charge-card", &handler.StepOptions{Aliases: []string{"charge"}}, charge)
			case 3:
				_, err = handler.Step(ctx, "charge", func(context.Context) (struct{ ID string }, error) { return struct{ ID string }{}, nil })
			}
			if err != nil {
				mu.Lock()
				afterErr = err
				mu.Unlock()
				return err
			}
			return handler.Sleep(ctx, "wait", time.Hour)
		}), nil)
		return e.Handler(t, reg, &handler.Options{Logger: quiet})
	}
	renamed := enqueueOne(t, e.Client, renameJob{}, nil)
	e.DrainNow(t, deploy(1)) // charged, asleep
	if rec := e.RunToEnd(t, deploy(2), renamed); rec.State != ledger.Succeeded || charges != 1 {
		t.Fatalf("renamed: %s (%s), %d charges; want Succeeded, no charge again", rec.State, rec.LastError, charges)
	}
	retyped := enqueueOne(t, e.Client, renameJob{}, nil)
	e.DrainNow(t, deploy(1)) // charged, asleep
	rec := e.RunToEnd(t, deploy(3), retyped)
	var rt *handler.ResultTypeError
	if rec.State != ledger.Failed || rec.Attempt != 1 || !errors.As(afterErr, &rt) || rt.Step != "charge" || rt.Want != "struct { ID string }" || !strings.Contains(rt.Recorded, "a JSON string of 13 bytes") {
		t.Fatalf("retyped: %s at attempt %d (%s), %v", rec.State, rec.Attempt, rec.LastError, afterErr)
	}
	if strings.Contains(rec.LastError, "ch_secret") {
		t.Fatalf("the recorded result's data reached the job's error: %s", rec.LastError)
	}
}
