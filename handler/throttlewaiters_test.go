package handler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// throttledQueued is a job of a throttled kind limited to one run at
// once.
type throttledQueued struct {
	N      int    `json:"n"`
	Tenant string `json:"tenant,omitempty"`
}

func (throttledQueued) Kind() string { return "throttled-queued" }

// throttledQueue is a handler of throttledQueued jobs under throttle and
// one run at once, on a clock that moves only when the test says, with
// SQS hops of a second (a job not yet due hops until the clock reaches
// it). The holder (N 0, of tenant "a") holds its slot until release is
// closed.
type throttledQueue struct {
	e       *awstest.Env
	h       *handler.Handler
	clock   *clock
	emf     *emfCount
	release chan struct{}
	mu      sync.Mutex
	started map[int]time.Time // each job's run's start, on the clock
}

func newThrottledQueue(t *testing.T, throttle *handler.Throttle) *throttledQueue {
	t.Helper()
	q := &throttledQueue{e: awstest.New(t, nil), clock: &clock{still: time.Now().Truncate(time.Millisecond)}, emf: &emfCount{n: map[string]int{}}, release: make(chan struct{}), started: map[int]time.Time{}}
	holding := make(chan struct{})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[throttledQueued](func(ctx context.Context, j *handler.Job[throttledQueued]) error {
		q.mu.Lock()
		_, again := q.started[j.Args.N]
		q.started[j.Args.N] = q.clock.Now()
		q.mu.Unlock()
		if j.Args.N == 0 && !again {
			close(holding)
			<-q.release
		}
		return nil
	}), &handler.KindOptions{
		Throttle:    throttle,
		Concurrency: &handler.Concurrency{Limit: 1},
	})
	var err error
	q.h, err = handler.New(q.e.Cfg, q.e.Table, q.e.QueueURL, reg, &handler.Options{
		Ledger: ledger.Options{Now: q.clock.Now}, Lease: 40 * time.Second, MaxDelay: time.Second,
		Logger: quiet, Metrics: metrics.New(&metrics.Options{Out: q.emf}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.h.Producer().Enqueue(context.Background(), throttledQueued{N: 0, Tenant: "a"}, nil); err != nil {
		t.Fatal(err)
	}
	go func() {
		for pollOnce(t, q.e.Env, q.h) == 0 { // until the holder's message came (and, released, its run ended)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	<-holding
	return q
}

// enqueue enqueues job n of tenant and handles its message: it waits
// with a ticket.
func (q *throttledQueue) enqueue(t *testing.T, n int, tenant string) string {
	t.Helper()
	res, err := q.h.Producer().Enqueue(context.Background(), throttledQueued{N: n, Tenant: tenant}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, q.e.Env, q.h, fmt.Sprintf("job %d queued", n), func() bool { rec := q.e.Get(t, res.ID); return rec.State == ledger.Scheduled && rec.Ticket != 0 })
	return res.ID
}

// visible counts the messages visible or in flight (not those in their
// SQS delay).
func (q *throttledQueue) visible(t *testing.T) int {
	t.Helper()
	a, err := q.e.SQS.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(q.e.QueueURL),
		AttributeNames: []sqstypes.QueueAttributeName{
			sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range a.Attributes {
		var i int
		_, _ = fmt.Sscan(v, &i) // a depth not a number counts 0
		n += i
	}
	return n
}

// drive handles messages until every job of ids Succeeded: when nothing
// is left to handle now, it moves the clock to the earliest run time of
// those still Scheduled (one step). It returns the steps.
func (q *throttledQueue) drive(t *testing.T, ids ...string) (steps int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; {
		var next time.Time
		waiting := false
		for _, id := range ids {
			rec := q.e.Get(t, id)
			if rec.State == ledger.Succeeded {
				continue
			}
			waiting = true
			if at := ledger.Millis(rec.RunAt); rec.State == ledger.Scheduled && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
		switch {
		case !waiting:
			return steps
		case time.Now().After(end):
			t.Fatalf("jobs not Succeeded after %d steps (clock %s on)", steps, q.clock.Now().Sub(q.clock.still))
		case pollOnce(t, q.e.Env, q.h) > 0 || q.visible(t) > 0:
		case !next.IsZero() && next.After(q.clock.Now()):
			q.clock.Advance(next.Sub(q.clock.Now()))
			steps++
		default:
			time.Sleep(20 * time.Millisecond) // a message in its SQS delay (a hop of a second), in real time
		}
	}
}

// Under a Throttle and a Concurrency, a waiter woken to the freed slot
// that its throttle then sends to a later throttle slot keeps the slot
// reserved for it until then, and starts on its throttle slot; the next
// waiter is woken by its end. Before, the deferral dropped its ticket,
// the reservation stayed for no one for a lease, and the two waiters
// deferred each other until it ended.
func TestThrottledWaiterKeepsItsSlot(t *testing.T) {
	t.Parallel()
	q := newThrottledQueue(t, &handler.Throttle{Limit: 1, Period: 10 * time.Second})
	// Each waiter comes when its throttle lets it start, and finds the
	// holder running: it waits with a ticket.
	q.clock.Advance(10 * time.Second)
	first := q.enqueue(t, 1, "")
	q.clock.Advance(10 * time.Second)
	second := q.enqueue(t, 2, "")
	for _, id := range []string{first, second} {
		if rec := q.e.Get(t, id); rec.State != ledger.Scheduled || rec.Ticket == 0 {
			t.Fatalf("waiter %s: %s with ticket %d, want Scheduled with a ticket", id, rec.State, rec.Ticket)
		}
	}
	before, released := q.emf.get(metrics.Deferred), q.clock.Now()
	// The holder ends: its slot is handed to the first waiter, whose
	// throttle slot is 10 s on (the second waiter took the last one).
	close(q.release)
	steps := q.drive(t, first, second)
	deferrals := q.emf.get(metrics.Deferred) - before
	q.mu.Lock()
	one, two := q.started[1].Sub(released), q.started[2].Sub(released)
	q.mu.Unlock()
	t.Logf("from the holder's end: %d deferrals, %d steps of the clock; the first waiter started %s on, the second %s on", deferrals, steps, one, two)
	// One deferral each, to its throttle slot (ThrottleWait before it:
	// the run waits the rest in real time, on a clock that stands still).
	if deferrals != 2 {
		t.Errorf("%d deferrals after the holder's end, want 2 (one each, to its throttle slot)", deferrals)
	}
	if one != 9*time.Second || two != 19*time.Second {
		t.Errorf("the waiters started %s and %s after the holder's end, want 9s and 19s (each on its throttle slot)", one, two)
	}
	if held, err := q.h.Holding(context.Background(), throttledQueued{}.Kind(), ""); err != nil || len(held) != 0 {
		t.Errorf("slots held at the end: %v %v", held, err)
	}
}

// A waiter woken to the freed slot that its throttle sends further than
// a lease gives the slot up at once: the next waiter, whose own throttle
// lets it start, is woken and runs with no clock moved, and the first
// starts on its throttle slot, 10 minutes on. Before, the slot stayed
// reserved for the first for a lease while nothing ran.
func TestThrottledWaiterPassesTheSlotOn(t *testing.T) {
	t.Parallel()
	q := newThrottledQueue(t, &handler.Throttle{Key: handler.ArgsKey(func(j throttledQueued) string { return j.Tenant }), Limit: 2, Period: 10 * time.Minute})
	// The holder took tenant a's first throttle slot; a waiter of a took
	// its second (given up: the holder runs), one of b its first.
	first := q.enqueue(t, 1, "a")
	second := q.enqueue(t, 2, "b")
	before, released := q.emf.get(metrics.Deferred), q.clock.Now()
	close(q.release)
	steps := q.drive(t, first, second)
	deferrals := q.emf.get(metrics.Deferred) - before
	q.mu.Lock()
	one, two := q.started[1].Sub(released), q.started[2].Sub(released)
	q.mu.Unlock()
	t.Logf("from the holder's end: %d deferrals, %d steps of the clock; the first waiter started %s on, the second %s on", deferrals, steps, one, two)
	if two != 0 {
		t.Errorf("the second waiter started %s after the holder's end, want at once (its throttle lets it)", two)
	}
	if deferrals != 1 || one != 10*time.Minute-time.Second {
		t.Errorf("the first waiter started %s after the holder's end with %d deferrals, want %s (on its throttle slot) and 1", one, deferrals, 10*time.Minute-time.Second)
	}
}
