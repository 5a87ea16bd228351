package handler_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type atkLate struct {
	N int `json:"n"`
}

func (atkLate) Kind() string { return "atk.late" }

// README, Signals: "one after the wait's timeout ledger.ErrSignalTooLate
// ... as a *ledger.SignalRefusedError with nothing written; the timeout
// itself is a *handler.SignalTimeoutError"; SignalTimeoutError's doc:
// "return it (the run fails and is retried, and the retry times out
// again at once: wrap it in Permanent to end the job)".
//
// No clock skew, one clock: a signal sent a second before the wait's
// end, its request in flight (a slow network) while the timeout's run
// claims the job. The signal's "too late" condition was built with the
// caller's now (before the end), so DynamoDB accepts it while the job
// runs: the call returns nil, and the wait, which read its claim's
// record, times out. The worker ends the job as the docs say (Permanent),
// and the job is Failed with a signal that was accepted and never
// delivered.
func TestAttackSignalAcceptedAfterTheWaitTimedOut(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	ft, fc := (&awstest.Env{Env: e}).Faulty()
	cl, err := enqueue.New(fc, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet, Ledger: ledger.Options{Now: e.Now}})
	if err != nil {
		t.Fatal(err)
	}
	held, release, signalled := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass,
		Match: func(b []byte) bool { return strings.Contains(string(b), "nexjob:signal:approval") },
		Before: func(*http.Request, []byte) {
			once.Do(func() { close(held) })
			<-release
		}})
	var mu sync.Mutex
	var timedOut bool
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[atkLate](func(ctx context.Context, j *handler.Job[atkLate]) error {
		_, err := handler.WaitForSignal[approval](ctx, "approval", time.Hour)
		var timeout *handler.SignalTimeoutError
		if errors.As(err, &timeout) {
			// The timeout's run: the slow signal lands now.
			close(release)
			select {
			case err := <-signalled:
				signalled <- err
			case <-time.After(10 * time.Second):
			}
			mu.Lock()
			timedOut = true
			mu.Unlock()
			return handler.Permanent(err) // as the docs say, to end the job
		}
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, atkLate{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h) // waits, until now + 1 h
	e.RequireState(t, res.ID, ledger.Scheduled)
	// A minute before the wait's end: the kit's clock runs on in real
	// time, and a loaded machine took over a second between this Advance
	// and the signal's read, which then refused the signal as too late
	// and never sent it (a fresh-clone make test hung here for 18 min on
	// the receive below, 2026-12-06).
	e.Advance(t, time.Hour-time.Minute)
	go func() { signalled <- cl.Signal(ctx, res.ID, "approval", approval{By: "ada"}) }()
	select {
	case <-held: // the signal's request is built (its now taken) and in flight
	case err := <-signalled:
		t.Fatalf("the signal returned before its write was sent: %v", err)
	}
	e.Advance(t, 2*time.Minute) // the wait's end passes
	e.Drain(t, h)
	var sigErr error
	select {
	case sigErr = <-signalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the signal never returned")
	}
	rec := e.Get(t, res.ID)
	mu.Lock()
	to := timedOut
	mu.Unlock()
	if sigErr == nil && to {
		t.Fatalf("the signal's call returned nil (not ErrSignalTooLate), yet the wait timed out: job %s, last error %q, the signal kept on the record: %v",
			rec.State, rec.LastError, rec.Steps[ledger.SignalStep("approval")] != "")
	}
}
