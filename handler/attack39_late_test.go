package handler_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// BREAK: "When the job then ends Failed for good ... the compensations
// declared so far run, last first, each once" (docs/durable-jobs.md,
// Compensations): a compensating run taken over while its compensation b
// is in flight (its lease passed) goes on, once let go, to call
// compensation a, which the taking run had already called and recorded:
// a is called twice.
//
// A run compensating is taken over (its lease passed on the kit's clock)
// while one compensation's call is in flight: the taking run runs the
// rest; the first run, let go after, must not call again a compensation
// the taking run recorded: "the compensations declared so far run, last
// first, each once" ("a run that dies among them runs only the rest next
// time": the one in flight may be called twice, the others not).
func TestAttack39CompensationTakeover(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var r *rig39
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		for _, n := range []string{"a", "b", "c"} {
			if err := handler.Compensate(ctx, n, func(context.Context) error {
				r.call("undo %s", n)
				mu.Lock()
				order = append(order, n)
				mu.Unlock()
				if n == "b" {
					first := false
					once.Do(func() { first = true })
					if first {
						close(started)
						<-release
					}
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return handler.Permanent(errors.New("give up"))
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	ctx := context.Background()
	done := make(chan struct{})
	go func() { defer close(done); r.deliver(ctx, id, "a39", "first") }()
	<-started
	r.e.Advance(t, handler.DefaultLease+time.Minute)
	r.deliver(ctx, id, "a39", "second")
	close(release)
	<-done
	for range 2 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Minute)
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("job %s (%s); compensation calls %v", rec.State, rec.LastError, order)
	if rec.State != ledger.Failed || strings.Contains(rec.LastError, "compensation") {
		t.Fatalf("job %s (%s)", rec.State, rec.LastError)
	}
	if r.n("undo c") != 1 || r.n("undo a") != 1 || r.n("undo b") > 2 {
		t.Fatalf("promise \"the compensations declared so far run, last first, each once\": with the compensating run taken over in b, calls %v (c %d, b %d, a %d)", order, r.n("undo c"), r.n("undo b"), r.n("undo a"))
	}
}

// "a child that failed or expired is a *ChildFailedError (its state and
// last error)": a child whose deadline passes before it starts.
func TestAttack39ExpiredChild(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got error
	var r *rig39
	r = newRig39(t, rig39Opts{kid: kid39(&r), work: func(ctx context.Context, j *handler.Job[a39]) error {
		_, err := handler.Invoke[string](ctx, "k", a39Kid{N: 0}, &handler.InvokeOptions{Timeout: 24 * time.Hour,
			Enqueue: enqueue.Opts{Delay: 59 * time.Minute, Deadline: r.e.Now().Add(time.Hour)}})
		if handler.IsSleep(err) {
			return err
		}
		mu.Lock()
		got = err
		mu.Unlock()
		return nil
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	r.e.Advance(t, 2*time.Hour) // the child due at 59 min is first seen past its deadline (60 min)
	for range 3 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Minute)
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	var failed *handler.ChildFailedError
	if rec.State != ledger.Succeeded || !errors.As(got, &failed) || failed.State != ledger.Expired || r.n("kid 0") != 0 {
		t.Fatalf("promise \"a child that ... expired is a *ChildFailedError (its state and last error)\": caller %s (%s), read %v, the child ran %d times", rec.State, rec.LastError, got, r.n("kid 0"))
	}
}

// BREAK: handler.Permanent(nil) returned by a worker (what the docs'
// pattern `return handler.Permanent(err)` gives when err is nil) panics
// in the handler's own code ((*PermanentError).Error on a nil error, from
// Handler.run), killing the invocation and every job of its batch: go doc
// handler.Permanent ("Permanent marks err as not worth retrying") says
// nothing of nil, and a worker's panics are recovered, the handler's are
// not. Run in a child process, so the panic does not end this binary.
func TestAttack39PermanentNilCrashesTheHandler(t *testing.T) {
	t.Parallel()
	if os.Getenv("A39_PERMANENT_NIL") == "1" {
		r := newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
			return handler.Permanent(nil)
		}})
		id := enqueueOne(t, r.e.Client, a39{}, nil)
		r.e.Drain(t, r.h)
		t.Logf("job %s", r.e.Get(t, id).State)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAttack39PermanentNilCrashesTheHandler$", "-test.count=1")
	cmd.Env = append(os.Environ(), "A39_PERMANENT_NIL=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		line := ""
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "panic:") {
				line = l
				break
			}
		}
		t.Fatalf("a worker returning handler.Permanent(nil) crashed the handler (%v): %s", err, line)
	}
}
