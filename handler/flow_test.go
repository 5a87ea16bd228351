package handler_test

import (
	"bytes"
	"context"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// tenantJob is a job of one tenant, limited per tenant.
type tenantJob struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
	Sleep  int    `json:"sleepMs,omitempty"`
}

func (tenantJob) Kind() string { return "crash-tenant" }

// throttledJob is throttled per tenant.
type throttledJob struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

func (throttledJob) Kind() string { return "throttled" }

// tenantLimit: at most 2 runs of one tenant at once (the crash worker's
// kind), waiters coming back within 2 s.
var tenantLimit = &handler.Concurrency{Key: handler.ArgsKey(func(a tenantJob) string { return a.Tenant }), Limit: 2, MaxBackoff: 2 * time.Second}

// 100 jobs of one tenant throttled at 10 starts a second, beside 20 of
// another tenant: each tenant's k-th start (in order of start) comes no
// sooner than floor(k/10) seconds after its first, less a tolerance for
// the first run's own lag behind its slot; every job ran once, on its
// first attempt (a deferral spends none). Checked from the runs' start
// times, not by waiting: unthrottled, the 100 start within a second or
// two.
func TestThrottleKeepsTheRatePerKey(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	const limit, period, tolerance = 10, time.Second, 500 * time.Millisecond
	var mu sync.Mutex
	starts := map[string][]time.Time{}
	runs := map[string]int{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[throttledJob](func(ctx context.Context, j *handler.Job[throttledJob]) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		starts[j.Args.Tenant] = append(starts[j.Args.Tenant], now)
		runs[j.ID]++
		return nil
	}), &handler.KindOptions{Throttle: &handler.Throttle{
		Key: handler.ArgsKey(func(a throttledJob) string { return a.Tenant }), Limit: limit, Period: period,
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	var ids []string
	for i := range 120 {
		tenant := "a"
		if i%6 == 5 {
			tenant = "b"
		}
		res, err := e.Client.Enqueue(context.Background(), throttledJob{Tenant: tenant, N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	e.Drain(t, h)
	for _, id := range ids {
		rec := e.Get(t, id)
		if rec.State != ledger.Succeeded || rec.Attempt != 1 || runs[id] != 1 {
			t.Fatalf("job %s: %s attempt %d after %d runs, want Succeeded on attempt 1 after 1", id, rec.State, rec.Attempt, runs[id])
		}
	}
	for tenant, want := range map[string]int{"a": 100, "b": 20} {
		s := slices.SortedFunc(slices.Values(starts[tenant]), time.Time.Compare)
		if len(s) != want {
			t.Fatalf("tenant %s: %d runs, want %d", tenant, len(s), want)
		}
		for k := range s {
			if early := s[0].Add(time.Duration(k/limit)*period - tolerance); s[k].Before(early) {
				t.Fatalf("tenant %s: start %d came %s after the first, sooner than %d a second allow", tenant, k, s[k].Sub(s[0]), limit)
			}
		}
		t.Logf("tenant %s: %d starts over %s", tenant, len(s), s[len(s)-1].Sub(s[0]))
	}
}

// 30 jobs of one tenant limited to 2 at once, run by two worker
// processes, after a third was killed mid-run holding a slot: at no
// moment do more than 2 runs overlap (a killed run counts until the
// kill), every job Succeeded, and at the end no slot is held (every
// run's end freed its own). (A job may run again after a run the kill
// cut, or one whose invocation ended before its result was written: the
// crash worker's invocations last 2 s.)
func TestConcurrencyLimitHoldsThroughAKill(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, &awstest.QueueOptions{VisibilityTimeout: 3 * time.Second, MaxReceiveCount: 50})
	runsFile := t.TempDir() + "/runs"
	var ids []string
	for i := range 30 {
		res, err := e.Client.Enqueue(context.Background(), tenantJob{Tenant: "t", N: i, Sleep: 100}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	started := time.Now().UnixNano()
	w := startWorker(t, e, runsFile)
	// The gate is closed: a run that started cannot have ended.
	for end := time.Now().Add(60 * time.Second); !startedSince(t, runsFile, started); {
		if time.Now().After(end) {
			t.Fatal("the worker started no run in a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	kill := time.Now().UnixNano()
	_ = w.Process.Signal(syscall.SIGKILL)
	_ = w.Wait()
	if err := os.WriteFile(runsFile+".open", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		w := startWorker(t, e, runsFile)
		defer func() { _ = w.Process.Kill(); _ = w.Wait() }()
	}
	// One bound for all 30 (a hang fails it; a loaded machine's slow
	// waiters do not: 2 minutes a job failed once beside two make tests).
	deadline := time.Now().Add(10 * time.Minute)
	for _, id := range ids {
		e.WaitFor(t, id, ledger.Succeeded, time.Until(deadline))
	}
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	cut := 0
	for _, id := range ids {
		rs := readRuns(t, runsFile)[id]
		if len(rs) == 0 {
			t.Fatalf("job %s Succeeded with no run", id)
		}
		for i, r := range rs {
			end := r.end
			if end == 0 {
				if r.start > kill {
					t.Fatalf("job %s: run %d never ended, and no kill came after it started", id, i)
				}
				end, cut = kill, cut+1
			}
			edges = append(edges, edge{r.start, +1}, edge{end, -1})
		}
	}
	// Ends before starts at the same instant: a slot freed then taken.
	slices.SortFunc(edges, func(a, b edge) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	most, now := 0, 0
	for _, x := range edges {
		now += x.delta
		most = max(most, now)
	}
	if most > tenantLimit.Limit {
		t.Fatalf("%d runs of the tenant overlapped; the limit is %d", most, tenantLimit.Limit)
	}
	if cut == 0 {
		t.Fatal("the kill cut no run: the test did not test a crashed holder")
	}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[tenantJob](func(context.Context, *handler.Job[tenantJob]) error { return nil }), &handler.KindOptions{Concurrency: tenantLimit})
	// Every run's end freed its own slot; a run its invocation cut (the
	// crash worker's last 2 s; under load one was cut after its claim)
	// holds its slot until its lease ends, and it frees itself then. So:
	// no slot leased for longer than a run's lease, and none once those
	// leases ended (it failed once so, right after the last job ended, a
	// slot leased 30 s on).
	h := e.Handler(t, reg, nil)
	for {
		held, err := h.Holding(context.Background(), tenantJob{}.Kind(), "t")
		if err != nil {
			t.Fatal(err)
		}
		if len(held) == 0 {
			break
		}
		last := time.Time{}
		for _, until := range held {
			if until.After(last) {
				last = until
			}
		}
		if time.Until(last) > 2*time.Minute {
			t.Fatalf("slots still held after every run ended, one past any run's lease: %v", held)
		}
		time.Sleep(time.Until(last) + 100*time.Millisecond) // until its lease ends; it must free itself then
	}
	t.Logf("30 jobs, limit %d: at most %d at once, %d run cut by the kill", tenantLimit.Limit, most, cut)
}

var _ enqueue.JobArgs = tenantJob{}

// throttledPair is throttled as a kind: one start every 2 s.
type throttledPair struct{ N int }

func (throttledPair) Kind() string { return "throttled-pair" }

// Flow control's writes under faults: the deferral's finish applied with
// its reply lost (its resend is recognised: one message, no attempt
// spent), and a throttle slot's PutItem throttled past the SDK's retries
// (the job is deferred, not lost, and takes its slot when it comes back),
// and a later deferral's finish throttled past the SDK's retries (retried
// while the claim holds, or its message comes back). Every job runs once,
// on attempt 1, and the starts keep the rate.
func TestFlowControlUnderFaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	const period = 2 * time.Second
	var mu sync.Mutex
	var starts []time.Time
	runs := map[string]int{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[throttledPair](func(ctx context.Context, j *handler.Job[throttledPair]) error {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, time.Now())
		runs[j.ID]++
		return nil
	}), &handler.KindOptions{Throttle: &handler.Throttle{Limit: 1, Period: period}})
	ft, cfg := e.Faulty()
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet, DLQURL: e.DLQURL})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		res, err := e.Client.Enqueue(context.Background(), throttledPair{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	has := func(s string) func([]byte) bool { return func(b []byte) bool { return bytes.Contains(b, []byte(s)) } }
	lost := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: has(`"defers"`), Fault: faults.LostReply})
	throttled := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: has(ledger.RateTag(ids[2] + ".1.0")), Fault: faults.Throttle, Times: faults.Attempts})
	// The next deferral's finish throttled past the SDK's retries.
	throttledDefer := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: has(`"defers"`), Fault: faults.Throttle, Times: faults.Attempts})
	e.Drain(t, h)
	for _, id := range ids {
		if rec := e.Get(t, id); rec.State != ledger.Succeeded || rec.Attempt != 1 || runs[id] != 1 {
			t.Fatalf("job %s: %s attempt %d after %d runs, want Succeeded on attempt 1 after 1", id, rec.State, rec.Attempt, runs[id])
		}
	}
	if lost.Fired() != 1 || throttled.Fired() == 0 || throttledDefer.Fired() != faults.Attempts {
		t.Fatalf("faults fired: lost reply %d, throttle %d, deferral throttled %d", lost.Fired(), throttled.Fired(), throttledDefer.Fired())
	}
	slices.SortFunc(starts, time.Time.Compare)
	for k := range starts {
		if starts[k].Before(starts[0].Add(time.Duration(k)*period - 500*time.Millisecond)) {
			t.Fatalf("start %d came %s after the first; the throttle allows one per %s", k, starts[k].Sub(starts[0]), period)
		}
	}
}

// costedJob is throttled (1 an hour) and limited (1 at once) as a kind.
type costedJob struct{ N int }

func (costedJob) Kind() string { return "costed" }

// The requests of each flow-control path and their units, pinned
// (docs/costs.md's table): a start that takes a throttle slot and a
// concurrency slot; a start sent to a later slot, without far schedules
// (one delayed send, then hops; with them a schedule:
// TestFarDeferralTakesASchedule); a rate-limited enqueue accepted and
// refused; a debounced enqueue that starts a window and one folded
// (TestDebouncedBurstCosts runs a burst to its run). Every read of a
// rate log, a slot or a pointer is consistent: 1 read unit.
func TestFlowControlCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[costedJob](func(context.Context, *handler.Job[costedJob]) error { return nil }),
		&handler.KindOptions{Throttle: &handler.Throttle{Limit: 1, Period: time.Hour}, Concurrency: &handler.Concurrency{Limit: 1}})
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := h.Producer()
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: time.Second})
	ctx := context.Background()
	put, upd, get, send := "DynamoDB.PutItem", "DynamoDB.UpdateItem", "DynamoDB.GetItem", "SQS.SendMessage"
	step := meterStep(t, meter)
	type u = awstest.Units
	runOne := func(args costedJob) string {
		res, err := c.Enqueue(ctx, args, nil)
		if err != nil {
			t.Fatal(err)
		}
		pollOne(t, p)
		return res.ID
	}
	var first, second string
	step("a start with both slots free", []string{put, send, upd, get, put, get, put, upd, upd}, u{Write: 6, Read: 2, Sends: 1}, func() { first = runOne(costedJob{1}) })
	step("a start sent to the next slot, an hour on", []string{put, send, upd, get, put, upd, send}, u{Write: 4, Index: 1, Read: 1, Sends: 2}, func() { second = runOne(costedJob{2}) })
	if rec := e.Get(t, first); rec.State != ledger.Succeeded {
		t.Fatalf("first job %s", rec.State)
	}
	if rec := e.Get(t, second); rec.State != ledger.Scheduled || rec.Attempt != 0 || rec.RunAt < time.Now().Add(58*time.Minute).UnixMilli() {
		t.Fatalf("deferred job: %s attempt %d run at %v, want Scheduled, attempt 0, an hour on", rec.State, rec.Attempt, ledger.Millis(rec.RunAt))
	}
	rl := &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: "k", Limit: 1, Period: time.Hour}}
	step("a rate-limited enqueue accepted", []string{get, put, put, send}, u{Write: 2, Read: 1, Sends: 1}, func() {
		if _, err := c.Enqueue(ctx, costedJob{3}, rl); err != nil {
			t.Fatal(err)
		}
	})
	step("a rate-limited enqueue refused", []string{get}, u{Read: 1}, func() {
		if _, err := c.Enqueue(ctx, costedJob{4}, rl); err == nil {
			t.Fatal("not refused")
		}
	})
	krl := &enqueue.Opts{IdempotencyKey: "rk", RateLimit: &enqueue.RateLimit{Key: "k2", Limit: 1, Period: time.Hour}}
	step("a keyed rate-limited enqueue accepted (its key's record read, then the rate log)", []string{get, get, put, put, send}, u{Write: 2, Read: 2, Sends: 1}, func() {
		if _, err := c.Enqueue(ctx, costedJob{7}, krl); err != nil {
			t.Fatal(err)
		}
	})
	step("a keyed rate-limited enqueue whose key's job is active (no slot; the duplicate's failed put)", []string{get, put}, u{Write: 1, Read: 1}, func() {
		if res, err := c.Enqueue(ctx, costedJob{7}, krl); err != nil || !res.Duplicate {
			t.Fatal(res, err)
		}
	})
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "d", Period: time.Minute}}
	step("a debounced enqueue that starts a window", []string{get, "DynamoDB.TransactWriteItems", send}, u{Write: 4, Index: 1, Read: 1, Sends: 1}, func() {
		if res, err := c.Enqueue(ctx, costedJob{5}, db); err != nil || res.Folded {
			t.Fatal(res, err)
		}
	})
	step("a debounced enqueue folded", []string{get, upd}, u{Write: 1, Index: 2, Read: 1}, func() {
		if res, err := c.Enqueue(ctx, costedJob{6}, db); err != nil || !res.Folded {
			t.Fatal(res, err)
		}
	})
}
