package handler_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Attacks on handler.Map's promises (docs/durable-jobs.md "Map: items in
// parallel, each a step"; go doc handler.Map, MapOptions, Completion).

// mapOutcome is what one run's Map returned.
type mapOutcome struct {
	res handler.MapResult[string]
	err error
}

// "at most MaxConcurrency at once (default 10) ... results in the items'
// order", each item called once: at a concurrency of 1, 50 and the
// default (0).
func TestAttack39MapBoundAndOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []int{1, 50, 0} {
		t.Run(fmt.Sprint("concurrency ", c), func(t *testing.T) {
			t.Parallel()
			var running, most atomic.Int32
			var got mapOutcome
			r := &rig39{}
			r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
				items := make([]int, 120)
				for i := range items {
					items[i] = i * 7
				}
				res, err := handler.Map(ctx, "bound", items, func(ctx context.Context, i, item int) (string, error) {
					n := running.Add(1)
					defer running.Add(-1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					r.call("item %d", i)
					for range (120 - i) % 13 { // uneven lengths: later items may finish first
						runtime.Gosched()
					}
					return fmt.Sprint("v", item), nil
				}, &handler.MapOptions{MaxConcurrency: c})
				got = mapOutcome{res, err}
				return err
			}})
			id := enqueueOne(t, r.e.Client, a39{}, nil)
			r.e.Drain(t, r.h)
			bound := int32(c)
			if c == 0 {
				bound = handler.DefaultMapConcurrency
			}
			if m := most.Load(); m > bound {
				t.Errorf("promise \"at most MaxConcurrency at once\": %d items ran at once at MaxConcurrency %d", m, c)
			}
			if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || got.err != nil {
				t.Fatalf("job %s (%s), map error %v", rec.State, rec.LastError, got.err)
			}
			for i := range 120 {
				if r.n("item %d", i) != 1 || got.res.Values[i] != fmt.Sprint("v", i*7) || !got.res.Done[i] {
					t.Fatalf("promise \"results in the items' order\", each item once: item %d called %d times, value %q, done %v", i, r.n("item %d", i), got.res.Values[i], got.res.Done[i])
				}
			}
		})
	}
}

// A negative MaxConcurrency (bad input) must neither hang the map nor run
// more than the default at once: it is either refused or taken as the
// default.
func TestAttack39MapNegativeConcurrency(t *testing.T) {
	t.Parallel()
	var running, most atomic.Int32
	var got mapOutcome
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		res, err := handler.Map(ctx, "neg", make([]int, 30), func(ctx context.Context, i, item int) (string, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			r.call("item %d", i)
			runtime.Gosched()
			return "ok", nil
		}, &handler.MapOptions{MaxConcurrency: -3})
		got = mapOutcome{res, err}
		if err != nil {
			return handler.Permanent(err)
		}
		return nil
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if got.err == nil {
		for i := range 30 {
			if r.n("item %d", i) != 1 || got.res.Values[i] != "ok" {
				t.Fatalf("MaxConcurrency -3 taken: item %d called %d times", i, r.n("item %d", i))
			}
		}
	} else if r.n("item 0") != 0 && len(got.res.Done) == 0 {
		t.Fatalf("MaxConcurrency -3 refused (%v) after calling items", got.err)
	}
	if m := most.Load(); m > handler.DefaultMapConcurrency {
		t.Errorf("MaxConcurrency -3: %d items ran at once", m)
	}
	t.Logf("MaxConcurrency -3: map error %v, job %s, at most %d at once", got.err, rec.State, most.Load())
}

// The tolerated-failure policies at their edges: "ToleratedFailures and
// ToleratedShare let that many items, or that share of them (0 to 1),
// fail before the map fails; the map fails as soon as either one set is
// passed". A kept failure "is recorded too, once the map is done, so a
// later run sees the same outcome" (the job sleeps after the map and the
// woken run replays it).
func TestAttack39MapToleratedEdges(t *testing.T) {
	t.Parallel()
	for _, c := range []tolCase{
		{"2 of 5 with 2 tolerated", 5, func(i int) bool { return i == 1 || i == 3 }, handler.Completion{ToleratedFailures: 2}, false},
		{"3 of 5 with 2 tolerated", 5, firstK(3), handler.Completion{ToleratedFailures: 2}, true},
		{"2 of 5 at share 0.4", 5, firstK(2), handler.Completion{ToleratedShare: 0.4}, false},
		{"3 of 5 at share 0.4", 5, firstK(3), handler.Completion{ToleratedShare: 0.4}, true},
		{"58 of 100 at share 0.57", 100, firstK(58), handler.Completion{ToleratedShare: 0.57}, true},
		{"2 of 5, 3 tolerated but share 0.2", 5, firstK(2), handler.Completion{ToleratedFailures: 3, ToleratedShare: 0.2}, true},
		{"5 of 5 at share 1", 5, firstK(5), handler.Completion{ToleratedShare: 1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runTolerated(t, c)
		})
	}
}

// BREAK: "ToleratedFailures and ToleratedShare let that many items, or
// that share of them (0 to 1), fail before the map fails; the map fails
// as soon as either one set is passed" (go doc handler.Completion): 29 of
// 100 items failing at ToleratedShare 0.29 (57 at 0.57) fail the map,
// though their share is exactly the one tolerated, not passed.
func TestAttack39MapToleratedShareExact(t *testing.T) {
	t.Parallel()
	for _, c := range []tolCase{
		{"29 of 100 at share 0.29", 100, firstK(29), handler.Completion{ToleratedShare: 0.29}, false},
		{"57 of 100 at share 0.57", 100, firstK(57), handler.Completion{ToleratedShare: 0.57}, false},
		{"3 of 10 at share 0.3", 10, firstK(3), handler.Completion{ToleratedShare: 0.3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runTolerated(t, c)
		})
	}
}

type tolCase struct {
	name  string
	n     int
	fail  func(i int) bool
	pol   handler.Completion
	fails bool
}

func nfailed(c tolCase) int {
	n := 0
	for i := range c.n {
		if c.fail(i) {
			n++
		}
	}
	return n
}

func firstK(k int) func(int) bool { return func(i int) bool { return i < k } }

func runTolerated(t *testing.T, c tolCase) {
	var mu sync.Mutex
	outs := map[int]mapOutcome{}
	runs := 0
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		mu.Lock()
		runs++
		run := runs
		mu.Unlock()
		res, err := handler.Map(ctx, "tol", make([]int, c.n), func(ctx context.Context, i, _ int) (string, error) {
			r.call("item %d", i)
			if c.fail(i) {
				return "", fmt.Errorf("item %d declined", i)
			}
			return fmt.Sprint("ok-", i), nil
		}, &handler.MapOptions{MaxConcurrency: 1, Completion: c.pol})
		mu.Lock()
		outs[run] = mapOutcome{res, err}
		mu.Unlock()
		if err != nil {
			return handler.Permanent(err)
		}
		return handler.Sleep(ctx, "after", time.Hour)
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	mu.Lock()
	defer mu.Unlock()
	first := outs[1]
	var failed *handler.MapFailedError
	if c.fails {
		if !errors.As(first.err, &failed) {
			t.Fatalf("promise \"the map fails as soon as either one set is passed\": map error %v, want a *MapFailedError", first.err)
		}
		called := 0
		for i := range c.n {
			called += r.n("item %d", i)
		}
		// At a concurrency of 1 the map passes its policy at the
		// failing item and starts none more.
		last := 0
		for i := range c.n {
			if r.n("item %d", i) > 0 {
				last = i
			}
		}
		if !c.fail(last) {
			t.Errorf("promise \"when it fails ... none more starts\": item %d (a success) was started after the failing one (%d items called)", last, called)
		}
		return
	}
	if first.err != nil {
		t.Fatalf("promise \"ToleratedFailures / ToleratedShare let that many items, or that share of them, fail before the map fails\": %d of %d failing at %+v failed the map: %v", nfailed(c), c.n, c.pol, first.err)
	}
	second, ok := outs[2]
	if !ok {
		rec := r.e.Get(t, id)
		t.Fatalf("no woken run: job %s (%s)", rec.State, rec.LastError)
	}
	for i := range c.n {
		var ie *handler.MapItemError
		for k, o := range []mapOutcome{first, second} {
			if c.fail(i) && (!errors.As(o.res.Errs[i], &ie) || ie.Index != i || !o.res.Done[i]) {
				t.Fatalf("run %d, item %d: err %v, done %v; want its kept failure", k+1, i, o.res.Errs[i], o.res.Done[i])
			}
			if !c.fail(i) && o.res.Values[i] != fmt.Sprint("ok-", i) {
				t.Fatalf("run %d, item %d: value %q", k+1, i, o.res.Values[i])
			}
		}
		if r.n("item %d", i) != 1 {
			t.Fatalf("promise \"a failure the map keeps is recorded too ... a later run sees the same outcome\": item %d called %d times", i, r.n("item %d", i))
		}
	}
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded {
		t.Fatalf("job %s (%s)", rec.State, rec.LastError)
	}
}

// FirstSuccess: "fails when every item failed"; "those running are
// cancelled and their outcome dropped"; "The winner is recorded (the step
// name#first): a replay returns it, whatever finishes first then."
func TestAttack39MapFirstSuccess(t *testing.T) {
	t.Parallel()
	t.Run("every item fails", func(t *testing.T) {
		t.Parallel()
		var got mapOutcome
		r := &rig39{}
		r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
			res, err := handler.Map(ctx, "any", make([]int, 10), func(ctx context.Context, i, _ int) (string, error) {
				r.call("item %d", i)
				return "", fmt.Errorf("no %d", i)
			}, &handler.MapOptions{MaxConcurrency: 50, Completion: handler.Completion{FirstSuccess: true}})
			got = mapOutcome{res, err}
			if err != nil {
				return handler.Permanent(err)
			}
			return nil
		}})
		id := enqueueOne(t, r.e.Client, a39{}, nil)
		r.e.Drain(t, r.h)
		if got.err == nil {
			t.Fatalf("promise \"it fails when every item failed\": map error nil, job %s", r.e.Get(t, id).State)
		}
		for i := range 10 {
			if r.n("item %d", i) != 1 {
				t.Fatalf("item %d called %d times", i, r.n("item %d", i))
			}
		}
	})
	t.Run("the winner is replayed", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		outs := map[int]mapOutcome{}
		runs := 0
		r := &rig39{}
		r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
			mu.Lock()
			runs++
			run := runs
			mu.Unlock()
			res, err := handler.Map(ctx, "any", make([]int, 10), func(ctx context.Context, i, _ int) (string, error) {
				r.call("run %d item %d", run, i)
				if run == 1 && i != 7 {
					<-ctx.Done() // cancelled once 7 wins: it returns a success all the same
					return fmt.Sprint("late-", i), nil
				}
				return fmt.Sprint("win-", i), nil
			}, &handler.MapOptions{MaxConcurrency: 50, Completion: handler.Completion{FirstSuccess: true}})
			mu.Lock()
			outs[run] = mapOutcome{res, err}
			mu.Unlock()
			if err != nil {
				return err
			}
			return handler.Sleep(ctx, "after", time.Hour)
		}})
		id := enqueueOne(t, r.e.Client, a39{}, nil)
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Hour+time.Minute)
		r.e.Drain(t, r.h)
		mu.Lock()
		defer mu.Unlock()
		for run := 1; run <= 2; run++ {
			o := outs[run]
			if o.err != nil || o.res.Values[7] != "win-7" || !o.res.Done[7] {
				t.Fatalf("promise \"a replay returns [the winner]\": run %d: %v, values %q, done %v", run, o.err, o.res.Values, o.res.Done)
			}
			for i := range 10 {
				if i != 7 && (o.res.Done[i] || o.res.Values[i] != "") {
					t.Fatalf("promise \"those running are cancelled and their outcome dropped\": run %d, item %d: %q done %v", run, i, o.res.Values[i], o.res.Done[i])
				}
			}
		}
		for i := range 10 {
			if n := r.n("run 2 item %d", i); n != 0 {
				t.Errorf("the replay called item %d (%d times): the recorded winner should be returned", i, n)
			}
		}
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded {
			t.Fatalf("job %s (%s)", rec.State, rec.LastError)
		}
	})
}

// An item's record with its reply lost reads as recorded (one call); one
// throttled past the SDK's retries fails the run, and "the job's retry
// replays the finished items and runs only the rest".
func TestAttack39MapLostReplyAndThrottle(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	outs := map[int]mapOutcome{}
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		res, err := handler.Map(ctx, "lines", make([]int, 20), func(ctx context.Context, i, _ int) (string, error) {
			r.call("item %d", i)
			return fmt.Sprint("ok-", i), nil
		}, &handler.MapOptions{MaxConcurrency: 5})
		mu.Lock()
		outs[j.Attempt] = mapOutcome{res, err}
		mu.Unlock()
		return err
	}, kopts: &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }}})
	item := func(i int) func([]byte) bool {
		return func(b []byte) bool { return strings.Contains(string(b), fmt.Sprintf(`lines#%d"`, i)) }
	}
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: item(3), Fault: faults.LostReply})
	thr := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: item(11), Fault: faults.Throttle, Times: faults.Attempts})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	fired(t, lost, 1)
	fired(t, thr, faults.Attempts)
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Succeeded || rec.Attempt != 2 || outs[2].err != nil {
		t.Fatalf("job %s at attempt %d (%s), map errors %v then %v", rec.State, rec.Attempt, rec.LastError, outs[1].err, outs[2].err)
	}
	for i := range 20 {
		want := 1
		if i == 11 {
			want = 2
		}
		if r.n("item %d", i) != want || outs[2].res.Values[i] != fmt.Sprint("ok-", i) {
			t.Errorf("promise \"the job's retry replays the finished items and runs only the rest\" (a lost reply reads as recorded): item %d called %d times (want %d), value %q", i, r.n("item %d", i), want, outs[2].res.Values[i])
		}
	}
}

// A duplicate delivery of a job whose map is running does not run the
// map again: each item is called once.
func TestAttack39MapDuplicateDelivery(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		_, err := handler.Map(ctx, "dup", make([]int, 6), func(ctx context.Context, i, _ int) (string, error) {
			r.call("item %d", i)
			if i == 2 {
				once.Do(func() { close(started) })
				<-release
			}
			return "ok", nil
		}, &handler.MapOptions{MaxConcurrency: 3})
		return err
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	ctx := context.Background()
	done := make(chan struct{})
	go func() { defer close(done); r.deliver(ctx, id, "a39", "first") }()
	<-started
	for k := range 3 {
		r.deliver(ctx, id, "a39", fmt.Sprint("dup", k))
	}
	close(release)
	<-done
	r.e.Drain(t, r.h) // the enqueue's own message
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("job %s at attempt %d (%s)", rec.State, rec.Attempt, rec.LastError)
	}
	for i := range 6 {
		if r.n("item %d", i) != 1 {
			t.Errorf("promise: each item a step, called once; item %d called %d times after duplicate deliveries", i, r.n("item %d", i))
		}
	}
}

// A run taken over (its lease passed on a skewed-ahead clock) while its
// items run: the taking run records the items; the first run's late
// calls do not replace them, and it goes on with the recorded values or
// is fenced ("the first write wins": the run goes on with it, not with
// its own).
func TestAttack39MapTakeoverFirstWriteWins(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	outs := map[int]mapOutcome{}
	runs := 0
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		mu.Lock()
		runs++
		run := runs
		mu.Unlock()
		var wg sync.WaitGroup
		wg.Add(4)
		res, err := handler.Map(ctx, "take", make([]int, 4), func(ctx context.Context, i, _ int) (string, error) {
			r.call("run %d item %d", run, i)
			if run == 1 {
				wg.Done()
				if i == 0 {
					wg.Wait()
					close(started)
				}
				<-release
			}
			return fmt.Sprintf("run%d-%d", run, i), nil
		}, &handler.MapOptions{MaxConcurrency: 4})
		mu.Lock()
		outs[run] = mapOutcome{res, err}
		mu.Unlock()
		return err
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
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	if runs < 2 {
		t.Fatalf("the second delivery did not take the run over (job %s): nothing attacked", rec.State)
	}
	for i := range 4 {
		want := fmt.Sprintf("run2-%d", i)
		if outs[2].res.Values[i] != want {
			t.Fatalf("the taking run's item %d: %q, %v", i, outs[2].res.Values[i], outs[2].err)
		}
		if outs[1].err == nil && outs[1].res.Values[i] != want {
			t.Errorf("promise \"the first write of a step wins: the run goes on with it, not with its own\": the taken-over run's map returned item %d as %q, the record says %q", i, outs[1].res.Values[i], want)
		}
	}
	if rec.State != ledger.Succeeded {
		t.Fatalf("job %s (%s)", rec.State, rec.LastError)
	}
	for i := range 4 {
		if v := rec.Steps[fmt.Sprintf("take#%d", i)]; !strings.Contains(v, fmt.Sprintf("%q", fmt.Sprintf("run2-%d", i))) {
			t.Errorf("item %d recorded as %s after the late run: want the first write, run2's", i, v)
		}
	}
	t.Logf("the taken-over run's map: %v", outs[1].err)
}

// A map named with every printable ASCII character but '#', replayed
// after a sleep: the same values, no item called again. An empty slice is
// an empty result. (The docs state no rule for a map's name; the library
// refuses a '#' in it, permanently: a name with every printable character
// is refused before any item is called.)
func TestAttack39MapPrintableName(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for c := byte(' '); c <= '~'; c++ {
		b.WriteByte(c)
	}
	all := b.String()
	for _, name := range []string{strings.ReplaceAll(all, "#", ""), all} {
		t.Run(fmt.Sprintf("%d characters", len(name)), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			outs := map[int]mapOutcome{}
			empty := map[int]mapOutcome{}
			runs := 0
			r := &rig39{}
			r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
				mu.Lock()
				runs++
				run := runs
				mu.Unlock()
				res, err := handler.Map(ctx, name, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}, func(ctx context.Context, i int, s string) (string, error) {
					r.call("item %d", i)
					return s + s, nil
				}, nil)
				e, eerr := handler.Map(ctx, "empty", []int{}, func(ctx context.Context, i, _ int) (string, error) { return "x", nil }, nil)
				mu.Lock()
				outs[run], empty[run] = mapOutcome{res, err}, mapOutcome{e, eerr}
				mu.Unlock()
				if err != nil {
					return err
				}
				return handler.Sleep(ctx, "after", time.Hour)
			}})
			id := enqueueOne(t, r.e.Client, a39{}, nil)
			r.e.Drain(t, r.h)
			r.e.Advance(t, time.Hour+time.Minute)
			r.e.Drain(t, r.h)
			rec := r.e.Get(t, id)
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(name, "#") {
				if outs[1].err == nil {
					t.Logf("a name with '#' was taken")
				} else {
					for i := range 12 {
						if r.n("item %d", i) != 0 {
							t.Fatalf("a map name refused (%v) after item %d was called", outs[1].err, i)
						}
					}
					t.Logf("a name with '#' refused before any item ran: job %s (%s)", rec.State, rec.LastError)
					return
				}
			}
			if rec.State != ledger.Succeeded || runs != 2 {
				t.Fatalf("job %s (%s) after %d runs; map %v", rec.State, rec.LastError, runs, outs[1].err)
			}
			for run := 1; run <= 2; run++ {
				for i, s := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
					if outs[run].res.Values[i] != s+s || r.n("item %d", i) != 1 {
						t.Fatalf("promise \"every later run gets it back without calling fn\": run %d item %d: %q, called %d times", run, i, outs[run].res.Values[i], r.n("item %d", i))
					}
				}
				if empty[run].err != nil || len(empty[run].res.Values) != 0 {
					t.Fatalf("an empty map: %v, %v", empty[run].res, empty[run].err)
				}
			}
		})
	}
}

// "a Sleep or a wait in an item ends the run once the running items
// return, and the woken run replays the finished items."
func TestAttack39MapItemSleeps(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	outs := map[int]mapOutcome{}
	runs := 0
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		mu.Lock()
		runs++
		run := runs
		mu.Unlock()
		res, err := handler.Map(ctx, "nappy", make([]int, 8), func(ctx context.Context, i, _ int) (string, error) {
			r.call("item %d", i)
			if i == 3 {
				if err := handler.Sleep(ctx, "nap", time.Hour); err != nil {
					return "", err
				}
				r.call("item 3 woke")
			}
			return fmt.Sprint("ok-", i), nil
		}, &handler.MapOptions{MaxConcurrency: 2})
		mu.Lock()
		outs[run] = mapOutcome{res, err}
		mu.Unlock()
		return err
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State.Terminal() {
		t.Fatalf("promise: a Sleep in an item ends the run in the sleep; the job is %s (%s), map %v", rec.State, rec.LastError, outs[1].err)
	}
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("job %s at attempt %d (%s) after %d runs", rec.State, rec.Attempt, rec.LastError, runs)
	}
	last := outs[runs]
	for i := range 8 {
		want := 1
		if i == 3 {
			want = 2 // its function ran to the sleep, then again after it
		}
		if r.n("item %d", i) != want || last.res.Values[i] != fmt.Sprint("ok-", i) {
			t.Errorf("promise \"the woken run replays the finished items\": item %d called %d times (want %d), value %q", i, r.n("item %d", i), want, last.res.Values[i])
		}
	}
	if r.n("item 3 woke") != 1 {
		t.Errorf("item 3 went past its sleep %d times", r.n("item 3 woke"))
	}
}

// A map whose item's record fails (throttled past the SDK's retries)
// lets the items running finish and records them: the retry replays them
// (their functions called once). Before, the map cancelled them, their
// records were lost, and the retry called them again (the 20-item attack
// above, at -count=20 beside a soak: "item 14 called 2 times (want 1)").
// Items 12 to 15 wait here until item 11's record has failed and the map
// has had the time to cancel them.
func TestMapRunningItemsRecordedAfterARunError(t *testing.T) {
	t.Parallel()
	failed := make(chan struct{})
	var once sync.Once
	r := &rig39{}
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		_, err := handler.Map(ctx, "lines", make([]int, 16), func(ctx context.Context, i, _ int) (string, error) {
			r.call("item %d", i)
			if i >= 12 && j.Attempt == 1 {
				<-failed
				select {
				case <-ctx.Done(): // the map cancelled it (before)
				case <-time.After(2 * time.Second):
				}
			}
			return fmt.Sprint("ok-", i), nil
		}, &handler.MapOptions{MaxConcurrency: 5})
		return err
	}, kopts: &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }}})
	item := func(i int) func([]byte) bool {
		return func(b []byte) bool { return strings.Contains(string(b), fmt.Sprintf(`lines#%d"`, i)) }
	}
	n := 0
	thr := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: item(11), Fault: faults.Throttle, Times: faults.Attempts, After: func() {
		if n++; n == faults.Attempts {
			once.Do(func() { close(failed) })
		}
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	r.e.Drain(t, r.h)
	fired(t, thr, faults.Attempts)
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || rec.Attempt != 2 {
		t.Fatalf("job %s at attempt %d (%s)", rec.State, rec.Attempt, rec.LastError)
	}
	for i := 12; i < 16; i++ {
		if got := r.n("item %d", i); got != 1 {
			t.Errorf("item %d, running when item 11's record failed, called %d times: want once (finished and recorded)", i, got)
		}
	}
}
