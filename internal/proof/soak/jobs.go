package soak

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// The soak's job kinds. N makes each job's args its own.
type (
	// OK succeeds.
	OK struct{ N int }
	// Flaky fails its first Fails attempts, then succeeds.
	Flaky struct{ N, Fails int }
	// Doomed always fails; its dead-letter hook records it.
	Doomed struct{ N int }
	// Slow outruns its kind's timeout on its first attempt, then succeeds.
	Slow struct{ N int }
	// Limited runs at most LimitPerTenant at once per Tenant (per-key
	// concurrency), each run a little while, so that runs would overlap.
	Limited struct {
		N      int
		Tenant string
	}
	// Throttled starts at most ThrottleLimit times per ThrottlePeriod per
	// Tenant.
	Throttled struct {
		N      int
		Tenant string
	}
	// Keyed is limited per Tenant by a concurrency key function that
	// panics for every fourth N (a team's bug): those fail, never run.
	Keyed struct {
		N      int
		Tenant string
	}
	// Fired is a recurring firing's job (recurring.Fire).
	Fired struct{ N int }
	// Durable is a durable job: a step ("draw"), a sleep of NapMs ("nap"),
	// a step when it woke ("woke"), a wait for its signal "go" (its
	// payload, or -1 after DurableWait, kept as the step "signal"); it
	// fails its first Fails attempts after those, and its result is
	// DurableResult. Each step's function and each step's return are
	// logged (checkDurable). Its step, sleep, wait and signal names end
	// in Sfx (names with ".", "[n]", unicode, the longest: data, never
	// a path); a first step "n" keeps N, and a run whose args are not the
	// ones its first run recorded logs it (a fold into a job that ran).
	// WaitMs, if set, is its wait's timeout (else DurableWait): one longer
	// than handler.MaxWait must fail the job at once, nothing recorded.
	Durable struct {
		N, Fails, NapMs int
		Sfx             string `json:",omitempty"`
		WaitMs          int64  `json:",omitempty"`
	}
)

// Invoker is a job that maps over MapItems items (handler.Map: each item's
// value, the time it ran, logged as got "item<i>": every run reads the
// same), starts Kids children (Kid, named "kid<i>"+Sfx),
// declares a compensation ("undo"+Sfx, logged as the step "undo" when it
// runs), awaits them all (handler.AwaitAll) and records the sum of their
// results and the count of those that failed as its step "sum" and its
// result (InvokerResult); a child that failed fails it for good, so its
// compensation runs. Checker `children`. Kid Fail fails for good.
type Invoker struct {
	N, Kids int
	Fail    []int  `json:",omitempty"` // the kids that fail
	Sfx     string `json:",omitempty"`
	// Steps, if set, is how many more steps it records first (one in
	// eight: a hundred), each logged for checker durable; and one step
	// under a retry policy ("retried") whose first call in each run fails.
	Steps int `json:",omitempty"`
	// Big, set, records a step "big" of BigStep bytes (over
	// ledger.MaxStepValueBytes: kept in the blob bucket), logged by its
	// hash: every run reads the same.
	Big bool `json:",omitempty"`
	// Select, set, waits for whichever comes first of the signals
	// SelectNames (with Sfx) and SelectWait (handler.WaitForAny), logged
	// as got "select": the index chosen, -1 for the timeout. The producer
	// signals one, both or neither. Checker children.
	Select bool `json:",omitempty"`
	// Cond, set, waits for a condition polled every second
	// (handler.WaitForCondition "cond"+Sfx) that holds from a second
	// after its first look's step "t0": the value returned, the time of
	// the look that found it, logged as got "cond" (one value, every run).
	Cond bool `json:",omitempty"`
}

// BigStep is the size of an Invoker's big step: past what a step item
// holds, so it goes to the blob bucket.
const BigStep = 300_000

// SelectNames are the signals an Invoker's select waits for (each with
// its Sfx), and SelectWait how long.
var SelectNames = []string{"go", "stop"}

// SelectWait is how long an Invoker's select waits: as short as KidWait,
// for the same reason.
const SelectWait = 20 * time.Second

// Kid is an Invoker's child: its result is I*10, or a permanent failure.
type Kid struct {
	N, I int
	Fail bool `json:",omitempty"`
}

// InvokerResult is what an Invoker read of its children.
type InvokerResult struct{ Sum, Failed, TimedOut int }

// MapItems is how many items an Invoker maps over (handler.Map).
const MapItems = 6

// KidWait is how long an Invoker waits for its children: short, as
// DurableWait, because the wait's message hops until its end even once
// the children woke the job (the soak's quiet waits for it), so a
// backlog times some out (their timeouts take their places: checker
// children).
const KidWait = 30 * time.Second

func (Invoker) Kind() string { return "soak.invoker" }
func (Kid) Kind() string     { return "soak.kid" }

// DurableSuffixes are the Durable jobs' name endings: every shape a path
// parser trips on, unicode, and the longest a wait's signal name can be.
var DurableSuffixes = []string{"", ".v2", "[0]", "a.b[1].c", "..", "]x[", "é.ü[ß]", "%2E", strings.Repeat("x.", 50)}

// DurableResult is a Durable job's result: what its steps returned.
type DurableResult struct {
	Draw   int64
	Woke   int64
	Signal int
}

// DurableWait is how long a Durable job waits for its signal.
const DurableWait = 20 * time.Second

func (Durable) Kind() string { return "soak.durable" }

func (OK) Kind() string     { return "soak.ok" }
func (Flaky) Kind() string  { return "soak.flaky" }
func (Doomed) Kind() string { return "soak.doomed" }
func (Slow) Kind() string   { return "soak.slow" }

func (Limited) Kind() string   { return "soak.limited" }
func (Throttled) Kind() string { return "soak.throttled" }
func (Keyed) Kind() string     { return "soak.keyed" }
func (Fired) Kind() string     { return "soak.fired" }

// The flow-control kinds' limits. The throttle's period is long enough
// that the checker (which allows a run's lag behind its slot and the
// skewed worker's clock) still sees a backlog that starts together.
const (
	LimitPerTenant  = 2
	ThrottleLimit   = 5
	ThrottlePeriod  = 4 * time.Second
	RateLimitLimit  = 2
	RateLimitPeriod = time.Second
	limitedRun      = 30 * time.Millisecond
)

// panics reports whether Keyed's key function panics for n.
func panics(n int) bool { return n%4 == 0 }

// SlowTimeout is the slow kind's timeout; its first attempt runs twice as
// long (ending when its context does).
const SlowTimeout = 150 * time.Millisecond

// RunLog is one process's record of runs, appended to a file the checker
// reads: "start ID ATTEMPT UNIXNANO PID", "end ID ATTEMPT UNIXNANO PID
// OUTCOME" (ok, err, or sleep: a durable sleep, no attempt spent), "dead
// ID PID" (a dead-letter hook's call), and a durable job's "step"/"got"
// lines (loggedStep). A killed process's runs have a start and no end.
type RunLog struct {
	mu  sync.Mutex
	f   *os.File
	pid int
}

// OpenRunLog opens (appends to) the file at path.
func OpenRunLog(path string) (*RunLog, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return &RunLog{f: f, pid: os.Getpid()}, nil
}

func (l *RunLog) line(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// One write per line: a kill between two lines loses no half line.
	_, _ = l.f.WriteString(fmt.Sprintf(format, args...) + "\n")
}

// Close closes the file.
func (l *RunLog) Close() error { return l.f.Close() }

// logged wraps a worker with start and end lines.
func logged[T interface{ Kind() string }](l *RunLog, work func(context.Context, *handler.Job[T]) error) handler.WorkFunc[T] {
	return func(ctx context.Context, j *handler.Job[T]) error {
		l.line("start %s %d %d %d", j.ID, j.Attempt, time.Now().UnixNano(), l.pid)
		err := work(ctx, j)
		outcome := "ok"
		if err != nil {
			outcome = "err"
		}
		l.line("end %s %d %d %d %s", j.ID, j.Attempt, time.Now().UnixNano(), l.pid, outcome)
		return err
	}
}

// loggedResult is logged for a worker with a result: its start and end
// lines, a durable sleep's end logged as "sleep" (no attempt spent).
func loggedResult[T interface{ Kind() string }, R any](l *RunLog, work func(context.Context, *RunLog, *handler.Job[T]) (R, error)) handler.ResultFunc[T, R] {
	return func(ctx context.Context, j *handler.Job[T]) (R, error) {
		l.line("start %s %d %d %d", j.ID, j.Attempt, time.Now().UnixNano(), l.pid)
		res, err := work(ctx, l, j)
		outcome := "ok"
		switch {
		case handler.IsSleep(err):
			outcome = "sleep" // no attempt spent
		case err != nil:
			outcome = "err"
		}
		l.line("end %s %d %d %d %s", j.ID, j.Attempt, time.Now().UnixNano(), l.pid, outcome)
		return res, err
	}
}

// Registry is the kinds' registry every soak worker runs, logging to l.
func Registry(l *RunLog) *handler.Registry {
	reg := handler.NewRegistry()
	fast := func(int) time.Duration { return 200 * time.Millisecond }
	handler.AddWorker(reg, logged(l, func(context.Context, *handler.Job[OK]) error { return nil }), &handler.KindOptions{Backoff: fast})
	handler.AddWorker(reg, logged(l, func(_ context.Context, j *handler.Job[Flaky]) error {
		if j.Attempt <= j.Args.Fails {
			return errors.New("soak: flaky, not yet")
		}
		return nil
	}), &handler.KindOptions{Backoff: fast})
	handler.AddWorker(reg, logged(l, func(context.Context, *handler.Job[Doomed]) error {
		return errors.New("soak: doomed")
	}), &handler.KindOptions{Backoff: fast, OnDeadLetter: func(_ context.Context, rec ledger.Record, _ error) error {
		l.line("dead %s %d", rec.ID, l.pid)
		return nil
	}})
	handler.AddWorker(reg, logged(l, func(ctx context.Context, j *handler.Job[Slow]) error {
		if j.Attempt > 1 {
			return nil
		}
		select {
		case <-ctx.Done(): // the kind's timeout
			return ctx.Err()
		case <-time.After(2 * SlowTimeout):
			return errors.New("soak: the slow job's timeout did not end it")
		}
	}), &handler.KindOptions{Backoff: fast, Timeout: SlowTimeout})
	handler.AddWorker(reg, logged(l, func(ctx context.Context, j *handler.Job[Limited]) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(limitedRun):
			return nil
		}
	}), &handler.KindOptions{Backoff: fast, Concurrency: &handler.Concurrency{
		Key: handler.ArgsKey(func(a Limited) string { return a.Tenant }), Limit: LimitPerTenant, // waiters woken by the holders ahead (no MaxBackoff)
	}})
	handler.AddWorker(reg, logged(l, func(context.Context, *handler.Job[Throttled]) error { return nil }), &handler.KindOptions{Backoff: fast, Throttle: &handler.Throttle{
		Key: handler.ArgsKey(func(a Throttled) string { return a.Tenant }), Limit: ThrottleLimit, Period: ThrottlePeriod,
	}})
	handler.AddWorker(reg, logged(l, func(context.Context, *handler.Job[Keyed]) error { return nil }), &handler.KindOptions{Backoff: fast, Concurrency: &handler.Concurrency{
		Key: handler.ArgsKey(func(a Keyed) string {
			if panics(a.N) {
				panic("soak: a key function with a bug")
			}
			return a.Tenant
		}), Limit: 3, MaxBackoff: time.Second, // waiters that look again by themselves too
	}})
	handler.AddWorker(reg, logged(l, func(context.Context, *handler.Job[Fired]) error { return nil }), &handler.KindOptions{Backoff: fast})
	handler.AddWorkerResult(reg, loggedResult(l, durable), &handler.KindOptions{Backoff: fast})
	handler.AddWorkerResult(reg, loggedResult(l, invoker), &handler.KindOptions{Backoff: fast})
	handler.AddWorkerResult(reg, loggedResult(l, func(_ context.Context, _ *RunLog, j *handler.Job[Kid]) (int, error) {
		if j.Args.Fail {
			return 0, handler.Permanent(errors.New("soak: kid fails"))
		}
		return j.Args.I * 10, nil
	}), &handler.KindOptions{Backoff: fast})
	return reg
}

// invoker is an Invoker job's run.
func invoker(ctx context.Context, l *RunLog, j *handler.Job[Invoker]) (InvokerResult, error) {
	var r InvokerResult
	failing := map[int]bool{}
	for _, i := range j.Args.Fail {
		failing[i] = true
	}
	for i := range j.Args.Steps {
		if _, err := loggedStep(ctx, l, j.ID, fmt.Sprintf("many%d", i), "", func() int { return i }); err != nil {
			return r, err
		}
	}
	calls := 0
	retried, err := handler.StepWith(ctx, "retried", &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return 50 * time.Millisecond }}, func(context.Context) (int64, error) {
		if calls++; calls == 1 {
			return 0, errors.New("soak: the first call of a retried step fails")
		}
		v := time.Now().UnixNano()
		l.line("step %s retried %d %d %d", j.ID, v, time.Now().UnixNano(), l.pid)
		return v, nil
	})
	if err != nil {
		return r, err
	}
	l.line("got %s retried %d %d %d", j.ID, retried, time.Now().UnixNano(), l.pid)
	if j.Args.Big {
		v, err := handler.Step(ctx, "big", func(context.Context) (string, error) {
			v := strings.Repeat(strconv.FormatInt(time.Now().UnixNano(), 10), BigStep/19+1)[:BigStep]
			l.line("step %s big %s %d %d", j.ID, hashOf(v), time.Now().UnixNano(), l.pid)
			return v, nil
		})
		if err != nil {
			return r, err
		}
		l.line("got %s big %s %d %d", j.ID, hashOf(v), time.Now().UnixNano(), l.pid)
	}
	// Parallel steps first: a map over MapItems items, three at a time,
	// each item's call logged as a step "item<i>" and its return as got
	// (checker durable: an item recorded never runs again, and returns
	// one value).
	items := make([]int, MapItems)
	for i := range items {
		items[i] = i
	}
	lines, err := handler.Map(ctx, "lines"+j.Args.Sfx, items, func(_ context.Context, i, _ int) (int64, error) {
		v := time.Now().UnixNano()
		l.line("step %s item%d %d %d %d", j.ID, i, v, time.Now().UnixNano(), l.pid)
		return v, nil
	}, &handler.MapOptions{MaxConcurrency: 3})
	if err != nil {
		return r, err
	}
	for i, v := range lines.Values {
		l.line("got %s item%d %d %d %d", j.ID, i, v, time.Now().UnixNano(), l.pid)
	}
	kids := make([]handler.Child, j.Args.Kids)
	for i := range kids {
		c, err := handler.InvokeAsync(ctx, fmt.Sprintf("kid%d%s", i, j.Args.Sfx), Kid{N: j.Args.N, I: i, Fail: failing[i]}, nil)
		if err != nil {
			return r, err
		}
		kids[i] = c
	}
	if err := handler.Compensate(ctx, "undo"+j.Args.Sfx, func(context.Context) error {
		l.line("step %s undo 1 %d %d", j.ID, time.Now().UnixNano(), l.pid)
		return nil
	}); err != nil {
		return r, err
	}
	got, err := handler.AwaitAll[int](ctx, kids, KidWait)
	var some *handler.ChildrenError
	if err != nil && !errors.As(err, &some) {
		// A sleep, or the wait could not be read or recorded (a throttle
		// past the SDK's retries): the run ends in it. Going on read no
		// child's result (the 10k soak at seed 1796621327163747107
		// recorded a sum of 0 three times so; checker children).
		return r, err
	}
	for i, v := range got {
		r.Sum += v
		var failed *handler.ChildFailedError
		var late *handler.ChildTimeoutError
		switch {
		case err == nil:
		case errors.As(childErr(err, kids[i]), &failed):
			r.Failed++
		case errors.As(childErr(err, kids[i]), &late):
			r.TimedOut++
		}
	}
	if j.Args.Select {
		names := make([]string, len(SelectNames))
		for i, n := range SelectNames {
			names[i] = n + j.Args.Sfx
		}
		got, err := handler.WaitForAny(ctx, names, SelectWait)
		chosen := slices.Index(names, got.Name)
		var late *handler.SignalTimeoutError
		switch {
		case errors.As(err, &late):
			chosen = -1
		case err != nil:
			return r, err
		}
		l.line("got %s select %d %d %d", j.ID, chosen, time.Now().UnixNano(), l.pid)
	}
	if j.Args.Cond {
		t0, err := loggedStep(ctx, l, j.ID, "t0", "", func() int64 { return time.Now().UnixMilli() })
		if err != nil {
			return r, err
		}
		v, err := handler.WaitForCondition(ctx, "cond"+j.Args.Sfx, func(context.Context) (int64, bool, error) {
			now := time.Now().UnixMilli()
			l.line("step %s look %d %d %d", j.ID, now, time.Now().UnixNano(), l.pid)
			return now, now >= t0+1000, nil
		}, &handler.ConditionOptions{Every: time.Second, Timeout: 30 * time.Second})
		var late *handler.ConditionTimeoutError
		switch {
		case errors.As(err, &late):
			v = -1
		case err != nil:
			return r, err
		}
		l.line("got %s cond %d %d %d", j.ID, v, time.Now().UnixNano(), l.pid)
	}
	// What the run read, as one number (the checker compares it with the
	// children's records): sum×10,000 + failed×100 + timed out.
	if _, err := loggedStep(ctx, l, j.ID, "sum", "", func() int { return r.Sum*10_000 + r.Failed*100 + r.TimedOut }); err != nil {
		return r, err
	}
	if r.Failed > 0 {
		return r, handler.Permanent(errors.New("soak: a child failed")) // its compensation runs
	}
	return r, nil
}

// childErr is the error of child c in AwaitAll's err, nil if none.
func childErr(err error, c handler.Child) error {
	var all *handler.ChildrenError
	if !errors.As(err, &all) {
		return nil
	}
	for _, e := range all.Errs {
		var failed *handler.ChildFailedError
		var late *handler.ChildTimeoutError
		if errors.As(e, &failed) && failed.Child.ID == c.ID || errors.As(e, &late) && late.Child.ID == c.ID {
			return e
		}
	}
	return nil
}

// durable is a Durable job's run.
func durable(ctx context.Context, l *RunLog, j *handler.Job[Durable]) (DurableResult, error) {
	var r DurableResult
	var err error
	sfx := j.Args.Sfx
	n, err := loggedStep(ctx, l, j.ID, "n", sfx, func() int { return j.Args.N })
	if err != nil {
		return r, err
	}
	if n != j.Args.N {
		l.line("argsChanged %s %d %d %d %d", j.ID, n, j.Args.N, time.Now().UnixNano(), l.pid)
	}
	if r.Draw, err = loggedStep(ctx, l, j.ID, "draw", sfx, func() int64 { return time.Now().UnixNano() }); err != nil {
		return r, err
	}
	if err := handler.Sleep(ctx, "nap"+sfx, time.Duration(j.Args.NapMs)*time.Millisecond); err != nil {
		return r, err
	}
	if r.Woke, err = loggedStep(ctx, l, j.ID, "woke", sfx, func() int64 { return time.Now().UnixMilli() }); err != nil {
		return r, err
	}
	wait := DurableWait
	if j.Args.WaitMs != 0 {
		wait = time.Duration(j.Args.WaitMs) * time.Millisecond
	}
	p, err := handler.WaitForSignal[int](ctx, "go"+sfx, wait)
	var timeout *handler.SignalTimeoutError
	switch {
	case errors.As(err, &timeout):
		p = -1
	case err != nil:
		return r, err
	}
	if r.Signal, err = loggedStep(ctx, l, j.ID, "signal", sfx, func() int { return p }); err != nil {
		return r, err
	}
	if j.Attempt <= j.Args.Fails {
		return r, errors.New("soak: durable, not yet")
	}
	return r, nil
}

// hashOf is a short hash of a big value, for the logs.
func hashOf(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:8])
}

// loggedStep is handler.Step of fn under the name name+sfx, logging
// "step ID NAME VALUE UNIXNANO PID" when fn runs and "got ID NAME VALUE
// UNIXNANO PID" when the step returns its result (recorded, or replayed):
// the log names it without its suffix (one word).
func loggedStep[V any](ctx context.Context, l *RunLog, id, name, sfx string, fn func() V) (V, error) {
	v, err := handler.Step(ctx, name+sfx, func(context.Context) (V, error) {
		v := fn()
		l.line("step %s %s %v %d %d", id, name, v, time.Now().UnixNano(), l.pid)
		return v, nil
	})
	if err == nil {
		l.line("got %s %s %v %d %d", id, name, v, time.Now().UnixNano(), l.pid)
	}
	return v, err
}
