package handler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type stopJob struct{}

func (stopJob) Kind() string { return "stop-job" }

// A cancel asked of a running job whose run then ends in a sleep without
// meeting a step's record is honoured at the next run, before any of its
// code: the step after the sleep never runs (it used to: the request was
// left on the record and nothing read it; helper-8's report).
func TestCancelRequestedOfARunThatSleptIsHonoured(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	started, proceed := make(chan struct{}, 1), make(chan struct{})
	var mu sync.Mutex
	shipped := 0
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[stopJob](func(ctx context.Context, j *handler.Job[stopJob]) error {
		if j.Attempt == 1 {
			select {
			case started <- struct{}{}:
				<-proceed
			default:
			}
		}
		if err := handler.Sleep(ctx, "wait", time.Hour); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "ship", func(context.Context) (int, error) {
			mu.Lock()
			shipped++
			mu.Unlock()
			return 1, nil
		})
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	id := enqueueOne(t, e.Client, stopJob{}, nil)
	done := make(chan struct{})
	go func() { defer close(done); e.DrainNow(t, h) }()
	<-started
	_, err := e.Client.Cancel(context.Background(), id, "customer left", 0)
	var asked *enqueue.CancelRequestedError
	if !errors.As(err, &asked) {
		t.Errorf("Cancel: %v, want a *CancelRequestedError", err)
	}
	close(proceed)
	<-done
	rec := e.RunToEnd(t, h, id)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Failed || !rec.Cancelled || shipped != 0 {
		t.Fatalf("%s cancelled=%v (%s), shipped %d; want Failed, cancelled, never shipped", rec.State, rec.Cancelled, rec.LastError, shipped)
	}
}
