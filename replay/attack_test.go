package replay_test

// Attacks on the replay check's promise (docs/durable-jobs.md, "The replay
// check"; go doc ./replay): open jobs recorded by version A of a kind's
// worker are checked against version B with one change each. An
// incompatible change must be a divergence naming the recorded step; a
// compatible one must be none; the check must call no step function, no
// condition's check and no compensation.

import (
	"context"
	"errors"
	"fmt"
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

type atkArgs struct {
	N    int  `json:"n"`
	Hold bool `json:"hold"` // a child invoked later than its caller runs
}

func (atkArgs) Kind() string { return "atk.job" }

type atkKid struct {
	N int `json:"n"`
}

func (atkKid) Kind() string { return "atk.kid" }

type rec1 struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// rec2 is rec1 with its "id" field renamed "ref": a recorded rec1 decodes
// into it silently, Ref empty.
type rec2 struct {
	Ref    string `json:"ref"`
	Amount int    `json:"amount"`
}

// counters count what a replay must never do.
type counters struct{ steps, looks, comps atomic.Int64 }

func (c *counters) String() string {
	return fmt.Sprintf("%d step functions, %d condition checks, %d compensations", c.steps.Load(), c.looks.Load(), c.comps.Load())
}

// op is one durable call of a worker; a plan is a version of the worker.
type op struct {
	k        string // step sleep signal any cond invoke map comp token patched permanent panic block
	name     string
	typ      string // str int rec rec2 bool
	aliases  []string
	fail     bool
	d        time.Duration
	names    []string
	branches map[string][]op
	n        int  // a map's items
	inner    []op // a step's or map item's nested calls; patched: the patched branch
	other    []op // patched: the old branch
	backoff  time.Duration
}

type plan struct {
	ops     []op
	patches []string
	entered chan struct{} // block: closed when the run blocks
	release chan struct{} // block: the run goes on when closed
}

func stepOf[T any](ctx context.Context, o op, v T, c *counters, suffix string) error {
	var opts *handler.StepOptions
	if len(o.aliases) > 0 || o.backoff > 0 {
		opts = &handler.StepOptions{Aliases: o.aliases}
		if o.backoff > 0 {
			opts.MaxAttempts = 3
			opts.Backoff = func(int) time.Duration { return o.backoff }
		}
	}
	_, err := handler.StepWith(ctx, o.name+suffix, opts, func(ctx context.Context) (T, error) {
		c.steps.Add(1)
		if err := runOps(ctx, o.inner, c, nil, suffix); err != nil {
			return v, err
		}
		if o.fail {
			return v, errors.New("step " + o.name + " fails")
		}
		return v, nil
	})
	return err
}

func typed(ctx context.Context, o op, c *counters, suffix string) error {
	switch o.typ {
	case "int":
		return stepOf(ctx, o, 42, c, suffix)
	case "rec":
		return stepOf(ctx, o, rec1{ID: "r-1", Amount: 42}, c, suffix)
	case "rec2":
		return stepOf(ctx, o, rec2{Ref: "r-1", Amount: 42}, c, suffix)
	case "bool":
		return stepOf(ctx, o, true, c, suffix)
	default:
		return stepOf(ctx, o, "v-"+o.name, c, suffix)
	}
}

func signalOf(ctx context.Context, o op) error {
	var err error
	switch o.typ {
	case "int":
		_, err = handler.WaitForSignal[int](ctx, o.name, o.d)
	default:
		_, err = handler.WaitForSignal[string](ctx, o.name, o.d)
	}
	return err
}

func invokeOf(ctx context.Context, o op, hold bool) error {
	io := &handler.InvokeOptions{Timeout: o.d}
	if hold {
		io.Enqueue = enqueue.Opts{Delay: time.Hour}
	}
	var err error
	switch o.typ {
	case "str":
		_, err = handler.Invoke[string](ctx, o.name, atkKid{N: 1}, io)
	default:
		_, err = handler.Invoke[int](ctx, o.name, atkKid{N: 1}, io)
	}
	return err
}

func mapOf(ctx context.Context, o op, c *counters) error {
	items := make([]int, o.n)
	for i := range items {
		items[i] = i
	}
	var err error
	item := func(ctx context.Context, i int) error {
		c.steps.Add(1)
		return runOps(ctx, o.inner, c, nil, fmt.Sprintf("-%d", i))
	}
	switch o.typ {
	case "str":
		_, err = handler.Map(ctx, o.name, items, func(ctx context.Context, i int, n int) (string, error) {
			return fmt.Sprint(n), item(ctx, i)
		}, nil)
	default:
		_, err = handler.Map(ctx, o.name, items, func(ctx context.Context, i int, n int) (int, error) {
			return n * 2, item(ctx, i)
		}, nil)
	}
	return err
}

func runOps(ctx context.Context, ops []op, c *counters, p *plan, suffix string) error {
	hold := false
	if j, ok := ctx.Value(argsKey{}).(atkArgs); ok {
		hold = j.Hold
	}
	for _, o := range ops {
		var err error
		switch o.k {
		case "step":
			err = typed(ctx, o, c, suffix)
		case "sleep":
			err = handler.Sleep(ctx, o.name, o.d)
		case "signal":
			err = signalOf(ctx, o)
		case "any":
			var got handler.Received
			got, err = handler.WaitForAny(ctx, o.names, o.d)
			if err == nil {
				err = runOps(ctx, o.branches[got.Name], c, p, suffix)
			}
		case "cond":
			_, err = handler.WaitForCondition(ctx, o.name, func(context.Context) (int, bool, error) {
				c.looks.Add(1)
				return 0, false, nil
			}, &handler.ConditionOptions{Every: time.Minute, Timeout: 24 * time.Hour})
		case "invoke":
			err = invokeOf(ctx, o, hold)
		case "map":
			err = mapOf(ctx, o, c)
		case "comp":
			err = handler.Compensate(ctx, o.name, func(context.Context) error { c.comps.Add(1); return nil })
		case "token":
			if _, err = handler.CallbackToken(ctx, o.name); err == nil {
				_, err = handler.WaitForSignal[string](ctx, o.name, o.d)
			}
		case "patched":
			if handler.Patched(ctx, o.name) {
				err = runOps(ctx, o.inner, c, p, suffix)
			} else {
				err = runOps(ctx, o.other, c, p, suffix)
			}
		case "permanent":
			err = handler.Permanent(errors.New("new code refuses: " + o.name))
		case "panic":
			panic("new code panics: " + o.name)
		case "block":
			close(p.entered)
			<-p.release
		default:
			panic("unknown op " + o.k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

type argsKey struct{}

func (p *plan) registry(c *counters) *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[atkKid, int](func(_ context.Context, j *handler.Job[atkKid]) (int, error) {
		return j.Args.N * 10, nil
	}), nil)
	var ko *handler.KindOptions
	if len(p.patches) > 0 {
		ko = &handler.KindOptions{Patches: p.patches}
	}
	handler.AddWorker(reg, handler.WorkFunc[atkArgs](func(ctx context.Context, j *handler.Job[atkArgs]) error {
		return runOps(context.WithValue(ctx, argsKey{}, j.Args), p.ops, c, p, "")
	}), ko)
	return reg
}

// checkAgainst checks ex against plan b, failing the test on a side
// effect, and returns the report.
func checkAgainst(t *testing.T, b plan, ex replay.Export) replay.Report {
	t.Helper()
	var c counters
	rep, err := replay.Check(context.Background(), b.registry(&c), ex)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if c.steps.Load()+c.looks.Load()+c.comps.Load() != 0 {
		t.Errorf("SIDE EFFECT: the check called %s; the docs promise none", &c)
	}
	return rep
}

func reportString(rep replay.Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "jobs %d, not started %d, %d divergences", rep.Jobs, rep.NotStarted, len(rep.Divergences))
	for _, d := range rep.Divergences {
		fmt.Fprintf(&b, "\n\t%s [recorded %q current %q]", d, d.Recorded, d.Current)
	}
	for _, u := range rep.Unchecked {
		fmt.Fprintf(&b, "\n\tunchecked: %s", u)
	}
	return b.String()
}

// wantDivergence: every job of ids diverges, naming recorded.
func wantDivergence(t *testing.T, change string, rep replay.Report, recorded string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		found := false
		for _, d := range rep.Divergences {
			found = found || d.JobID == id && strings.Contains(d.Recorded+" "+d.Problem, recorded)
		}
		if !found {
			t.Errorf("%s: job %s has no divergence naming the recorded step %q; Check said: %s", change, id, recorded, reportString(rep))
		}
	}
}

// wantAnyDivergence: every job of ids has a divergence, whatever step it
// names (the docs' order of steps kept on the record is "as far as known").
func wantAnyDivergence(t *testing.T, change string, rep replay.Report, ids ...string) {
	t.Helper()
	wantDivergence(t, change, rep, "", ids...)
}

func wantNone(t *testing.T, change string, rep replay.Report) {
	t.Helper()
	if len(rep.Divergences) != 0 {
		t.Errorf("%s (compatible) is reported: %s", change, reportString(rep))
	}
}

// with returns a copy of ops with the op named name replaced by repl (none:
// removed); repl may hold several ops.
func with(ops []op, name string, repl ...op) []op {
	var out []op
	for _, o := range ops {
		if o.name == name {
			out = append(out, repl...)
			continue
		}
		out = append(out, o)
	}
	return out
}

func enq(t *testing.T, e *nexjobtest.Env, a atkArgs, o *enqueue.Opts) string {
	t.Helper()
	r, err := e.Client.Enqueue(context.Background(), a, o)
	if err != nil {
		t.Fatal(err)
	}
	return r.ID
}

func sig(t *testing.T, e *nexjobtest.Env, id, name string, payload any) {
	t.Helper()
	if err := e.Client.Signal(context.Background(), id, name, payload); err != nil {
		t.Fatal(err)
	}
}

// ---- the sequence: two steps, a sleep, a signal, a second sleep, a step.

func seqA() plan {
	return plan{ops: []op{
		{k: "step", name: "prepare", typ: "rec"},
		{k: "step", name: "charge", typ: "int"},
		{k: "sleep", name: "cool-off", d: 48 * time.Hour},
		{k: "signal", name: "approval", typ: "str", d: 7 * 24 * time.Hour},
		{k: "sleep", name: "settle", d: 200 * time.Hour},
		{k: "step", name: "ship", typ: "str"},
	}}
}

type seqJobs struct {
	sleeping, waiting, past string // in cool-off; in the approval wait; past it, in settle
}

func recordSeq(t *testing.T, o *nexjobtest.Options, ro *replay.Options) (replay.Export, seqJobs, *nexjobtest.Env) {
	t.Helper()
	e := nexjobtest.New(t, o)
	var c counters
	a := seqA()
	h := e.Handler(t, a.registry(&c), nil)
	var j seqJobs
	j.past = enq(t, e, atkArgs{N: 1}, nil)
	e.DrainNow(t, h)
	e.Advance(t, 49*time.Hour)
	j.waiting = enq(t, e, atkArgs{N: 2}, nil)
	e.DrainNow(t, h) // past waits; waiting sleeps
	sig(t, e, j.past, "approval", "ok")
	e.DrainNow(t, h) // past in settle
	e.Advance(t, 49*time.Hour)
	j.sleeping = enq(t, e, atkArgs{N: 3}, nil)
	e.DrainNow(t, h) // waiting waits; sleeping sleeps
	for _, id := range []string{j.past, j.waiting, j.sleeping} {
		e.RequireState(t, id, ledger.Scheduled)
	}
	if _, ok := e.Get(t, j.waiting).Steps[ledger.WaitStep("approval")]; !ok {
		t.Fatalf("the waiting job does not wait: %+v", e.Get(t, j.waiting).Steps)
	}
	if _, ok := e.Get(t, j.past).Steps["settle"]; !ok {
		t.Fatalf("the past job is not in its second sleep: %+v", e.Get(t, j.past).Steps)
	}
	ex := e.Export(t, "atk.job", ro)
	if len(ex.Jobs) != 3 {
		t.Fatalf("exported %d jobs, want 3", len(ex.Jobs))
	}
	return ex, j, e
}

// TestAttackSeqIncompatible: changes to a sequence the docs list, each
// reported for the jobs that recorded the step.
func TestAttackSeqIncompatible(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, nil)
	all := []string{j.sleeping, j.waiting, j.past}
	if rep := checkAgainst(t, seqA(), ex); len(rep.Divergences) != 0 || rep.Jobs != 3 {
		t.Fatalf("the recording code itself: %s", reportString(rep))
	}
	A := seqA().ops
	for _, c := range []struct {
		change   string
		ops      []op
		recorded string
		ids      []string
	}{
		{"rename prepare -> prep without alias", with(A, "prepare", op{k: "step", name: "prep", typ: "rec"}), "prepare", all},
		{"remove step prepare", with(A, "prepare"), "prepare", all},
		{"charge's result int -> string", with(A, "charge", op{k: "step", name: "charge", typ: "str"}), "charge", all},
		{"prepare's result struct -> int", with(A, "prepare", op{k: "step", name: "prepare", typ: "int"}), "prepare", all},
		{"a new step before the sleep the job is in", with(A, "cool-off", op{k: "step", name: "audit", typ: "str"}, A[2]), "cool-off", []string{j.sleeping}},
		{"a new sleep between two recorded steps", with(A, "charge", op{k: "sleep", name: "pause", d: time.Hour}, A[1]), "charge", all},
		{"the sleep renamed cool-off -> cooling", with(A, "cool-off", op{k: "sleep", name: "cooling", d: 48 * time.Hour}), "cool-off", all},
		{"the sleep removed", with(A, "cool-off"), "cool-off", all},
		{"a wait for another signal (the job in it)", with(A, "approval", op{k: "signal", name: "consent", typ: "str", d: 7 * 24 * time.Hour}), "approval", []string{j.waiting}},
		// The job past the wait is reported naming "settle", not the wait
		// (kept on the record, ordered last): caught all the same.
		{"a wait for another signal (a job past it)", with(A, "approval", op{k: "signal", name: "consent", typ: "str", d: 7 * 24 * time.Hour}), "", []string{j.past}},
		{"the received signal's type string -> int", with(A, "approval", op{k: "signal", name: "approval", typ: "int", d: 7 * 24 * time.Hour}), "approval", []string{j.past}},
		{"the sleep replaced by a wait for a signal of its name", with(A, "cool-off", op{k: "signal", name: "cool-off", typ: "str", d: time.Hour}), "cool-off", all},
		{"the second sleep removed", with(A, "settle"), "settle", []string{j.past}},
		{"a new step before the second sleep", with(A, "settle", op{k: "step", name: "notify", typ: "str"}, A[4]), "settle", []string{j.past}},
		{"the worker now refuses after charge (Permanent)", with(A, "cool-off", op{k: "permanent", name: "x"}, A[2]), "refuses", all},
		{"the worker now panics after charge", with(A, "cool-off", op{k: "panic", name: "x"}, A[2]), "panic", all},
	} {
		rep := checkAgainst(t, plan{ops: c.ops}, ex)
		wantDivergence(t, c.change, rep, c.recorded, c.ids...)
	}
}

// BREAK: a step whose result struct renamed its JSON field ("id" ->
// "ref") decodes silently to the zero value in the new code; the docs say
// a changed result type is reported ("a value that no longer decodes (the
// step, the recorded shape, the type wanted)", ResultTypeError naming "the
// recorded result's shape").
func TestAttackSeqRenamedJSONField(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, nil)
	A := seqA().ops
	rep := checkAgainst(t, plan{ops: with(A, "prepare", op{k: "step", name: "prepare", typ: "rec2"})}, ex)
	wantDivergence(t, `prepare's result {"id","amount"} -> {"ref","amount"} (the recorded id silently lost)`, rep, "prepare", j.sleeping, j.waiting, j.past)
}

// A sleep whose recorded wake time the new code reads as a step's value.
func TestAttackSeqStepSleepSwapKinds(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, nil)
	A := seqA().ops
	all := []string{j.sleeping, j.waiting, j.past}
	rep := checkAgainst(t, plan{ops: with(A, "cool-off", op{k: "step", name: "cool-off", typ: "str"})}, ex)
	wantDivergence(t, "the sleep cool-off replaced by a Step[string] named cool-off", rep, "cool-off", all...)
}

// BREAK: the step "charge" removed and a Sleep named "charge" put in its
// place: the recorded step's value (42) is taken as the sleep's record,
// so the check says the step is reached. The docs: "a recorded step the
// code no longer reaches (... removed)" and "a value that no longer decodes"
// are divergences; the charge's result is lost and the sleep never sleeps.
func TestAttackSeqStepReplacedBySleepOfItsName(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, nil)
	A := seqA().ops
	rep := checkAgainst(t, plan{ops: with(A, "charge", op{k: "sleep", name: "charge", d: time.Hour})}, ex)
	wantDivergence(t, "the step charge replaced by a Sleep named charge", rep, "charge", j.sleeping, j.waiting, j.past)
}

// TestAttackSeqCompatible: changes the docs call compatible are not
// reported.
func TestAttackSeqCompatible(t *testing.T) {
	t.Parallel()
	ex, _, _ := recordSeq(t, nil, nil)
	A := seqA().ops
	swapped := append([]op{A[1], A[0]}, A[2:]...)
	for _, c := range []struct {
		change string
		p      plan
	}{
		{"swap the two recorded steps prepare and charge (steps are named)", plan{ops: swapped}},
		{"rename prepare -> prep with Aliases [prepare]", plan{ops: with(A, "prepare", op{k: "step", name: "prep", typ: "rec", aliases: []string{"prepare"}})}},
		{"a step added after the last", plan{ops: append(append([]op{}, A...), op{k: "step", name: "thank", typ: "str"})}},
		{"cool-off's duration 48h -> 24h (the wake time is recorded)", plan{ops: with(A, "cool-off", op{k: "sleep", name: "cool-off", d: 24 * time.Hour})}},
		{"cool-off's duration 48h -> 300h", plan{ops: with(A, "cool-off", op{k: "sleep", name: "cool-off", d: 300 * time.Hour})}},
		{"a step made StepWith with retries, same name and type", plan{ops: with(A, "charge", op{k: "step", name: "charge", typ: "int", backoff: time.Second})}},
	} {
		wantNone(t, c.change, checkAgainst(t, c.p, ex))
	}
}

// BREAK: the kind's first patch, guarding a new step before the sleep
// (the docs' own example: "this deploy adds patch carrier-v2; jobs asleep
// since before it take the old carrier"; "A job that began before the
// deploy records no patch ([]) and takes the old branch on every run").
// The job that has run once (asleep in cool-off) is reported: the replay
// takes the patched branch for it.
func TestAttackFirstPatchGuardsANewStep(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, nil)
	A := seqA().ops
	b := plan{patches: []string{"v2"}, ops: with(A, "cool-off", op{k: "patched", name: "v2", inner: []op{{k: "step", name: "audit", typ: "str"}}}, A[2])}
	rep := checkAgainst(t, b, ex)
	for _, d := range rep.Divergences {
		who := map[string]string{j.sleeping: "the job asleep after its first run", j.waiting: "the waiting job", j.past: "the job past its wait"}[d.JobID]
		t.Errorf("a new step behind the kind's first patch v2 (compatible: old jobs take the old branch) is reported for %s: %s", who, d)
	}
}

// ---- a Map, then a sleep.

func mapA(inner []op) plan {
	return plan{ops: []op{
		{k: "map", name: "items", n: 3, typ: "int", inner: inner},
		{k: "sleep", name: "after", d: 48 * time.Hour},
		{k: "step", name: "end", typ: "str"},
	}}
}

func recordPlan(t *testing.T, a plan, o *nexjobtest.Options, ro *replay.Options, drive func(e *nexjobtest.Env, h *handler.Handler) []string) (replay.Export, []string, *nexjobtest.Env) {
	t.Helper()
	e := nexjobtest.New(t, o)
	var c counters
	h := e.Handler(t, a.registry(&c), nil)
	ids := drive(e, h)
	ex := e.Export(t, "atk.job", ro)
	return ex, ids, e
}

func oneInSleep(t *testing.T) func(e *nexjobtest.Env, h *handler.Handler) []string {
	return func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.Drain(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	}
}

func TestAttackMap(t *testing.T) {
	t.Parallel()
	ex, ids, e := recordPlan(t, mapA(nil), nil, nil, oneInSleep(t))
	if _, ok := e.Get(t, ids[0]).Steps["after"]; !ok {
		t.Fatalf("the job is not in its sleep: %+v", e.Get(t, ids[0]).Steps)
	}
	A := mapA(nil).ops
	wantNone(t, "the recording code", checkAgainst(t, mapA(nil), ex))
	for _, c := range []struct {
		change, recorded string
		ops              []op
	}{
		{"the map's items 3 -> 2", "items#2", with(A, "items", op{k: "map", name: "items", n: 2, typ: "int"})},
		{"the map's items 3 -> 4", "after", with(A, "items", op{k: "map", name: "items", n: 4, typ: "int"})},
		{"the map renamed items -> lines", "items#0", with(A, "items", op{k: "map", name: "lines", n: 3, typ: "int"})},
		{"a map item's result int -> string", `map "items"`, with(A, "items", op{k: "map", name: "items", n: 3, typ: "str"})},
	} {
		wantDivergence(t, c.change, checkAgainst(t, plan{ops: c.ops}, ex), c.recorded, ids...)
	}
}

// BREAK: a step recorded inside a Map item's function (docs: "A step's
// own goroutines may call Step too") is never reached in a replay (the
// item is recorded, its function not called), also by the code that
// recorded it. The check must not report the recording code itself.
func TestAttackMapNestedStepSameCode(t *testing.T) {
	t.Parallel()
	inner := []op{{k: "step", name: "price", typ: "int"}}
	ex, ids, e := recordPlan(t, mapA(inner), nil, nil, oneInSleep(t))
	if _, ok := e.Get(t, ids[0]).Steps["price-1"]; !ok {
		t.Fatalf("no nested step recorded: %+v", e.Get(t, ids[0]).Steps)
	}
	wantNone(t, "the recording code, whose map items call Step inside (nothing changed)", checkAgainst(t, mapA(inner), ex))
	// A step nested in a step's function, likewise.
	nested := plan{ops: []op{{k: "step", name: "outer", typ: "str", inner: []op{{k: "step", name: "inner", typ: "int"}}}, {k: "sleep", name: "after", d: 48 * time.Hour}}}
	ex2, _, _ := recordPlan(t, nested, nil, nil, oneInSleep(t))
	wantNone(t, "the recording code, a step calling Step inside its function (nothing changed)", checkAgainst(t, nested, ex2))
}

// ---- WaitForAny with a branch per signal.

func anyA() plan {
	return plan{ops: []op{
		{k: "step", name: "open", typ: "str"},
		{k: "any", names: []string{"approved", "rejected"}, d: 48 * time.Hour, branches: map[string][]op{
			"approved": {{k: "step", name: "ship", typ: "str"}, {k: "sleep", name: "after", d: 48 * time.Hour}, {k: "step", name: "end", typ: "str"}},
			"rejected": {{k: "step", name: "refund", typ: "str"}, {k: "sleep", name: "after", d: 48 * time.Hour}},
		}},
	}}
}

func anyWith(names []string, approved []op) plan {
	p := anyA()
	a := p.ops[1]
	if names != nil {
		a.names = names
	}
	br := map[string][]op{}
	for k, v := range a.branches {
		br[k] = v
	}
	for _, n := range a.names {
		if _, ok := br[n]; !ok {
			br[n] = br["approved"]
		}
	}
	if approved != nil {
		br["approved"] = approved
	}
	a.branches = br
	p.ops = []op{p.ops[0], a}
	return p
}

func driveAny(t *testing.T) func(e *nexjobtest.Env, h *handler.Handler) []string {
	return func(e *nexjobtest.Env, h *handler.Handler) []string {
		chose := enq(t, e, atkArgs{N: 1}, nil)
		waiting := enq(t, e, atkArgs{N: 2}, nil)
		e.DrainNow(t, h)
		sig(t, e, chose, "approved", "yes")
		e.DrainNow(t, h)
		if _, ok := e.Get(t, chose).Steps["after"]; !ok {
			t.Fatalf("the chosen job is not in its sleep after ship: %+v", e.Get(t, chose).Steps)
		}
		e.RequireState(t, waiting, ledger.Scheduled)
		return []string{chose, waiting}
	}
}

func TestAttackWaitForAny(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, anyA(), nil, nil, driveAny(t))
	chose, waiting := ids[0], ids[1]
	wantNone(t, "the recording code", checkAgainst(t, anyA(), ex))
	wantDivergence(t, "after the choice (approved), ship renamed deliver",
		checkAgainst(t, anyWith(nil, []op{{k: "step", name: "deliver", typ: "str"}, {k: "sleep", name: "after", d: 48 * time.Hour}}), ex), "ship", chose)
	wantDivergence(t, "after the choice (approved), a new step before the sleep the job is in",
		checkAgainst(t, anyWith(nil, []op{{k: "step", name: "ship", typ: "str"}, {k: "step", name: "label", typ: "str"}, {k: "sleep", name: "after", d: 48 * time.Hour}}), ex), "after", chose)
	rep := checkAgainst(t, anyWith([]string{"accepted", "rejected"}, nil), ex)
	wantDivergence(t, "WaitForAny names approved -> accepted (the job waiting)", rep, "approved", waiting)
	wantAnyDivergence(t, "WaitForAny names approved -> accepted (the job past its choice)", rep, chose)
	// The choice is "the first of the names, in the order given": a
	// reorder may choose otherwise, so it is incompatible (reported).
	wantAnyDivergence(t, "WaitForAny's names reordered [rejected approved]", checkAgainst(t, anyWith([]string{"rejected", "approved"}, nil), ex), chose)
}

// A redacted export keeps "wait ends" and the choice: the recording code
// replays it with no divergence.
func TestAttackWaitForAnyRedacted(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, anyA(), nil, &replay.Options{Redact: true}, driveAny(t))
	wantNone(t, "redacted export, the recording code (a job past a WaitForAny choice)", checkAgainst(t, anyA(), ex))
	wantDivergence(t, "redacted export, after the choice ship renamed deliver",
		checkAgainst(t, anyWith(nil, []op{{k: "step", name: "deliver", typ: "str"}, {k: "sleep", name: "after", d: 48 * time.Hour}}), ex), "ship", ids[0])
}

// ---- child jobs.

func invokeA(typ string, name string) plan {
	return plan{ops: []op{
		{k: "invoke", name: name, typ: typ, d: 48 * time.Hour},
		{k: "sleep", name: "after", d: 48 * time.Hour},
		{k: "step", name: "end", typ: "str"},
	}}
}

func TestAttackInvoke(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, invokeA("int", "ship"), nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		past := enq(t, e, atkArgs{N: 1}, nil)
		e.Drain(t, h) // the child ends, the caller sleeps in after
		if _, ok := e.Get(t, past).Steps["after"]; !ok {
			t.Fatalf("the caller is not past its child: %+v", e.Get(t, past).Steps)
		}
		waiting := enq(t, e, atkArgs{N: 2, Hold: true}, nil)
		e.DrainNow(t, h) // its child an hour ahead: the caller waits
		e.RequireState(t, waiting, ledger.Scheduled)
		return []string{past, waiting}
	})
	wantNone(t, "the recording code", checkAgainst(t, invokeA("int", "ship"), ex))
	rep := checkAgainst(t, invokeA("int", "shipment"), ex)
	wantDivergence(t, "the child started under another name ship -> shipment", rep, "ship", ids...)
	rep = checkAgainst(t, invokeA("str", "ship"), ex)
	wantDivergence(t, "the child's result type int -> string (child ended)", rep, "", ids[0])
	if len(rep.Divergences) == 0 {
		t.Errorf("the child's result type int -> string: no divergence: %s", reportString(rep))
	}
}

// ---- a condition polled, a compensation, a callback token.

func TestAttackCondition(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "pay", typ: "str"}, {k: "cond", name: "settled"}, {k: "step", name: "end", typ: "str"}}}
	ex, ids, e := recordPlan(t, a, nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h) // first look false
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	})
	wantNone(t, "the recording code, between two looks", checkAgainst(t, a, ex))
	b := plan{ops: with(a.ops, "settled", op{k: "cond", name: "paid"})}
	wantDivergence(t, "the condition renamed settled -> paid", checkAgainst(t, b, ex), "settled", ids...)
	e.Advance(t, 2*time.Minute) // a look due: the replay must not look
	ex = e.Export(t, "atk.job", nil)
	wantNone(t, "the recording code, a look due", checkAgainst(t, a, ex))
}

// BREAK: a condition renamed while the job's next look is due (its
// between-looks sleep ended, the run not yet come): the new code starts a
// new condition, its timeout counted afresh; the check reports nothing
// (it does between two looks).
func TestAttackConditionRenamedLookDue(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "pay", typ: "str"}, {k: "cond", name: "settled"}, {k: "step", name: "end", typ: "str"}}}
	ex, ids, _ := recordPlan(t, a, nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h) // first look false
		e.RequireState(t, id, ledger.Scheduled)
		e.Advance(t, 2*time.Minute) // the next look due, not taken
		return []string{id}
	})
	b := plan{ops: with(a.ops, "settled", op{k: "cond", name: "paid"})}
	wantDivergence(t, "the condition renamed settled -> paid, its next look due", checkAgainst(t, b, ex), "settled", ids...)
}

// BREAK: a job whose signal landed (woken, not yet run) and new code that
// waits for another signal: the live run would wait for "consent" and
// never take the approval; the check reports nothing ("the wait a job is
// in that the code no longer reaches (it waits for another signal...)").
func TestAttackSignalLandedThenOtherSignal(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "ask", typ: "str"}, {k: "signal", name: "approval", typ: "str", d: 48 * time.Hour}, {k: "step", name: "ship", typ: "str"}}}
	ex, ids, e := recordPlan(t, a, nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		sig(t, e, id, "approval", "ok") // woken, its run not yet taken
		return []string{id}
	})
	t.Logf("the woken job: %s, steps %v", e.Get(t, ids[0]).State, keys(e.Get(t, ids[0]).Steps))
	wantNone(t, "the recording code, a job woken by its signal", checkAgainst(t, a, ex))
	b := plan{ops: with(a.ops, "approval", op{k: "signal", name: "consent", typ: "str", d: 48 * time.Hour})}
	wantDivergence(t, "a job woken by its approval signal; the new code waits for consent instead", checkAgainst(t, b, ex), "approval", ids...)
}

func compA() plan {
	return plan{ops: []op{
		{k: "step", name: "charge", typ: "str"},
		{k: "comp", name: "refund"},
		{k: "sleep", name: "cool-off", d: 48 * time.Hour},
		{k: "step", name: "book", typ: "str"},
	}}
}

// A job that declared a compensation, asleep, then cancelled (made due, its
// next run compensates): the check must not compensate.
func TestAttackCompensationCancelled(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, compA(), nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		_, err := e.Client.Cancel(context.Background(), id, "", 0)
		var cr *enqueue.CancelRequestedError
		if !errors.As(err, &cr) {
			t.Fatalf("cancel of a sleeping compensable job: %v, want a CancelRequestedError", err)
		}
		return []string{id}
	})
	if len(ex.Jobs) != 1 {
		t.Fatalf("the cancel-requested job is not exported: %d jobs", len(ex.Jobs))
	}
	_ = ids
	checkAgainst(t, compA(), ex) // side effects only
	checkAgainst(t, plan{ops: with(compA().ops, "cool-off", op{k: "permanent", name: "x"})}, ex)
}

// New code that fails for good after the declaration: the replay ends in
// that error, and must not run the compensation a live failure would.
func TestAttackCompensationOnPermanent(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, compA(), nil, nil, oneInSleep(t))
	rep := checkAgainst(t, plan{ops: with(compA().ops, "cool-off", op{k: "permanent", name: "x"})}, ex)
	wantDivergence(t, "a Permanent error after the compensation's declaration", rep, "refuses", ids...)
	rep = checkAgainst(t, plan{ops: with(compA().ops, "cool-off", op{k: "panic", name: "x"})}, ex)
	wantDivergence(t, "a panic after the compensation's declaration", rep, "panic", ids...)
}

func TestAttackCallbackToken(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "ask", typ: "str"}, {k: "token", name: "bank", d: 48 * time.Hour}, {k: "step", name: "end", typ: "str"}}}
	o := &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("attack-secret-0123456789abcdef!!")}}
	ex, ids, e := recordPlan(t, a, o, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	})
	wantDivergence(t, "the callback token's name bank -> bank2", checkAgainst(t, plan{ops: with(a.ops, "bank", op{k: "token", name: "bank2", d: 48 * time.Hour})}, ex), "bank", ids...)
	red := e.Export(t, "atk.job", &replay.Options{Redact: true})
	wantDivergence(t, "redacted, the callback token's name bank -> bank2", checkAgainst(t, plan{ops: with(a.ops, "bank", op{k: "token", name: "bank2", d: 48 * time.Hour})}, red), "bank", ids...)
}

// BREAK: a job waiting on a callback token, checked against the code that
// recorded it: the replay's CallbackToken fails ("callback tokens need a
// key secret"), a divergence of every such job with nothing changed. The
// docs promise the recording code replays clean, and name no key secret
// for the check (the CI check, CheckReplay, has none to give).
func TestAttackCallbackTokenSameCode(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "ask", typ: "str"}, {k: "token", name: "bank", d: 48 * time.Hour}, {k: "step", name: "end", typ: "str"}}}
	o := &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("attack-secret-0123456789abcdef!!")}}
	ex, _, e := recordPlan(t, a, o, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	})
	wantNone(t, "nothing changed, a job waiting on a callback token", checkAgainst(t, a, ex))
	wantNone(t, "nothing changed, a job waiting on a callback token, redacted", checkAgainst(t, a, e.Export(t, "atk.job", &replay.Options{Redact: true})))
}

// ---- jobs retrying, processing, never started.

func retryA(backoff time.Duration) plan {
	return plan{ops: []op{
		{k: "step", name: "a", typ: "str"},
		{k: "step", name: "b", typ: "str", fail: true, backoff: backoff},
		{k: "step", name: "c", typ: "str"},
	}}
}

func fixed(p plan) plan {
	ops := append([]op{}, p.ops...)
	for i := range ops {
		ops[i].fail = false
	}
	return plan{ops: ops}
}

func TestAttackRetrying(t *testing.T) {
	t.Parallel()
	ex, ids, e := recordPlan(t, retryA(0), nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h) // b fails: the job is Scheduled for its retry
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	})
	if st := e.Get(t, ids[0]).Steps; st["a"] == "" || st["b"] != "" {
		t.Fatalf("want a recorded, b not: %+v", st)
	}
	A := fixed(retryA(0)).ops
	wantNone(t, "the recording code (fixed)", checkAgainst(t, plan{ops: A}, ex))
	wantNone(t, "the failed (unrecorded) step b renamed b2", checkAgainst(t, plan{ops: with(A, "b", op{k: "step", name: "b2", typ: "str"})}, ex))
	wantNone(t, "a new step x before the failed step b", checkAgainst(t, plan{ops: with(A, "b", op{k: "step", name: "x", typ: "str"}, A[1])}, ex))
	wantNone(t, "the failed step b's result type string -> int (nothing recorded)", checkAgainst(t, plan{ops: with(A, "b", op{k: "step", name: "b", typ: "int"})}, ex))
	wantDivergence(t, "the recorded step a renamed a2 in a retrying job", checkAgainst(t, plan{ops: with(A, "a", op{k: "step", name: "a2", typ: "str"})}, ex), "a", ids...)
}

// A step retried by its own policy in a durable pause (StepWith with a
// backoff over WaitInRun): its failures are recorded (nexjob:try:...),
// its value is not. Renaming it is renaming a step that never completed.
func TestAttackStepRetryPause(t *testing.T) {
	t.Parallel()
	ex, ids, e := recordPlan(t, retryA(time.Hour), nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	})
	t.Logf("steps of the pausing job: %v", keys(e.Get(t, ids[0]).Steps))
	A := fixed(retryA(time.Hour)).ops
	wantNone(t, "the recording code (fixed), in a step's durable retry pause", checkAgainst(t, plan{ops: A}, ex))
	wantNone(t, "the pausing (never completed) step b renamed b2", checkAgainst(t, plan{ops: with(A, "b", op{k: "step", name: "b2", typ: "str", backoff: time.Hour})}, ex))
	wantDivergence(t, "the recorded step a renamed a2 in a pausing job", checkAgainst(t, plan{ops: with(A, "a", op{k: "step", name: "a2", typ: "str"})}, ex), "a", ids...)
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestAttackProcessing(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	a := plan{ops: []op{{k: "step", name: "a", typ: "str"}, {k: "block"}, {k: "step", name: "b", typ: "str"}},
		entered: make(chan struct{}), release: make(chan struct{})}
	var c counters
	h := e.Handler(t, a.registry(&c), nil)
	id := enq(t, e, atkArgs{N: 1}, nil)
	done := make(chan struct{})
	go func() { defer close(done); e.DrainNow(t, h) }()
	<-a.entered
	rec := e.Get(t, id)
	ex := e.Export(t, "atk.job", nil)
	close(a.release)
	<-done
	if rec.State != ledger.Processing || rec.Steps["a"] == "" {
		t.Fatalf("the job was not Processing with a recorded: %s %+v", rec.State, rec.Steps)
	}
	if len(ex.Jobs) != 1 {
		t.Fatalf("the Processing job is not exported: %d jobs", len(ex.Jobs))
	}
	B := []op{{k: "step", name: "a", typ: "str"}, {k: "step", name: "b", typ: "str"}}
	wantNone(t, "the recording code, Processing", checkAgainst(t, plan{ops: B}, ex))
	wantDivergence(t, "a Processing job's recorded step a renamed a2", checkAgainst(t, plan{ops: with(B, "a", op{k: "step", name: "a2", typ: "str"})}, ex), "a", id)
}

// A never-started job is nothing to check: it runs the current code from
// its start.
func TestAttackNeverStarted(t *testing.T) {
	t.Parallel()
	ex, _, _ := recordPlan(t, seqA(), nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		return []string{enq(t, e, atkArgs{N: 1}, &enqueue.Opts{Delay: time.Hour})}
	})
	rep := checkAgainst(t, plan{ops: with(seqA().ops, "prepare", op{k: "step", name: "prep", typ: "rec"})}, ex)
	if rep.NotStarted != 1 || len(rep.Divergences) != 0 {
		t.Errorf("a never-started job, prepare renamed: want NotStarted 1 and no divergence: %s", reportString(rep))
	}
}

// BREAK: "a kind the registry does not know is a divergence of each of its
// jobs (their worker was removed: they would fail at their next run)". A
// job enqueued and never started fails at its next run too; the check
// counts it NotStarted and passes the deploy that removes its kind.
func TestAttackNeverStartedKindRemoved(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, seqA(), nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		return []string{enq(t, e, atkArgs{N: 1}, &enqueue.Opts{Delay: time.Hour})}
	})
	rep, err := replay.Check(context.Background(), handler.NewRegistry(), ex)
	if err != nil {
		t.Fatal(err)
	}
	wantDivergence(t, "the kind removed while a job of it is enqueued, never started", rep, "", ids...)
}

// ---- redacted exports.

func TestAttackRedacted(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, &replay.Options{Redact: true})
	all := []string{j.sleeping, j.waiting, j.past}
	A := seqA().ops
	wantNone(t, "redacted, the recording code", checkAgainst(t, seqA(), ex))
	wantDivergence(t, "redacted, prepare renamed prep", checkAgainst(t, plan{ops: with(A, "prepare", op{k: "step", name: "prep", typ: "rec"})}, ex), "prepare", all...)
	wantDivergence(t, "redacted, prepare struct -> int", checkAgainst(t, plan{ops: with(A, "prepare", op{k: "step", name: "prepare", typ: "int"})}, ex), "prepare", all...)
	wantDivergence(t, "redacted, charge int -> bool (a number where a boolean is wanted)", checkAgainst(t, plan{ops: with(A, "charge", op{k: "step", name: "charge", typ: "bool"})}, ex), "charge", all...)
	wantDivergence(t, "redacted, charge int -> string (a number where a string is wanted)", checkAgainst(t, plan{ops: with(A, "charge", op{k: "step", name: "charge", typ: "str"})}, ex), "charge", all...)
	// Reported, though naming "settle" (not reached), not the signal.
	wantAnyDivergence(t, "redacted, the received signal string -> int (a string where a number is wanted)", checkAgainst(t, plan{ops: with(A, "approval", op{k: "signal", name: "approval", typ: "int", d: 7 * 24 * time.Hour})}, ex), j.past)
	wantDivergence(t, "redacted, a new step before the sleep the job is in", checkAgainst(t, plan{ops: with(A, "cool-off", op{k: "step", name: "audit", typ: "str"}, A[2])}, ex), "cool-off", j.sleeping)
}

func TestAttackRedactedMap(t *testing.T) {
	t.Parallel()
	ex, ids, _ := recordPlan(t, mapA(nil), nil, &replay.Options{Redact: true}, oneInSleep(t))
	wantNone(t, "redacted, the recording code", checkAgainst(t, mapA(nil), ex))
	rep := checkAgainst(t, plan{ops: with(mapA(nil).ops, "items", op{k: "map", name: "items", n: 3, typ: "str"})}, ex)
	// Reported, though naming the sleep after the map, not the item.
	wantAnyDivergence(t, "redacted, a map item's result int -> string", rep, ids...)
}

// A kind with a patch: the job recorded ["v2"] and took the patched
// branch; a redacted export must keep which patches the job has.
func TestAttackRedactedPatches(t *testing.T) {
	t.Parallel()
	a := plan{patches: []string{"v2"}, ops: []op{
		{k: "patched", name: "v2", inner: []op{{k: "step", name: "new-a", typ: "str"}}, other: []op{{k: "step", name: "old-a", typ: "str"}}},
		{k: "sleep", name: "after", d: 48 * time.Hour},
		{k: "step", name: "end", typ: "str"},
	}}
	ex, ids, e := recordPlan(t, a, nil, &replay.Options{Redact: true}, oneInSleep(t))
	if e.Get(t, ids[0]).Steps["new-a"] == "" {
		t.Fatalf("the job did not take the patched branch: %+v", e.Get(t, ids[0]).Steps)
	}
	wantNone(t, "redacted, the recording code (a job that took the patched branch)", checkAgainst(t, a, ex))
	// Unredacted, and a new patch guarding a new step: compatible.
	ex = e.Export(t, "atk.job", nil)
	wantNone(t, "the recording code", checkAgainst(t, a, ex))
	b := plan{patches: []string{"v2", "v3"}, ops: append([]op{{k: "patched", name: "v3", inner: []op{{k: "step", name: "v3-step", typ: "str"}}}}, a.ops...)}
	wantNone(t, "a new patch v3 guarding a new first step", checkAgainst(t, b, ex))
	c := plan{patches: []string{"v2"}, ops: with(a.ops, "v2", op{k: "step", name: "old-a", typ: "str"})}
	wantDivergence(t, "the patched branch dropped (every job takes old-a)", checkAgainst(t, c, ex), "new-a", ids...)
}

// ---- files.

type captureTB struct {
	testing.TB
	msgs []string
}

func (c *captureTB) Error(a ...any)            { c.msgs = append(c.msgs, fmt.Sprint(a...)) }
func (c *captureTB) Errorf(f string, a ...any) { c.msgs = append(c.msgs, fmt.Sprintf(f, a...)) }
func (c *captureTB) Fatal(a ...any)            { c.msgs = append(c.msgs, fmt.Sprint(a...)) }
func (c *captureTB) Fatalf(f string, a ...any) { c.msgs = append(c.msgs, fmt.Sprintf(f, a...)) }
func (c *captureTB) Fail()                     { c.msgs = append(c.msgs, "Fail") }
func (c *captureTB) FailNow()                  { c.msgs = append(c.msgs, "FailNow") }
func (c *captureTB) Helper()                   {}
func (c *captureTB) Log(a ...any)              {}
func (c *captureTB) Logf(f string, a ...any)   {}
func (c *captureTB) Failed() bool              { return len(c.msgs) > 0 }
func (c *captureTB) Skipf(f string, a ...any)  { c.msgs = append(c.msgs, "skip: "+fmt.Sprintf(f, a...)) }
func (c *captureTB) TempDir() string           { return c.TB.TempDir() }
func (c *captureTB) Name() string              { return c.TB.Name() }
func (c *captureTB) Skip(a ...any)             { c.msgs = append(c.msgs, "skip") }
func (c *captureTB) SkipNow()                  { c.msgs = append(c.msgs, "skip") }
func (c *captureTB) Skipped() bool             { return false }

func TestAttackFileRoundTrip(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, nil, nil)
	path := filepath.Join(t.TempDir(), "open.json")
	if err := replay.Write(path, ex); err != nil {
		t.Fatal(err)
	}
	back, err := replay.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	all := []string{j.sleeping, j.waiting, j.past}
	A := seqA().ops
	wantNone(t, "read back, the recording code", checkAgainst(t, seqA(), back))
	wantDivergence(t, "read back, prepare renamed prep", checkAgainst(t, plan{ops: with(A, "prepare", op{k: "step", name: "prep", typ: "rec"})}, back), "prepare", all...)
	wantDivergence(t, "read back, a new step before the sleep the job is in", checkAgainst(t, plan{ops: with(A, "cool-off", op{k: "step", name: "audit", typ: "str"}, A[2])}, back), "cool-off", j.sleeping)
	wantDivergence(t, "read back, charge int -> string", checkAgainst(t, plan{ops: with(A, "charge", op{k: "step", name: "charge", typ: "str"})}, back), "charge", all...)

	var c counters
	ct := &captureTB{TB: t}
	renamed := plan{ops: with(A, "prepare", op{k: "step", name: "prep", typ: "rec"})}
	rep := nexjobtest.CheckReplay(ct, renamed.registry(&c), path)
	if len(ct.msgs) == 0 || !strings.Contains(strings.Join(ct.msgs, "\n"), "prepare") {
		t.Errorf("CheckReplay with prepare renamed did not fail naming prepare: %q, %s", ct.msgs, reportString(rep))
	}
	ct = &captureTB{TB: t}
	a := seqA()
	nexjobtest.CheckReplay(ct, a.registry(&c), path)
	if len(ct.msgs) != 0 {
		t.Errorf("CheckReplay with the recording code failed: %q", ct.msgs)
	}
	if c.steps.Load()+c.looks.Load()+c.comps.Load() != 0 {
		t.Errorf("SIDE EFFECT: CheckReplay called %s", &c)
	}
}

// Steps kept on the record (no steps table): their order is not known.
func TestAttackStepsOnRecord(t *testing.T) {
	t.Parallel()
	ex, j, _ := recordSeq(t, &nexjobtest.Options{StepsOnRecord: true}, nil)
	all := []string{j.sleeping, j.waiting, j.past}
	A := seqA().ops
	wantNone(t, "steps on the record, the recording code", checkAgainst(t, seqA(), ex))
	wantNone(t, "steps on the record, prepare and charge swapped", checkAgainst(t, plan{ops: append([]op{A[1], A[0]}, A[2:]...)}, ex))
	wantDivergence(t, "steps on the record, prepare renamed prep", checkAgainst(t, plan{ops: with(A, "prepare", op{k: "step", name: "prep", typ: "rec"})}, ex), "prepare", all...)
	wantDivergence(t, "steps on the record, a new step before the sleep the job is in", checkAgainst(t, plan{ops: with(A, "cool-off", op{k: "step", name: "audit", typ: "str"}, A[2])}, ex), "cool-off", j.sleeping)
	wantDivergence(t, "steps on the record, the sleep removed", checkAgainst(t, plan{ops: with(A, "cool-off")}, ex), "cool-off", all...)
}

// BREAK: a job whose wait timed out (not yet run) ends, in the recording
// code, in the wait's *SignalTimeoutError: the same code would treat it
// the same, so it is no divergence ("a job the current code would treat
// otherwise than the code that recorded it").
func TestAttackTimedOutWaitSameCode(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "a", typ: "str"}, {k: "signal", name: "approval", typ: "str", d: time.Hour}, {k: "step", name: "b", typ: "str"}}}
	ex, _, _ := recordPlan(t, a, nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		e.Advance(t, 2*time.Hour) // the wait's end passed, no run yet
		return []string{id}
	})
	wantNone(t, "nothing changed, a job whose wait timed out and has not run since", checkAgainst(t, a, ex))
}

// A sleep renamed while the job's wake is due (its run not yet come): the
// new code would sleep afresh.
func TestAttackDueSleepRenamed(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "a", typ: "str"}, {k: "sleep", name: "cool-off", d: time.Hour}, {k: "step", name: "b", typ: "str"}}}
	ex, ids, _ := recordPlan(t, a, nil, nil, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		e.Advance(t, 2*time.Hour) // due, not yet run
		return []string{id}
	})
	wantNone(t, "the recording code, a sleep due", checkAgainst(t, a, ex))
	wantDivergence(t, "a due sleep renamed cool-off -> cooling", checkAgainst(t, plan{ops: with(a.ops, "cool-off", op{k: "sleep", name: "cooling", d: time.Hour})}, ex), "cool-off", ids...)
}

// Redacted, a retrying job whose last recorded step changed shape (a
// number where a string is wanted): no later step shows it, so only the
// value's own check can ("A changed shape ... is still a divergence").
func TestAttackRedactedRetryingShape(t *testing.T) {
	t.Parallel()
	a := plan{ops: []op{{k: "step", name: "a", typ: "int"}, {k: "step", name: "b", typ: "str", fail: true}}}
	ex, ids, _ := recordPlan(t, a, nil, &replay.Options{Redact: true}, func(e *nexjobtest.Env, h *handler.Handler) []string {
		id := enq(t, e, atkArgs{N: 1}, nil)
		e.DrainNow(t, h)
		e.RequireState(t, id, ledger.Scheduled)
		return []string{id}
	})
	A := fixed(a).ops
	wantNone(t, "redacted, the recording code (fixed), a retrying job", checkAgainst(t, plan{ops: A}, ex))
	wantDivergence(t, "redacted, a retrying job's last recorded step a int -> string", checkAgainst(t, plan{ops: with(A, "a", op{k: "step", name: "a", typ: "str"})}, ex), "a", ids...)
	wantDivergence(t, "redacted, a retrying job's last recorded step a int -> struct", checkAgainst(t, plan{ops: with(A, "a", op{k: "step", name: "a", typ: "rec"})}, ex), "a", ids...)
}
