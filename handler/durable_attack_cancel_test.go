package handler_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type atkCancel struct {
	N int `json:"n"`
}

func (atkCancel) Kind() string { return "atk.cancel" }

// README, Cancel of a running job: "its next step's record is refused
// and the run fails for good with the reason". enqueue.Ended.Cancelled:
// "Failed: an operator cancelled or deleted it"; NotSucceededError:
// "Failed (Cancelled by an operator, or not)"; README, Results: "one
// that ended otherwise a *enqueue.NotSucceededError (state, last error,
// cancelled)".
//
// An operator's Cancel of a running job ends it Failed at its next step,
// but the end is not marked cancelled: Wait's Ended.Cancelled and
// Result's NotSucceededError.Cancelled say false, as for any failure.
func TestAttackCancelOfARunningJobNotMarkedCancelled(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	var mu sync.Mutex
	second := 0
	handler.AddWorker(reg, handler.WorkFunc[atkCancel](func(ctx context.Context, j *handler.Job[atkCancel]) error {
		if _, err := handler.Step(ctx, "first", func(ctx context.Context) (bool, error) {
			// The operator cancels while this step's function runs.
			var asked *enqueue.CancelRequestedError
			if _, err := e.Client.Cancel(ctx, j.ID, "wrong customer", 0); !errors.As(err, &asked) {
				return false, handler.Permanent(err)
			}
			e.Advance(t, ledger.CancelLook) // the run reads its record for a cancel at this step's record
			return true, nil
		}); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "second", func(ctx context.Context) (bool, error) {
			mu.Lock()
			second++
			mu.Unlock()
			return true, nil
		})
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, atkCancel{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	end, err := e.Client.Wait(ctx, res.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ns *enqueue.NotSucceededError
	rerr := e.Client.Result(ctx, res.ID, new(any))
	mu.Lock()
	n := second
	mu.Unlock()
	if end.State != ledger.Failed || n != 0 {
		t.Fatalf("cancelled while running: %s, second step ran %d times", end.State, n)
	}
	if !end.Cancelled || !errors.As(rerr, &ns) || !ns.Cancelled {
		t.Fatalf("an operator's cancel of the running job: Ended{State: %s, Cancelled: %v, LastError: %q}; Result: %v; want Cancelled", end.State, end.Cancelled, end.LastError, rerr)
	}
}
