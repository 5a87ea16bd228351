package nexjobtest_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"

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
	if rec := e.RequireState(t, bad.ID, ledger.Failed); rec.LastError != "permanent: no such person" {
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
