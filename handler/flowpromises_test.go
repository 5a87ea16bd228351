package handler_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
)

// Regression tests for flow control's promises (issue 27, items 4, 5, 6,
// 10, 11 and 24): each drives the real handler over the emulator on the
// kit's clock, so nothing depends on how fast the machine is.

type paced struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

func (paced) Kind() string { return "paced" }

type report struct {
	Tenant string `json:"tenant"`
}

func (report) Kind() string { return "report" }

type export struct {
	Tenant string `json:"tenant"`
}

func (export) Kind() string { return "export" }

// pollOnce feeds one receive of the job queue to h.
func pollOnce(t *testing.T, e *nexjobtest.Env, h *handler.Handler) int {
	t.Helper()
	n, err := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1}).Poll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pollUntil polls the job queue until done() holds, for a minute at most.
func pollUntil(t *testing.T, e *nexjobtest.Env, h *handler.Handler, what string, done func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !done(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within a minute", what)
		}
		if pollOnce(t, e, h) == 0 {
			time.Sleep(50 * time.Millisecond) // nothing visible yet: a message's delay, in real time
		}
	}
}

func states(t *testing.T, e *nexjobtest.Env, ids []string) map[ledger.State]int {
	n := map[ledger.State]int{}
	for _, id := range ids {
		n[e.Get(t, id).State]++
	}
	return n
}

// Item 4: deferred jobs whose messages come back long after their slots
// (workers down for ten minutes) take new slots instead of starting
// together on stale ones. Throttle{2 a minute}: of six jobs two run at
// once and four wait on slots a minute and two ahead; ten minutes later
// the four come back together, and only two may start; the other two take
// the next minute's slots.
func TestThrottleBacklogAfterAnOutageKeepsTheRate(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var mu sync.Mutex
	var starts []time.Time
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[paced](func(ctx context.Context, j *handler.Job[paced]) error {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, e.Now())
		return nil
	}), &handler.KindOptions{Throttle: &handler.Throttle{Limit: 2, Period: time.Minute}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	var ids []string
	for i := range 6 {
		res, err := e.Client.Enqueue(context.Background(), paced{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	handled := func(want map[ledger.State]int) func() bool {
		return func() bool {
			got := states(t, e, ids)
			for st, n := range want {
				if got[st] != n {
					return false
				}
			}
			for _, id := range ids {
				if rec := e.Get(t, id); rec.State == ledger.Scheduled && rec.Slot == 0 {
					return false
				}
			}
			return true
		}
	}
	pollUntil(t, e, h, "two run, four wait on their slots", handled(map[ledger.State]int{ledger.Succeeded: 2, ledger.Scheduled: 4}))
	outage := e.Now()
	e.Advance(t, 10*time.Minute)
	// Each waiting job is handled once more: it runs, or waits on a slot
	// after the outage.
	pollUntil(t, e, h, "the backlog handled after the outage", func() bool {
		for _, id := range ids {
			rec := e.Get(t, id)
			if rec.State == ledger.Scheduled && ledger.Millis(rec.Slot).Before(outage.Add(10*time.Minute)) {
				return false
			}
		}
		return true
	})
	got := states(t, e, ids)
	if got[ledger.Succeeded] != 4 || got[ledger.Scheduled] != 2 {
		t.Fatalf("after the outage: %v, want 4 Succeeded (2 before, 2 after) and 2 Scheduled on the next minute's slots", got)
	}
	mu.Lock()
	defer mu.Unlock()
	checkRate(t, starts, 2, time.Minute)
}

// checkRate fails when any limit+1 starts fall within period less the
// slot tolerance (a run starts at most ThrottleWait after its slot).
func checkRate(t *testing.T, starts []time.Time, limit int, period time.Duration) {
	t.Helper()
	for i := limit; i < len(starts); i++ {
		if span := starts[i].Sub(starts[i-limit]); span < period-handler.ThrottleWait {
			t.Fatalf("starts %d to %d within %s: more than %d in %s", i-limit, i, span, limit, period)
		}
	}
}

// Item 5: a job that took its throttle slot and then found no concurrency
// slot does not keep the throttle slot (it would start later, beside the
// next job's slot): its deferral leaves no slot on the record.
func TestConcurrencyDeferralGivesUpTheThrottleSlot(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	started, release := make(chan string, 2), make(chan struct{})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[paced](func(ctx context.Context, j *handler.Job[paced]) error {
		started <- j.ID
		<-release
		return nil
	}), &handler.KindOptions{Throttle: &handler.Throttle{Limit: 2, Period: time.Minute}, Concurrency: &handler.Concurrency{Limit: 1}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	first, err := e.Client.Enqueue(context.Background(), paced{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); pollOnce(t, e, h) }()
	<-started // the first holds the only concurrency slot
	second, err := e.Client.Enqueue(context.Background(), paced{N: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, e, h, "the second job deferred", func() bool { return e.Get(t, second.ID).Defers > 0 })
	close(release)
	<-done
	rec := e.Get(t, second.ID)
	if rec.State != ledger.Scheduled || rec.Slot != 0 {
		t.Fatalf("second job: %s with throttle slot %d, want Scheduled holding no slot (the first %s holds the concurrency slot)", rec.State, rec.Slot, first.ID)
	}
}

// Item 6: flow-control items are scoped to their kind. Two kinds keyed by
// one tenant: an export holding acme's only export slot does not keep
// acme's report (its own limit, none running) from starting.
func TestFlowKeysAreScopedToTheirKind(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	started, release := make(chan struct{}, 1), make(chan struct{})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[export](func(ctx context.Context, j *handler.Job[export]) error {
		started <- struct{}{}
		<-release
		return nil
	}), &handler.KindOptions{Concurrency: &handler.Concurrency{Key: handler.ArgsKey(func(a export) string { return a.Tenant }), Limit: 1}})
	handler.AddWorker(reg, handler.WorkFunc[report](func(ctx context.Context, j *handler.Job[report]) error { return nil }),
		&handler.KindOptions{Concurrency: &handler.Concurrency{Key: handler.ArgsKey(func(a report) string { return a.Tenant }), Limit: 1}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	if _, err := e.Client.Enqueue(context.Background(), export{Tenant: "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); pollOnce(t, e, h) }()
	<-started
	rep, err := e.Client.Enqueue(context.Background(), report{Tenant: "acme"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, e, h, "the report handled", func() bool { rec := e.Get(t, rep.ID); return rec.State == ledger.Succeeded || rec.Defers > 0 })
	close(release)
	<-done
	if rec := e.Get(t, rep.ID); rec.State != ledger.Succeeded {
		t.Fatalf("acme's report: %s after %d deferrals while acme's export ran, want Succeeded (each kind has its own limit)", rec.State, rec.Defers)
	}
}

// Item 10: a flow-control key function that panics fails the run as a
// worker's panic does (the attempt is spent, the job ends Failed with a
// single attempt), instead of escaping Handle with the job claimed.
func TestPanickingKeyFunctionFailsTheRun(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	ran := false
	handler.AddWorker(reg, handler.WorkFunc[paced](func(ctx context.Context, j *handler.Job[paced]) error { ran = true; return nil }),
		&handler.KindOptions{Concurrency: &handler.Concurrency{Key: func(ledger.Record) string { panic("bad key") }, Limit: 1}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(context.Background(), paced{}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	rec := e.RequireState(t, res.ID, ledger.Failed)
	if ran || rec.Attempt != 1 || !strings.Contains(rec.LastError, "bad key") {
		t.Fatalf("ran %v, attempt %d, last error %q: want not run, attempt 1, the panic as the error", ran, rec.Attempt, rec.LastError)
	}
}

// Item 11: a throttle slot beyond the longest schedule (400 daily slots
// taken ahead of the job) is reached in steps: the job stays Scheduled
// with its message, never taken for a forgery and sent to the DLQ.
func TestThrottleSlotBeyondAYearWaits(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[paced](func(ctx context.Context, j *handler.Job[paced]) error { return nil }),
		&handler.KindOptions{Throttle: &handler.Throttle{Limit: 1, Period: ledger.MaxRatePeriod}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	st := e.Client.Store()
	rate := ledger.Rate{Limit: 1, Period: ledger.MaxRatePeriod}
	var last time.Time
	for i := range 400 {
		slot, _, err := st.Reserve(context.Background(), st.HashKey(handler.FlowName("paced", "")), ledger.RateTag(string(rune(i))+"-ahead"), rate, true)
		if err != nil {
			t.Fatal(err)
		}
		last = slot
	}
	res, err := e.Client.Enqueue(context.Background(), paced{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, e, h, "the job deferred", func() bool { return e.Get(t, res.ID).Defers > 0 })
	rec := e.Get(t, res.ID)
	if latest := e.Now().Add(enqueue.MaxScheduleAhead); ledger.Millis(rec.RunAt).After(latest) || ledger.Millis(rec.Slot).Before(last) {
		t.Fatalf("deferred to %s holding slot %s, want a run time within the longest schedule (%s) holding a slot after %s",
			ledger.Millis(rec.RunAt), ledger.Millis(rec.Slot), latest, last)
	}
	// Its message, when it comes (the kit's hops), is carried, not dropped.
	pollUntil(t, e, h, "the deferral's message handled", func() bool { return e.QueueDepth(t, e.QueueURL) > 0 || e.QueueDepth(t, e.DLQURL) > 0 })
	if n := e.QueueDepth(t, e.DLQURL); n != 0 {
		t.Fatalf("%d messages in the DLQ: the deferral was taken for a forgery", n)
	}
}

// Item 24: a message from a named queue that must come back when a live
// lease ends has its visibility changed on its own queue (its receipt
// handle is that queue's), not the job queue's.
func TestComeBackOnANamedQueue(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk"}, Queue: provision.QueueSpec{VisibilityTimeout: 30 * time.Second}})
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[bulkRow](func(ctx context.Context, j *handler.Job[bulkRow]) error { return nil }), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: log})
	res, err := e.Client.Enqueue(context.Background(), bulkRow{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Store().Claim(context.Background(), res.ID, time.Minute); err != nil { // a run elsewhere, its lease live
		t.Fatal(err)
	}
	for got := 0; got == 0; {
		if got, err = pollOnly(e, "bulk", h).Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(logs.String(), "change visibility failed") {
		t.Fatalf("the come-back failed:\n%s", logs.String())
	}
	if rec := e.Get(t, res.ID); rec.State != ledger.Processing {
		t.Fatalf("the job is %s, want Processing (the other run's)", rec.State)
	}
}
