package handler_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
)

// bulkRow is a kind whose jobs go to the "bulk" queue by default.
type bulkRow struct{ Row int }

func (bulkRow) Kind() string                  { return "bulk-row" }
func (bulkRow) JobDefaults() enqueue.Defaults { return enqueue.Defaults{Queue: "bulk"} }

// charge is a kind with no queue of its own: Opts.Queue chooses.
type charge struct{ Order string }

func (charge) Kind() string { return "charge" }

// queuesEnv is an Env with the named queues bulk and payments (a
// message that comes back is visible again in 2 s).
func queuesEnv(t *testing.T) *nexjobtest.Env {
	return nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk", "payments"}, Queue: provision.QueueSpec{VisibilityTimeout: 2 * time.Second}})
}

// pollOnly feeds one named queue to h, as that queue's event source does.
func pollOnly(e *nexjobtest.Env, q string, h *handler.Handler) *poller.Poller {
	return poller.New(e.SQS, e.Queues[q], h.Handle, &poller.Options{WaitTime: -1})
}

// A backlog on the bulk queue does not hold payments back: each named
// queue has its own messages (and, deployed, its own event source and
// MaxConcurrency), so draining only the payments queue runs every payment,
// its retry included (a retry goes back to the job's queue), while the
// bulk backlog waits untouched. Nothing lands on the default job queue.
func TestNamedQueuesDoNotStarveEachOther(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[bulkRow](func(ctx context.Context, j *handler.Job[bulkRow]) error {
		mu.Lock()
		defer mu.Unlock()
		runs["bulk"]++
		return nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[charge](func(ctx context.Context, j *handler.Job[charge]) error {
		mu.Lock()
		defer mu.Unlock()
		runs[j.Args.Order]++
		if j.Args.Order == "o-1" && j.Attempt == 1 {
			return errors.New("card network timeout")
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return 0 }})
	h := e.Handler(t, reg, nil)
	for i := range 30 {
		if _, err := e.Client.Enqueue(ctx, bulkRow{Row: i}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for i := range 3 {
		res, err := e.Client.Enqueue(ctx, charge{Order: "o-" + strconv.Itoa(i)}, &enqueue.Opts{Queue: "payments"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	// At least one message a job (a send the SDK resent after a lost
	// reply, on a loaded machine, leaves two: SQS delivers at least once),
	// none on the job queue.
	got := [3]int{e.QueueDepth(t, e.QueueURL), e.QueueDepth(t, e.Queues["bulk"]), e.QueueDepth(t, e.Queues["payments"])}
	if got[0] != 0 || got[1] < 30 || got[2] < 3 {
		t.Fatalf("messages on the job, bulk and payments queues: %v, want 0, at least 30, at least 3", got)
	}
	// Only the payments queue is consumed until every payment is done.
	p := pollOnly(e, "payments", h)
	for end := time.Now().Add(time.Minute); ; {
		if _, err := p.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, id := range ids {
			if e.Get(t, id).State == ledger.Succeeded {
				done++
			}
		}
		if done == len(ids) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of 3 payments done in a minute from the payments queue alone", done)
		}
	}
	mu.Lock()
	if runs["bulk"] != 0 || runs["o-1"] != 2 || runs["o-0"] != 1 || runs["o-2"] != 1 {
		t.Fatalf("runs %v: want the payments only, o-1 twice (its retry on the payments queue)", runs)
	}
	mu.Unlock()
	if rec := e.Get(t, ids[1]); rec.Queue != "payments" || rec.Attempt != 2 {
		t.Fatalf("o-1: queue %q attempt %d, want payments 2", rec.Queue, rec.Attempt)
	}
	if n := e.QueueDepth(t, e.Queues["bulk"]); n != got[1] {
		t.Fatalf("the bulk backlog is %d, want the %d untouched", n, got[1])
	}
	e.Drain(t, h)
	mu.Lock()
	defer mu.Unlock()
	if runs["bulk"] != 30 {
		t.Fatalf("bulk rows run %d times, want 30", runs["bulk"])
	}
}

// A queue name the client does not know is refused before anything is
// written or sent, with a typed error.
func TestUnknownQueueIsRefused(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	_, err := e.Client.Enqueue(context.Background(), charge{Order: "x"}, &enqueue.Opts{Queue: "refunds", IdempotencyKey: "x"})
	var in *enqueue.InputError
	if !errors.As(err, &in) || in.Field != "Queue" || !errors.Is(err, enqueue.ErrUnknownQueue) || !errors.Is(err, enqueue.ErrInvalidInput) {
		t.Fatalf("err %v, want an *InputError on Queue matching ErrUnknownQueue", err)
	}
	if recs := e.Scan(t); len(recs) != 0 {
		t.Fatalf("%d records written for a refused enqueue", len(recs))
	}
	for _, url := range []string{e.QueueURL, e.Queues["bulk"], e.Queues["payments"]} {
		if n := e.QueueDepth(t, url); n != 0 {
			t.Fatalf("%d messages sent for a refused enqueue", n)
		}
	}
}

// The send to a named queue under faults: applied but its reply lost (the
// SDK's retry sends a second copy; the job runs once), and throttled past
// the SDK's retries (a DispatchError, the job marked unsent; the caller's
// retry with its key re-sends to the same named queue and the job runs
// once). Nothing goes to the default queue.
func TestNamedQueueSendUnderFaults(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ft, fcfg := (&awstest.Env{Env: e}).Faulty()
	c, err := enqueue.New(fcfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Queues: e.Queues, Ledger: ledger.Options{Now: e.Now}, MaxDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(ctx context.Context, j *handler.Job[charge]) error {
		mu.Lock()
		defer mu.Unlock()
		runs[j.Args.Order]++
		return nil
	}), nil)
	h := e.Handler(t, reg, nil)

	lost := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.LostReply})
	a, err := c.Enqueue(ctx, charge{Order: "lost"}, &enqueue.Opts{Queue: "payments", IdempotencyKey: "lost"})
	if err != nil || lost.Fired() != 1 {
		t.Fatalf("lost reply: %+v %v (fired %d), want the SDK's retry to succeed", a, err, lost.Fired())
	}

	throttle := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
	_, err = c.Enqueue(ctx, charge{Order: "throttled"}, &enqueue.Opts{Queue: "payments", IdempotencyKey: "throttled"})
	var de *enqueue.DispatchError
	if !errors.As(err, &de) || throttle.Fired() != faults.Attempts {
		t.Fatalf("throttled past the retries: %v, want a DispatchError", err)
	}
	if rec := e.Get(t, de.JobID); !rec.Undispatched || rec.Queue != "payments" {
		t.Fatalf("unsent job: undispatched %v queue %q, want true payments", rec.Undispatched, rec.Queue)
	}
	again, err := c.Enqueue(ctx, charge{Order: "throttled"}, &enqueue.Opts{Queue: "payments", IdempotencyKey: "throttled"})
	if err != nil || !again.Duplicate || !again.Redispatched || again.ID != de.JobID {
		t.Fatalf("the caller's retry: %+v %v, want the same job re-sent", again, err)
	}
	if n := e.QueueDepth(t, e.QueueURL); n != 0 {
		t.Fatalf("%d messages on the default queue", n)
	}
	p := pollOnly(e, "payments", h)
	for end := time.Now().Add(time.Minute); e.Get(t, a.ID).State != ledger.Succeeded || e.Get(t, de.JobID).State != ledger.Succeeded; {
		if time.Now().After(end) {
			t.Fatal("the payments did not run from the payments queue in a minute")
		}
		if _, err := p.Poll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.Drain(t, h) // the lost reply's second copy finds the job done
	mu.Lock()
	defer mu.Unlock()
	if runs["lost"] != 1 || runs["throttled"] != 1 {
		t.Fatalf("runs %v, want each job once", runs)
	}
}

// A job on a named queue costs what one on the job queue does: one
// PutItem and one SendMessage to enqueue, two UpdateItems to run.
func TestNamedQueueCosts(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	cfg := e.Cfg
	cnt := awstest.Count(&cfg)
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Queues: e.Queues})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, q := range []string{"", "payments"} {
		cnt.Reset()
		if _, err := c.Enqueue(ctx, charge{Order: "c-" + q}, &enqueue.Opts{Queue: q, IdempotencyKey: "c-" + q}); err != nil {
			t.Fatal(err)
		}
		if got := cnt.Calls(); len(got) != 2 || got[0] != "DynamoDB.PutItem" || got[1] != "SQS.SendMessage" {
			t.Fatalf("queue %q: enqueue made %v, want PutItem, SendMessage", q, got)
		}
	}
}
