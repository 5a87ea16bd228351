package enqueue_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
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

// lookup is the result tests' job: its worker returns a hit, or fails
// permanently for Name "missing".
type lookup struct{ Name string }

func (lookup) Kind() string { return "lookup" }

type hit struct {
	Name  string `json:"name"`
	Score int    `json:"score"`
}

// plain runs with a worker that keeps no result.
type plain struct{}

func (plain) Kind() string { return "plain" }

// resultKit is a kit Env and a handler for lookup (a result worker) and
// plain.
func resultKit(t *testing.T) (*nexjobtest.Env, *handler.Handler) {
	t.Helper()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[lookup, hit](func(_ context.Context, j *handler.Job[lookup]) (hit, error) {
		if j.Args.Name == "missing" {
			return hit{}, handler.Permanent(errors.New("no such name"))
		}
		return hit{Name: j.Args.Name, Score: len(j.Args.Name)}, nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[plain](func(context.Context, *handler.Job[plain]) error { return nil }), nil)
	return e, e.Handler(t, reg, &handler.Options{Logger: quietLog})
}

func enqueued(t *testing.T, c *enqueue.Client, args enqueue.JobArgs, opts *enqueue.Opts) string {
	t.Helper()
	res, err := c.Enqueue(context.Background(), args, opts)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// TestResultReadTyped: Result reads a Succeeded job's result into the
// caller's type; before the job ended it is a *NotEndedError, for a job
// that kept none ErrNoResult, for one that failed a *NotSucceededError
// with its state and last error (Cancelled for an operator's cancel), for
// an unknown id ledger.ErrNotFound; a result that does not decode into
// the caller's type says so without quoting it. A requeue removes it.
func TestResultReadTyped(t *testing.T) {
	t.Parallel()
	e, h := resultKit(t)
	ctx := context.Background()
	id := enqueued(t, e.Client, lookup{Name: "ada"}, nil)
	var got hit
	var notEnded *enqueue.NotEndedError
	if err := e.Client.Result(ctx, id, &got); !errors.As(err, &notEnded) || notEnded.State != ledger.Enqueued || notEnded.JobID != id {
		t.Fatalf("Result before the run: %v, want a *NotEndedError (Enqueued)", err)
	}
	none := enqueued(t, e.Client, plain{}, nil)
	failed := enqueued(t, e.Client, lookup{Name: "missing"}, nil)
	cancelled := enqueued(t, e.Client, lookup{Name: "later"}, &enqueue.Opts{Delay: time.Hour})
	if _, err := e.Client.Cancel(ctx, cancelled, "not wanted", 0); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)

	if err := e.Client.Result(ctx, id, &got); err != nil || got != (hit{Name: "ada", Score: 3}) {
		t.Fatalf("Result: %+v, %v", got, err)
	}
	if err := e.Client.Result(ctx, none, &got); !errors.Is(err, enqueue.ErrNoResult) {
		t.Fatalf("Result of a job that kept none: %v, want ErrNoResult", err)
	}
	var notOK *enqueue.NotSucceededError
	if err := e.Client.Result(ctx, failed, &got); !errors.As(err, &notOK) || notOK.State != ledger.Failed || notOK.Cancelled || !strings.Contains(notOK.LastError, "no such name") {
		t.Fatalf("Result of a failed job: %v, want a *NotSucceededError (Failed, its last error)", err)
	}
	if err := e.Client.Result(ctx, cancelled, &got); !errors.As(err, &notOK) || !notOK.Cancelled || notOK.LastError != "not wanted" {
		t.Fatalf("Result of a cancelled job: %v, want a *NotSucceededError (cancelled)", err)
	}
	if err := e.Client.Result(ctx, strings.Repeat("a", 26), &got); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Result of an unknown job: %v, want ErrNotFound", err)
	}
	if err := e.Client.Result(ctx, "not an id", &got); !errors.Is(err, ledger.ErrBadID) {
		t.Fatalf("Result of a malformed id: %v, want ErrBadID", err)
	}
	var wrong struct{ Name int }
	if err := e.Client.Result(ctx, id, &wrong); err == nil || strings.Contains(err.Error(), "ada") || !strings.Contains(err.Error(), `field "Name"`) {
		t.Fatalf("Result into the wrong type: %v, want an error naming the field, not the value", err)
	}
	// A requeue leaves the result unread: the job runs again and has none
	// yet (its item keeps the run before's until the next run ends: an
	// operator's update may not name the result).
	if _, err := e.Client.Requeue(ctx, id); err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, id); rec.SucceededResult() != "" {
		t.Fatalf("a requeued job keeps the result %q", rec.SucceededResult())
	}
	if err := e.Client.Result(ctx, id, &got); !errors.As(err, &notEnded) || notEnded.State != ledger.Enqueued {
		t.Fatalf("Result of a requeued job: %v, want a *NotEndedError (Enqueued)", err)
	}
}

// waited runs Wait in the background; its outcome comes on the channel.
func waited(c *enqueue.Client, ctx context.Context, id string) <-chan waitOutcome {
	ch := make(chan waitOutcome, 1)
	go func() {
		end, err := c.Wait(ctx, id, &enqueue.WaitOptions{Interval: 20 * time.Millisecond, MaxInterval: 100 * time.Millisecond})
		ch <- waitOutcome{end, err}
	}()
	return ch
}

type waitOutcome struct {
	end enqueue.Ended
	err error
}

// TestWaitReturnsWhenTheJobEnds: Wait, started before the run, returns
// once the job Succeeded (its result decodes), Failed (its last error)
// or Expired.
func TestWaitReturnsWhenTheJobEnds(t *testing.T) {
	t.Parallel()
	e, h := resultKit(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ok := enqueued(t, e.Client, lookup{Name: "grace"}, nil)
	failed := enqueued(t, e.Client, lookup{Name: "missing"}, nil)
	expired := enqueued(t, e.Client, lookup{Name: "late"}, &enqueue.Opts{Deadline: e.Now().Add(time.Minute)})
	waits := map[string]<-chan waitOutcome{ok: waited(e.Client, ctx, ok), failed: waited(e.Client, ctx, failed), expired: waited(e.Client, ctx, expired)}
	time.Sleep(100 * time.Millisecond) // a few polls of jobs not ended
	e.Advance(t, 2*time.Minute)
	e.Drain(t, h)

	got := <-waits[ok]
	var v hit
	if got.err != nil || got.end.State != ledger.Succeeded || got.end.Decode(&v) != nil || v.Score != 5 {
		t.Fatalf("Wait on a success: %+v %v (decoded %+v)", got.end, got.err, v)
	}
	got = <-waits[failed]
	var notOK *enqueue.NotSucceededError
	if got.err != nil || got.end.State != ledger.Failed || !strings.Contains(got.end.LastError, "no such name") || !errors.As(got.end.Decode(&v), &notOK) {
		t.Fatalf("Wait on a failure: %+v %v", got.end, got.err)
	}
	got = <-waits[expired]
	if got.err != nil || got.end.State != ledger.Expired || got.end.Result != nil {
		t.Fatalf("Wait on an expiry: %+v %v", got.end, got.err)
	}
}

// TestWaitEndsWithItsContext: no worker runs; Wait returns when its
// context ends, a *NotEndedError with the state last read that wraps the
// context's error. A job deleted during the wait ends the wait: Delete
// first ends an active job (Failed, cancelled, "deleted by an operator")
// and then removes its record, so the wait reads one or the other.
func TestWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	e, _ := resultKit(t)
	id := enqueued(t, e.Client, lookup{Name: "never"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := e.Client.Wait(ctx, id, nil)
	var notEnded *enqueue.NotEndedError
	if !errors.As(err, &notEnded) || notEnded.State != ledger.Enqueued || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its context: %v, want a *NotEndedError (Enqueued) wrapping DeadlineExceeded", err)
	}
	gone := waited(e.Client, context.Background(), id)
	if err := e.Client.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-gone:
		deleted := got.err == nil && got.end.State == ledger.Failed && got.end.Cancelled && strings.Contains(got.end.LastError, "deleted")
		if !errors.Is(got.err, ledger.ErrNotFound) && !deleted {
			t.Fatalf("Wait on a deleted job: %+v %v, want ErrNotFound or its deletion's Failed end", got.end, got.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait on a deleted job did not return")
	}
}

// TestResultAndWaitReads pins the reads: Result one strongly consistent
// GetItem; Wait on an ended job one eventually consistent GetItem; Wait
// on a job not found reads once more, strongly consistent, then returns
// ErrNotFound.
func TestResultAndWaitReads(t *testing.T) {
	t.Parallel()
	e, h := resultKit(t)
	id := enqueued(t, e.Client, lookup{Name: "reads"}, nil)
	e.Drain(t, h)
	ft, cfg := (&awstest.Env{Env: e}).Faulty()
	counter := awstest.Count(&cfg)
	var mu sync.Mutex
	var reads []string
	ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Pass, Times: faults.Forever, Before: func(_ *http.Request, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(string(body), `"ConsistentRead":true`) {
			reads = append(reads, "consistent")
		} else {
			reads = append(reads, "eventual")
		}
	}})
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, step := range []struct {
		name string
		do   func() error
		want []string
	}{
		{"Result", func() error { var v hit; return c.Result(ctx, id, &v) }, []string{"consistent"}},
		{"Wait on an ended job", func() error { _, err := c.Wait(ctx, id, nil); return err }, []string{"eventual"}},
		{"Wait on an unknown job", func() error {
			_, err := c.Wait(ctx, strings.Repeat("b", 26), nil)
			if errors.Is(err, ledger.ErrNotFound) {
				return nil
			}
			return err
		}, []string{"eventual", "consistent"}},
	} {
		counter.Reset()
		mu.Lock()
		reads = nil
		mu.Unlock()
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		mu.Lock()
		got := slices.Clone(reads)
		mu.Unlock()
		if calls := counter.Calls(); !slices.Equal(got, step.want) || len(calls) != len(step.want) {
			t.Errorf("%s: requests %v, reads %v; want %v", step.name, calls, got, step.want)
		}
	}
}
