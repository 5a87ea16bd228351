package replay_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/replay"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

type order struct {
	Items []string `json:"items"`
	Total int      `json:"total"`
}

func (order) Kind() string { return "replay.order" }

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// enqueueDelay keeps a job from running: an open job never started.
var enqueueDelay = enqueue.Opts{Delay: time.Hour}

// version is one build of the order worker: what a deploy changes.
type version struct {
	charge      string        // the charge step's name
	aliases     []string      // its former names
	chargeAsInt bool          // its result type changed to an int
	noCoolOff   bool          // the sleep removed
	signal      string        // the signal waited for
	shipFirst   bool          // a new step before the wait
	perItem     bool          // a step per item (names from the args)
	calls       *atomic.Int64 // counts the step functions that ran (a replay calls none); nil: not counted
}

func v1() version { return version{charge: "charge", signal: "shipped", perItem: true} }

func (v version) registry() *handler.Registry {
	reg := handler.NewRegistry()
	calls := v.calls
	if calls == nil {
		calls = new(atomic.Int64)
	}
	handler.AddWorker(reg, handler.WorkFunc[order](func(ctx context.Context, j *handler.Job[order]) error {
		if v.perItem {
			for i := range j.Args.Items {
				if _, err := handler.Step(ctx, "reserve/"+j.Args.Items[i], func(context.Context) (int, error) { calls.Add(1); return i, nil }); err != nil {
					return err
				}
			}
		}
		opts := &handler.StepOptions{Aliases: v.aliases}
		if v.chargeAsInt {
			if _, err := handler.StepWith(ctx, v.charge, opts, func(context.Context) (int, error) { calls.Add(1); return j.Args.Total, nil }); err != nil {
				return err
			}
		} else if _, err := handler.StepWith(ctx, v.charge, opts, func(context.Context) (receipt, error) {
			calls.Add(1)
			return receipt{ID: "r-1", Amount: j.Args.Total}, nil
		}); err != nil {
			return err
		}
		if !v.noCoolOff {
			if err := handler.Sleep(ctx, "cool-off", 48*time.Hour); err != nil {
				return err
			}
		}
		if v.shipFirst {
			if _, err := handler.Step(ctx, "label", func(context.Context) (string, error) { calls.Add(1); return "L", nil }); err != nil {
				return err
			}
		}
		if _, err := handler.WaitForSignal[string](ctx, v.signal, 7*24*time.Hour); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "ship", func(context.Context) (string, error) { calls.Add(1); return "shipped", nil })
		return err
	}), nil)
	return reg
}

// sleeping and waiting are two open jobs of v1: one in its 48-hour sleep,
// one past it, waiting for its signal; and one never run.
func openJobs(t *testing.T, o *replay.Options) (replay.Export, *nexjobtest.Env) {
	t.Helper()
	e := nexjobtest.New(t, nil)
	h := e.Handler(t, v1().registry(), nil)
	ctx := context.Background()
	first, err := e.Client.Enqueue(ctx, order{Items: []string{"a", "b"}, Total: 42}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, h)
	e.RequireState(t, first.ID, ledger.Scheduled) // in its sleep
	e.Advance(t, 49*time.Hour)
	second, err := e.Client.Enqueue(ctx, order{Items: []string{"c"}, Total: 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, h) // the first wakes and waits; the second sleeps
	e.RequireState(t, second.ID, ledger.Scheduled)
	if _, ok := e.Get(t, first.ID).Steps[ledger.WaitStep("shipped")]; !ok {
		t.Fatalf("the first job does not wait for its signal: %+v", e.Get(t, first.ID))
	}
	if _, err := e.Client.Enqueue(ctx, order{Items: []string{"d"}, Total: 1}, &enqueueDelay); err != nil {
		t.Fatal(err)
	}
	return e.Export(t, "replay.order", o), e
}

// TestReplayCheck: the jobs in flight replay against the code that
// recorded them with no divergence and no step function called; each
// incompatible change (a rename, a changed result type, a removed sleep, a
// wait for another signal, a step moved before a recorded wait) is
// reported naming the job, the recorded step and where the new code went;
// a rename with its alias is not.
func TestReplayCheck(t *testing.T) {
	t.Parallel()
	ex, _ := openJobs(t, nil)
	if len(ex.Jobs) != 3 {
		t.Fatalf("exported %d open jobs, want 3", len(ex.Jobs))
	}
	ctx := context.Background()
	check := func(v version) replay.Report {
		t.Helper()
		v.calls = new(atomic.Int64)
		rep, err := replay.Check(ctx, v.registry(), ex)
		if err != nil {
			t.Fatal(err)
		}
		if n := v.calls.Load(); n != 0 {
			t.Fatalf("the replay called %d step functions, want none", n)
		}
		if rep.Jobs != 2 || rep.NotStarted != 1 {
			t.Fatalf("replayed %d jobs, %d not started; want 2 and 1", rep.Jobs, rep.NotStarted)
		}
		return rep
	}
	if rep := check(v1()); len(rep.Divergences) != 0 {
		t.Fatalf("the code that recorded the jobs diverges from them: %v", rep.Err())
	}
	renamed := v1()
	renamed.charge = "charge-card"
	aliased := renamed
	aliased.aliases = []string{"charge"}
	if rep := check(aliased); len(rep.Divergences) != 0 {
		t.Fatalf("a rename with its alias diverges: %v", rep.Err())
	}
	typed := v1()
	typed.chargeAsInt = true
	noSleep := v1()
	noSleep.noCoolOff = true
	otherSignal := v1()
	otherSignal.signal = "delivered"
	moved := v1()
	moved.shipFirst = true
	for _, c := range []struct {
		name     string
		v        version
		n        int    // divergences: one per job unless the change meets only one
		recorded string // the recorded step each names
		current  string // where the new code went
		problem  string
	}{
		{"rename", renamed, 2, "charge", "charge-card", "does not reach"},
		{"result type", typed, 2, "charge", "", "does not decode as int"},
		{"removed sleep", noSleep, 2, "cool-off", ledger.WaitStep("shipped"), "does not reach"},
		{"another signal", otherSignal, 1, ledger.WaitStep("shipped"), ledger.WaitStep("delivered"), "the job waited here"},
		{"a step before the wait", moved, 1, ledger.WaitStep("shipped"), "label", "the job waited here"},
	} {
		rep := check(c.v)
		if len(rep.Divergences) != c.n {
			t.Errorf("%s: %d divergences, want %d: %v", c.name, len(rep.Divergences), c.n, rep.Err())
			continue
		}
		for _, d := range rep.Divergences {
			if d.Recorded != c.recorded || d.Current != c.current || !strings.Contains(d.Problem, c.problem) || d.JobID == "" {
				t.Errorf("%s: %s; want recorded %q, current %q, a problem saying %q", c.name, d, c.recorded, c.current, c.problem)
			}
		}
	}
}

// TestReplayCheckRedacted: a redacted export holds no arg or value of
// the jobs' (strings blanked, numbers 0), still replays with no
// divergence, and still finds a rename and a result whose shape changed.
func TestReplayCheckRedacted(t *testing.T) {
	t.Parallel()
	ex, _ := openJobs(t, &replay.Options{Redact: true})
	path := filepath.Join(t.TempDir(), "open.json")
	if err := replay.Write(path, ex); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{`r-1`, `\"total\":42`, `\"amount\":42`, `\"items\":[\"a\"`} {
		if strings.Contains(string(b), secret) {
			t.Errorf("the redacted export holds %s:\n%s", secret, b)
		}
	}
	// Step names are kept (they are the code's), values' shapes too.
	if !strings.Contains(string(b), `reserve/a`) || !strings.Contains(string(b), `\"amount\":0`) {
		t.Errorf("the redacted export lost a step's name or its value's shape:\n%s", b)
	}
	ctx := context.Background()
	rep, err := replay.Check(ctx, v1().registry(), ex)
	if err != nil {
		t.Fatal(err)
	}
	// The per-item steps are named from the args, which are blanked: the
	// replay reaches "reserve/" and not "reserve/a" (documented).
	for _, d := range rep.Divergences {
		if !strings.HasPrefix(d.Recorded, "reserve/") {
			t.Errorf("redacted, the recording code diverges: %s", d)
		}
	}
	plain := v1()
	plain.perItem = false
	typed := plain
	typed.chargeAsInt = true
	rep, err = replay.Check(ctx, typed.registry(), ex)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range rep.Divergences {
		found = found || d.Recorded == "charge" && strings.Contains(d.Problem, "does not decode")
	}
	if !found {
		t.Errorf("redacted, a result whose shape changed (an object to an int) is not reported: %v", rep.Err())
	}
}

// TestReplayRun: the deploy check's main on a file exits 1 and prints the
// step on a divergence, 0 without, 2 on an export it cannot read.
func TestReplayRun(t *testing.T) {
	t.Parallel()
	ex, _ := openJobs(t, nil)
	path := filepath.Join(t.TempDir(), "open.json")
	if err := replay.Write(path, ex); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if code := replay.Run(context.Background(), v1().registry(), []string{"-file", path}, &out); code != 0 {
		t.Fatalf("exit %d with the recording code:\n%s", code, out.String())
	}
	renamed := v1()
	renamed.charge = "charge-card"
	out.Reset()
	if code := replay.Run(context.Background(), renamed.registry(), []string{"-file", path}, &out); code != 1 || !strings.Contains(out.String(), `recorded step "charge"`) || !strings.Contains(out.String(), `"charge-card"`) {
		t.Fatalf("exit %d after a rename, want 1 naming both names:\n%s", code, out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"format": 99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := replay.Run(context.Background(), v1().registry(), []string{"-file", bad}, &out); code != 2 {
		t.Fatalf("exit %d on an export of another format, want 2:\n%s", code, out.String())
	}
}

// TestReplayMakesNoCall: a worker that reaches AWS outside its steps (a
// Client from its context) fails the replay with a divergence saying so,
// and a kind no longer registered is a divergence of each of its jobs.
func TestReplayMakesNoCall(t *testing.T) {
	t.Parallel()
	ex, _ := openJobs(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[order](func(ctx context.Context, j *handler.Job[order]) error {
		if _, err := handler.ClientFrom(ctx); err != nil {
			return err
		}
		return errors.New("unreachable")
	}), nil)
	rep, err := replay.Check(context.Background(), reg, ex)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergences) == 0 || !strings.Contains(rep.Err().Error(), "ended in an error") {
		t.Fatalf("a worker reaching for a client in a replay: %v", rep.Err())
	}
	rep, err = replay.Check(context.Background(), handler.NewRegistry(), ex)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergences) != 3 || !strings.Contains(rep.Divergences[0].Problem, "not registered") {
		t.Fatalf("a removed kind: %v", rep.Err())
	}
}
