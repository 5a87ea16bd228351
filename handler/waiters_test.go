package handler_test

import (
	"bytes"
	"context"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Regression tests for issue 27, item 12: concurrency waiters cost
// linear in their number, and start in the order they came.

// queued is a kind limited to one run at once.
type queued struct {
	N int `json:"n"`
}

func (queued) Kind() string { return "queued" }

// emfCount counts the EMF lines that record a metric.
type emfCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *emfCount) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, line := range bytes.Split(p, []byte("\n")) {
		for _, m := range []string{metrics.Deferred, metrics.Succeeded} {
			if bytes.Contains(line, []byte(`"`+m+`":1`)) {
				c.n[m]++
			}
		}
	}
	return len(p), nil
}

func (c *emfCount) get(m string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[m]
}

// queueOf runs n waiters behind a holder of a Limit of 1: the holder
// holds the slot until all n are deferred, then ends; the waiters are
// polled until all ran, each for 20 ms. It returns the deferrals, the
// DynamoDB requests from the holder's end on, and each waiter's ticket
// in the order the waiters started.
func queueOf(t *testing.T, n int) (deferrals, requests int, started []int64, resent bool) {
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	calls := awstest.Count(&cfg) // every operation call, never reset
	attempts := &countingTransport{base: http.DefaultTransport}
	cfg.HTTPClient = &http.Client{Transport: attempts}
	emf := &emfCount{n: map[string]int{}}
	release, holding := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var order []string
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[queued](func(ctx context.Context, j *handler.Job[queued]) error {
		if j.Args.N == 0 {
			close(holding)
			<-release // the holder
			return nil
		}
		mu.Lock()
		order = append(order, j.ID)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the work
		return nil
	}), &handler.KindOptions{Concurrency: &handler.Concurrency{Limit: 1}})
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test", t.Name(), "n", n), Metrics: metrics.New(&metrics.Options{Out: emf})})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1})
	poll := func(what string, done func() bool) {
		t.Helper()
		for end := time.Now().Add(2 * time.Minute); !done(); {
			if time.Now().After(end) {
				for _, r := range e.Scan(t) {
					t.Logf("%s state %s ticket %d runAt %v lease %v", r.PK, r.State, r.Ticket, ledger.Millis(r.RunAt), ledger.Millis(r.LeaseUntil))
				}
				out, _ := e.DB.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(e.Table)})
				for _, it := range out.Items {
					if pk := it["pk"].(*dbtypes.AttributeValueMemberS).Value; !strings.HasPrefix(pk, "j#") {
						var m map[string]any
						_ = attributevalue.UnmarshalMap(it, &m)
						t.Logf("%s: %v", pk, m)
					}
				}
				t.Fatalf("%d waiters: %s: not within two minutes", n, what)
			}
			if got, err := p.Poll(ctx); err != nil {
				t.Fatal(err)
			} else if got == 0 {
				time.Sleep(20 * time.Millisecond) // nothing visible yet
			}
		}
	}
	if _, err := h.Producer().Enqueue(ctx, queued{N: 0}, nil); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	go func() {
		defer close(held)
		for got := 0; got == 0; { // until the holder's message came (and its run ended)
			var err error
			if got, err = p.Poll(ctx); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	<-holding
	var ids []string
	for i := 1; i <= n; i++ {
		res, err := h.Producer().Enqueue(ctx, queued{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	tickets := map[string]int64{}
	poll("every waiter deferred", func() bool { return emf.get(metrics.Deferred) >= n })
	for _, id := range ids {
		rec := e.Get(t, id)
		if rec.State != ledger.Scheduled || rec.Ticket == 0 {
			t.Fatalf("waiter %s: %s with ticket %d, want Scheduled with a ticket", id, rec.State, rec.Ticket)
		}
		tickets[id] = rec.Ticket
	}
	counter.Reset()
	close(release)
	<-held
	poll("every waiter ran", func() bool { return emf.get(metrics.Succeeded) >= n+1 })
	for _, c := range counter.Calls() {
		if strings.HasPrefix(c, "DynamoDB.") {
			requests++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range order {
		started = append(started, tickets[id])
	}
	// The SDK resent a request (a loaded emulator's 5xx or a timeout):
	// something failed, and a resent send is a second message.
	return emf.get(metrics.Deferred), requests, started, int(attempts.n.Load()) > len(calls.Calls())
}

// countingTransport counts HTTP requests: the SDK's attempts, resends
// included.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}

// Each waiter is deferred once and woken once: the deferrals are the
// waiters, and the requests per waiter do not grow with the queue. The
// waiters start in the order of their tickets (first come, first
// served). Before, every waiter came back on its own backoff while the
// queue moved: 30 waiters cost more than 30 deferrals, in no order.
func TestConcurrencyWaitersCostLinear(t *testing.T) {
	t.Parallel()
	perWaiter := map[int]float64{}
	for _, n := range []int{10, 30} {
		deferrals, requests, started, resent := queueOf(t, n)
		t.Logf("%d waiters: %d deferrals and %d DynamoDB requests after the holder ended (the SDK resent a request: %v)", n, deferrals, requests, resent)
		switch {
		case !resent && deferrals != n:
			t.Errorf("%d waiters: %d deferrals, want %d (one each)", n, deferrals, n)
		case resent && (deferrals < n || deferrals > 2*n):
			// A resent send is a second message: a waiter may be deferred
			// again and lose its place, never its run (the docs: the order
			// holds "while nothing fails").
			t.Errorf("%d waiters, with resends: %d deferrals, want %d to %d", n, deferrals, n, 2*n)
		}
		if !resent && !slices.IsSorted(started) {
			t.Errorf("%d waiters started out of their order: tickets %v", n, started)
		}
		if len(started) != n {
			t.Errorf("%d waiters: %d runs, want one each", n, len(started))
		}
		perWaiter[n] = float64(requests) / float64(n)
		// A wake (a release, the pass-on's read and put, the ticket's
		// mark, the job's update) and a run (a claim, the slot's read and
		// put, a finish): 9, and a few lost races on the key's item.
		if perWaiter[n] > 14 {
			t.Errorf("%d waiters: %.1f DynamoDB requests each, want at most 14", n, perWaiter[n])
		}
	}
	if perWaiter[30] > perWaiter[10]+2 {
		t.Errorf("requests per waiter grew with the queue: %.1f for 10, %.1f for 30", perWaiter[10], perWaiter[30])
	}
}

// waitersEnv is a kit Env whose handler's requests go through a fault
// transport: a kind limited to one run at once, a holder (N 0) that holds
// its slot until release is closed (on its first run only), and n
// waiters queued behind it. runs counts each job's runs.
type waitersEnv struct {
	e       *nexjobtest.Env
	ft      *faults.Transport
	h       *handler.Handler
	holder  string
	waiters []string
	release chan struct{}
	held    chan struct{} // closed once the holder's first Handle returned
	mu      sync.Mutex
	runs    map[string]int
}

func newWaiters(t *testing.T, n int, lease ...time.Duration) *waitersEnv {
	t.Helper()
	e := nexjobtest.New(t, nil)
	w := &waitersEnv{e: e, release: make(chan struct{}), held: make(chan struct{}), runs: map[string]int{}}
	holding := make(chan struct{})
	w.ft = faults.New(nil)
	e.Cfg = faults.Config(e.Cfg, w.ft)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[queued](func(ctx context.Context, j *handler.Job[queued]) error {
		w.mu.Lock()
		w.runs[j.ID]++
		first := w.runs[j.ID] == 1
		w.mu.Unlock()
		if j.Args.N == 0 && first {
			close(holding)
			<-w.release
		}
		return nil
	}), &handler.KindOptions{Concurrency: &handler.Concurrency{Limit: 1}})
	o := &handler.Options{Logger: quiet}
	if len(lease) > 0 {
		o.Lease = lease[0]
	}
	w.h = e.Handler(t, reg, o)
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, queued{N: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.holder = res.ID
	go func() {
		defer close(w.held)
		for pollOnce(t, e, w.h) == 0 { // until the holder's message came (and its run ended)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	<-holding
	for i := 1; i <= n; i++ {
		res, err := e.Client.Enqueue(ctx, queued{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.waiters = append(w.waiters, res.ID)
	}
	return w
}

// queue polls until every waiter is deferred with a ticket.
func (w *waitersEnv) queue(t *testing.T) {
	t.Helper()
	pollUntil(t, w.e, w.h, "every waiter queued", func() bool {
		for _, id := range w.waiters {
			if rec := w.e.Get(t, id); rec.State != ledger.Scheduled || rec.Ticket == 0 {
				return false
			}
		}
		return true
	})
}

// ranOnce fails unless every job Succeeded after exactly one run.
func (w *waitersEnv) ranOnce(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range append([]string{w.holder}, w.waiters...) {
		if rec := w.e.Get(t, id); rec.State != ledger.Succeeded || w.runs[id] != 1 {
			t.Errorf("job %s: %s after %d runs, want Succeeded after one", id, rec.State, w.runs[id])
		}
	}
}

// A holder killed in its run never releases its slot: its lease ends,
// the first waiter comes back by itself then, takes the slot, and its
// end wakes the next. No waiter waits for ever.
func TestWaiterNotStrandedByAKilledHolder(t *testing.T) {
	t.Parallel()
	w := newWaiters(t, 4)
	w.queue(t)
	lease := ledger.Millis(w.e.Get(t, w.holder).LeaseUntil).Sub(w.e.Now())
	// Killed: its run never returns (release stays open until the test
	// ends), and its Handle never frees the slot.
	t.Cleanup(func() { close(w.release) })
	w.e.Advance(t, lease+time.Second)
	w.e.Drain(t, w.h)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range w.waiters {
		if rec := w.e.Get(t, id); rec.State != ledger.Succeeded || w.runs[id] != 1 {
			t.Errorf("waiter %s: %s after %d runs, want Succeeded after one", id, rec.State, w.runs[id])
		}
	}
}

// The wake reaches a waiter before it recorded its ticket (its deferral
// written, its ticket's item not yet): the waker finds no job to wake,
// and the waiter, recording its ticket, finds the mark and wakes itself.
// Before, it slept to its own estimate of its turn.
func TestWaiterWokenBeforeItRecordedItsTicket(t *testing.T) {
	t.Parallel()
	w := newWaiters(t, 0)
	putHeld, letPut := make(chan struct{}), make(chan struct{})
	w.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass,
		Match:  func(body []byte) bool { return bytes.Contains(body, []byte(`"#job"`)) },
		Before: func(*http.Request, []byte) { close(putHeld); <-letPut }})
	res, err := w.e.Client.Enqueue(context.Background(), queued{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.waiters = append(w.waiters, res.ID)
	deferred := make(chan struct{})
	go func() { defer close(deferred); pollOnce(t, w.e, w.h) }()
	<-putHeld // deferred with its ticket; its ticket's item not yet written
	close(w.release)
	<-w.held // the holder's end reserved the slot for the ticket and marked it
	close(letPut)
	<-deferred
	w.e.Drain(t, w.h) // no clock moved: the waiter runs only if woken
	w.ranOnce(t)
}

// Every request of the wake fails past the SDK's retries in turn (the
// release's hand-over, the ticket's mark, the job's update, the send):
// the waiters still run, each once, when their own time comes.
func TestWakeUnderFaults(t *testing.T) {
	t.Parallel()
	hasAttr := func(a string) func([]byte) bool {
		return func(body []byte) bool { return bytes.Contains(body, []byte(a)) }
	}
	for name, r := range map[string]faults.Rule{
		"release lost reply":     {Op: "DynamoDB.UpdateItem", Match: hasAttr(`"#me"`), Fault: faults.LostReply},
		"hand-over throttled":    {Op: "DynamoDB.PutItem", Match: hasAttr(`"c#`), Fault: faults.Throttle, Times: faults.Attempts},
		"mark throttled":         {Op: "DynamoDB.UpdateItem", Match: hasAttr(`"#woken"`), Fault: faults.Throttle, Times: faults.Attempts},
		"ticket item lost reply": {Op: "DynamoDB.UpdateItem", Match: hasAttr(`"w#`), Fault: faults.LostReply, Times: 2},
		"wake lost reply": {Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, Match: func(body []byte) bool {
			return bytes.Contains(body, []byte(`"ticket"`)) && !bytes.Contains(body, []byte(`":ticket"`)) // WakeWaiter's, not a Finish's
		}},
		"wake send throttled": {Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWaiters(t, 3)
			w.queue(t)
			lease := ledger.Millis(w.e.Get(t, w.holder).LeaseUntil).Sub(w.e.Now())
			fault := w.ft.Add(r)
			close(w.release)
			<-w.held
			w.e.Advance(t, 4*lease) // the waiters' own times, should a wake be lost
			w.e.Drain(t, w.h)
			w.ranOnce(t)
			if fault.Fired() == 0 {
				t.Error("the fault never fired")
			}
		})
	}
}

// A waiter cancelled while it waits: the holder's end finds it no longer
// waiting and hands the slot to the next, which runs with no clock moved.
func TestCancelledWaiterIsPassedOver(t *testing.T) {
	t.Parallel()
	w := newWaiters(t, 2)
	w.queue(t)
	first, second := w.e.Get(t, w.waiters[0]), w.e.Get(t, w.waiters[1])
	if first.Ticket > second.Ticket {
		first, second = second, first
	}
	if _, err := w.e.Client.Cancel(context.Background(), first.ID, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	close(w.release)
	<-w.held
	w.e.Drain(t, w.h)
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec := w.e.Get(t, second.ID); rec.State != ledger.Succeeded || w.runs[second.ID] != 1 {
		t.Errorf("the waiter behind the cancelled one: %s after %d runs, want Succeeded after one", rec.State, w.runs[second.ID])
	}
	if rec := w.e.Get(t, first.ID); rec.State != ledger.Failed || !rec.Cancelled || w.runs[first.ID] != 0 {
		t.Errorf("the cancelled waiter: %s (cancelled %v) after %d runs", rec.State, rec.Cancelled, w.runs[first.ID])
	}
}

// A wake lost (its send throttled past the SDK's retries) holds the
// queue up one lease at most, wherever it happens: each wake brings the
// next waiter's own return forward to one lease. Here the third waiter's
// wake is lost: one lease on (the kit's clock), it and the fourth run,
// each once. Before, the third came back only at its estimated turn (three
// leases: it had two waiters ahead of it), and the fourth after it:
// "the third and fourth waiters: not within a minute".
func TestLostWakeHoldsTheQueueUpOneLease(t *testing.T) {
	t.Parallel()
	w := newWaiters(t, 4, 10*time.Minute) // a lease no real wait reaches
	w.queue(t)
	tickets := map[int64]string{}
	for _, id := range w.waiters {
		tickets[w.e.Get(t, id).Ticket] = id
	}
	order := slices.Sorted(maps.Keys(tickets))
	third := tickets[order[2]]
	lease := ledger.Millis(w.e.Get(t, w.holder).LeaseUntil).Sub(w.e.Now())
	// The third's wake (its message sent with no delay: an arming has
	// one) is throttled past the retries.
	fault := w.ft.Add(faults.Rule{Op: "SQS.SendMessage", Times: faults.Attempts, Fault: faults.Throttle,
		Match: func(body []byte) bool {
			return bytes.Contains(body, []byte(third)) && !bytes.Contains(body, []byte(`"DelaySeconds"`))
		}})
	close(w.release)
	<-w.held
	done := func(ids ...string) func() bool {
		return func() bool {
			for _, id := range ids {
				if w.e.Get(t, id).State != ledger.Succeeded {
					return false
				}
			}
			return true
		}
	}
	pollUntil(t, w.e, w.h, "the first two waiters", done(tickets[order[0]], tickets[order[1]]))
	<-fault.Done()
	w.e.Advance(t, lease+time.Second)
	pollUntil(t, w.e, w.h, "the third and fourth waiters", done(third, tickets[order[3]]))
	w.ranOnce(t)
}
