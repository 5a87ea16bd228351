package handler_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// A job that ran is never "never started" (issue 38 items 2 and 3): a run
// that sleeps or waits gives its attempt back, and the attempt count alone
// read a job asleep after its charge as one that never ran. Its Deadline
// expired it ("deadline passed before the job started": charged, never
// shipped), and a debounced enqueue folded into it (its args replaced,
// its wake moved, the new charge never made).

type order struct {
	Order string        `json:"order"`
	Nap   time.Duration `json:"nap"`
	Wait  bool          `json:"wait"`
}

func (order) Kind() string { return "started-order" }

type orderRig struct {
	e                *nexjobtest.Env
	h                *handler.Handler
	mu               sync.Mutex
	charged, shipped map[string][]string // job id: the orders charged, shipped
	approvedBy       map[string]string
}

func newOrderRig(t *testing.T) *orderRig {
	t.Helper()
	r := &orderRig{e: nexjobtest.New(t, nil), charged: map[string][]string{}, shipped: map[string][]string{}, approvedBy: map[string]string{}}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[order](func(ctx context.Context, j *handler.Job[order]) error {
		if _, err := handler.Step(ctx, "charge", func(context.Context) (bool, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.charged[j.ID] = append(r.charged[j.ID], j.Args.Order)
			return true, nil
		}); err != nil {
			return err
		}
		if j.Args.Wait {
			a, err := handler.WaitForSignal[approval](ctx, "approval", j.Args.Nap)
			if err != nil {
				return err
			}
			r.mu.Lock()
			r.approvedBy[j.ID] = a.By
			r.mu.Unlock()
		} else if err := handler.Sleep(ctx, "cool-off", j.Args.Nap); err != nil {
			return err
		}
		r.mu.Lock()
		r.shipped[j.ID] = append(r.shipped[j.ID], j.Args.Order)
		r.mu.Unlock()
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

func (r *orderRig) enqueue(t *testing.T, a order, o *enqueue.Opts) string {
	t.Helper()
	res, err := r.e.Client.Enqueue(context.Background(), a, o)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// A Deadline bounds the start: a job that ran its charge and slept (or
// waited) past it runs on, and a signal sent meanwhile is its wait's.
func TestDeadlineNeverExpiresAJobThatRan(t *testing.T) {
	t.Parallel()
	r := newOrderRig(t)
	deadline := &enqueue.Opts{Deadline: r.e.Now().Add(time.Minute)}
	slept := r.enqueue(t, order{Order: "o-1", Nap: 10 * time.Minute}, deadline)
	waited := r.enqueue(t, order{Order: "o-2", Nap: time.Hour, Wait: true}, deadline)
	r.e.Drain(t, r.h)
	r.e.Advance(t, 5*time.Minute) // past the deadline, both asleep
	if err := r.e.Client.Signal(context.Background(), waited, "approval", approval{By: "ada"}); err != nil {
		t.Fatalf("a signal to the waiting job past its deadline: %v", err)
	}
	r.e.Drain(t, r.h)
	r.e.Advance(t, 6*time.Minute) // the sleep's end
	r.e.Drain(t, r.h)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range []string{slept, waited} {
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || len(r.charged[id]) != 1 || len(r.shipped[id]) != 1 {
			t.Errorf("job %s: %s (%s), charged %v, shipped %v; want Succeeded, charged and shipped once", id, rec.State, rec.LastError, r.charged[id], r.shipped[id])
		}
	}
	if r.approvedBy[waited] != "ada" {
		t.Errorf("the waiting job's approval: %q, want the signal's", r.approvedBy[waited])
	}
	// A job that never started still expires: the deadline's promise.
	late := r.enqueue(t, order{Order: "o-3", Nap: time.Minute}, &enqueue.Opts{Delay: time.Minute, Deadline: r.e.Now().Add(90 * time.Second)})
	r.e.Advance(t, 3*time.Minute)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, late); rec.State != ledger.Expired || len(r.charged[late]) != 0 {
		t.Errorf("a job due after its deadline: %s, charged %v; want Expired, never charged", rec.State, r.charged[late])
	}
}

// A debounced enqueue folds only into a job that never ran: one that
// charged and sleeps keeps its args and its wake, and the enqueue starts
// the next window, whose job charges its own order.
func TestDebounceNeverFoldsIntoAJobThatRan(t *testing.T) {
	t.Parallel()
	r := newOrderRig(t)
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "cart-7", Period: time.Second}}
	first := r.enqueue(t, order{Order: "o-1", Nap: time.Hour}, db)
	r.e.Advance(t, 2*time.Second)
	r.e.Drain(t, r.h) // the first job charges o-1 and sleeps an hour
	if rec := r.e.Get(t, first); rec.State != ledger.Scheduled {
		t.Fatalf("the first job after its run: %s (%s), want Scheduled in its sleep", rec.State, rec.LastError)
	}
	wake := r.e.Get(t, first).RunAt
	second := r.enqueue(t, order{Order: "o-2", Nap: time.Hour}, db)
	if second == first {
		t.Fatalf("the second enqueue folded into the sleeping job %s", first)
	}
	if rec := r.e.Get(t, first); rec.RunAt != wake || rec.Args != `{"order":"o-1","nap":3600000000000,"wait":false}` {
		t.Fatalf("the sleeping job after the second enqueue: runs at %d (was %d), args %s; want both unchanged", rec.RunAt, wake, rec.Args)
	}
	r.e.Advance(t, 2*time.Second)
	r.e.Drain(t, r.h)
	r.e.Advance(t, time.Hour)
	r.e.Drain(t, r.h)
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, o := range map[string]string{first: "o-1", second: "o-2"} {
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || len(r.charged[id]) != 1 || r.charged[id][0] != o || len(r.shipped[id]) != 1 || r.shipped[id][0] != o {
			t.Errorf("job %s: %s, charged %v, shipped %v; want Succeeded, %s charged and shipped once", id, rec.State, r.charged[id], r.shipped[id], o)
		}
	}
}
