package nexjobtest_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Run without AWS_ENDPOINT_URL, Main starts the emulator itself.
func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

type greet struct{ Name string }

func (greet) Kind() string { return "greet" }

func TestKitRunsTheRealHandler(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var ran []string
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[greet](func(_ context.Context, j *handler.Job[greet]) error {
		ran = append(ran, j.Args.Name)
		if j.Args.Name == "nobody" {
			return handler.Permanent(errors.New("no such person"))
		}
		return nil
	}), nil)
	ok, err := e.Client.Enqueue(context.Background(), greet{Name: "ada"}, &enqueue.Opts{IdempotencyKey: "greet-ada"})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := e.Client.Enqueue(context.Background(), greet{Name: "nobody"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.RequireEnqueued(t, "greet", "greet-ada"); rec.ID != ok.ID {
		t.Fatalf("the key is held by %s, want %s", rec.ID, ok.ID)
	}
	e.Drain(t, e.Handler(t, reg, nil))
	e.RequireState(t, ok.ID, ledger.Succeeded)
	if rec := e.RequireState(t, bad.ID, ledger.Failed); rec.LastError != "no such person" {
		t.Fatalf("last error %q", rec.LastError)
	}
	if len(ran) != 2 {
		t.Fatalf("ran %v", ran)
	}
	e.RequireNoJob(t, "greet-nobody")
}

// The helpers fail the test when the ledger says otherwise.
func TestKitAssertionsFail(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	res, err := e.Client.Enqueue(context.Background(), greet{Name: "bob"}, &enqueue.Opts{IdempotencyKey: "greet-bob"})
	if err != nil {
		t.Fatal(err)
	}
	for name, check := range map[string]func(tb testing.TB){
		"RequireState":    func(tb testing.TB) { e.RequireState(tb, res.ID, ledger.Succeeded) },
		"RequireEnqueued": func(tb testing.TB) { e.RequireEnqueued(tb, "other-kind", "greet-bob") },
		"RequireNoJob":    func(tb testing.TB) { e.RequireNoJob(tb, "greet-bob") },
		"unknown key":     func(tb testing.TB) { e.RequireEnqueued(tb, "greet", "greet-nobody") },
	} {
		if !fails(check) {
			t.Errorf("%s did not fail", name)
		}
	}
}

// fails runs check on a recorder and reports whether it failed.
func fails(check func(testing.TB)) bool {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	<-done
	return r.failed
}

type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Fatalf(string, ...any) { r.failed = true; runtimeGoexit() }

func runtimeGoexit() { runtime.Goexit() }

// RunToEnd: a durable job that sleeps a month, waits a year for a signal
// that never comes (its timeout), invokes a child that retries after a
// 10-minute backoff, and fails once after a 2-hour backoff, ends in one
// call with no test sleep, and the steps are asserted on.
func TestRunToEndAdvancesTimeByItself(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	childRuns := 0
	handler.AddWorkerResult(reg, handler.ResultFunc[rteChild, int](func(ctx context.Context, j *handler.Job[rteChild]) (int, error) {
		childRuns++
		if j.Attempt == 1 {
			return 0, errors.New("not yet")
		}
		return 7, nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return 10 * time.Minute }})
	handler.AddWorker(reg, handler.WorkFunc[rteJob](func(ctx context.Context, j *handler.Job[rteJob]) error {
		if err := handler.Sleep(ctx, "month", 30*24*time.Hour); err != nil {
			return err
		}
		_, err := handler.WaitForSignal[string](ctx, "approval", 365*24*time.Hour)
		var late *handler.SignalTimeoutError
		if !errors.As(err, &late) {
			return err
		}
		v, err := handler.Invoke[int](ctx, "child", rteChild{}, nil)
		if err != nil {
			return err
		}
		if _, err := handler.Step(ctx, "done", func(context.Context) (int, error) { return v, nil }); err != nil {
			return err
		}
		if j.Attempt == 1 {
			return errors.New("once more")
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return 2 * time.Hour }})
	h := e.Handler(t, reg, nil)
	start := e.Now()
	res, err := e.Client.Enqueue(context.Background(), rteJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.RunToEnd(t, h, res.ID)
	if rec.State != ledger.Succeeded || rec.Attempt != 2 || rec.Steps["done"] != "7" || childRuns != 2 {
		t.Fatalf("%s at attempt %d, steps %v, child ran %d times", rec.State, rec.Attempt, rec.Steps, childRuns)
	}
	if gone := e.Now().Sub(start); gone < 395*24*time.Hour {
		t.Fatalf("the clock moved %s, less than the month, the year and the backoffs", gone)
	}

}

type rteJob struct{}

func (rteJob) Kind() string { return "rte-job" }

type rteChild struct{}

func (rteChild) Kind() string { return "rte-child" }

// Pending names each job not ended: its id, kind, state and run time.
func TestPendingNamesWhatIsLeft(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	res, err := e.Client.Enqueue(context.Background(), rteJob{}, &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	got := e.Pending(t)
	for _, want := range []string{res.ID, "rte-job", "Scheduled", "(in 1h0m0s)", "attempt 0 of"} {
		if !strings.Contains(got, want) {
			t.Fatalf("Pending:\n%s\nwant %q in it", got, want)
		}
	}
}
