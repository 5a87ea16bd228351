package handler_test

import (
	"bytes"
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type raceNapper struct{ Order string }

func (raceNapper) Kind() string { return "cancel-race-raceNapper" }

// Cancel racing a run that ends in a sleep (issue 38 item 6): Withdraw
// found the job Processing, the run's sleep landed, and RequestCancel
// found it Scheduled; the operator was told the job "is Scheduled; only
// Enqueued or Scheduled jobs can be cancelled", and it ran on when it
// woke. Cancel now follows the state until it can say which it did.
func TestCancelRacingASleepIsNotLost(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	hft := faults.New(nil)
	cfg := e.Cfg
	e.Cfg = faults.Config(cfg, hft)
	slept := make(chan struct{})
	hft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass,
		Match: func(b []byte) bool {
			return bytes.Contains(b, []byte(`"Scheduled"`)) && bytes.Contains(b, []byte(`defers`))
		},
		After: func() { close(slept) }}) // the run's end in its sleep, applied
	inRun, release := make(chan struct{}), make(chan struct{})
	var shipped atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[raceNapper](func(ctx context.Context, j *handler.Job[raceNapper]) error {
		if _, err := handler.Step(ctx, "charge", func(context.Context) (bool, error) { return true, nil }); err != nil {
			return err
		}
		select {
		case inRun <- struct{}{}:
			<-release
		default:
		}
		if err := handler.Sleep(ctx, "cool-off", time.Hour); err != nil {
			return err
		}
		shipped.Add(1)
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, raceNapper{Order: "o-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	go func() { defer close(drained); e.Drain(t, h) }()
	<-inRun // the run holds its charge, about to sleep
	// The operator's Cancel: its withdrawal finds the job Processing; the
	// run's sleep lands before its request to stop.
	cft := faults.New(nil)
	cft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass,
		Match:  func(b []byte) bool { return bytes.Contains(b, []byte(`cancelReq`)) },
		Before: func(*http.Request, []byte) { close(release); <-slept }})
	op, err := enqueue.New(faults.Config(cfg, cft), e.Table, e.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := op.Cancel(ctx, res.ID, "", 0)
	<-drained
	if err != nil || rec.State != ledger.Failed || !rec.Cancelled {
		t.Fatalf("Cancel of a job whose run slept meanwhile: %v (%s, cancelled %v); want it cancelled", err, rec.State, rec.Cancelled)
	}
	e.Advance(t, 2*time.Hour)
	e.Drain(t, h)
	if got := e.Get(t, res.ID); got.State != ledger.Failed || !got.Cancelled || shipped.Load() != 0 {
		t.Fatalf("after its sleep's end: %s (cancelled %v), shipped %d times; want it cancelled, never shipped", got.State, got.Cancelled, shipped.Load())
	}
}
