package handler_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Steps off the record (issue 39, items 1-4): each of a job's own steps is
// an item of the steps table, so no write pays for another step's bytes
// and a job holds up to ledger.MaxJobSteps of them.

type manySteps struct {
	N     int  `json:"n"`
	Bytes int  `json:"bytes"`
	Nap   bool `json:"nap,omitempty"` // sleep an hour after the steps, then one more step
}

func (manySteps) Kind() string { return "many-steps" }

// manyRig runs manySteps jobs, counting each step's calls, its handler's
// requests through a Meter.
type manyRig struct {
	e     *nexjobtest.Env
	h     *handler.Handler
	meter *awstest.Meter
	ft    *faults.Transport
	mu    sync.Mutex
	calls map[string]int // job id + "/" + step: calls of its function
}

func newManyRig(t *testing.T, o *nexjobtest.Options, lease time.Duration) *manyRig {
	t.Helper()
	r := &manyRig{e: nexjobtest.New(t, o), calls: map[string]int{}}
	cfg := r.e.Cfg
	r.meter = awstest.NewMeter(&cfg, r.e.DB)
	r.ft = faults.New(nil)
	r.e.Cfg = faults.Config(cfg, r.ft)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[manySteps](func(ctx context.Context, j *handler.Job[manySteps]) error {
		pad := strings.Repeat("x", j.Args.Bytes)
		step := func(name string) error {
			_, err := handler.Step(ctx, name, func(context.Context) (string, error) {
				r.mu.Lock()
				r.calls[j.ID+"/"+name]++
				r.mu.Unlock()
				return name + pad, nil
			})
			return err
		}
		for i := range j.Args.N {
			if err := step(fmt.Sprintf("s.%d", i)); err != nil {
				return err
			}
		}
		if j.Args.Nap {
			if err := handler.Sleep(ctx, "nap", time.Hour); err != nil {
				return err
			}
			return step("after")
		}
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet, Lease: lease})
	return r
}

// runLong runs job id's first run to its end, under an invocation deadline
// of 15 minutes, as Lambda's longest: the kit's Drain gives each batch 30
// s, and a loaded machine took longer for 10,000 steps, so the run was cut
// off and its rerun called the step in flight again (at least once, as a
// cut-off step is). It polls until the job leaves Enqueued and Processing.
func (r *manyRig) runLong(t *testing.T, id string) {
	t.Helper()
	p := poller.New(r.e.SQS, r.e.QueueURL, r.h.Handle, &poller.Options{WaitTime: time.Second, FunctionTimeout: 15 * time.Minute})
	for {
		rec, err := r.e.Client.Store().Get(context.Background(), id) // the record alone: not its 10,000 steps
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != ledger.Enqueued && rec.State != ledger.Processing {
			return
		}
		if _, err := p.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// called is how many times job id's step ran, at most and in all.
func (r *manyRig) called(id string) (most, all int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.calls {
		if strings.HasPrefix(k, id+"/") {
			most, all = max(most, n), all+n
		}
	}
	return most, all
}

func count(calls []string, op string) int {
	n := 0
	for _, c := range calls {
		if c == op {
			n++
		}
	}
	return n
}

// A step is one PutItem of its own size whatever the job's step count, and
// the run's claim and end cost the same with 1 step or 300: the record
// carries none of them. Before, with the steps on the record, the 300th
// step's write alone cost the record's whole size (about 60 write units
// here) and the job's writes grew with the square of its steps.
func TestStepsOffTheRecordCostTheSameAtEveryCount(t *testing.T) {
	t.Parallel()
	r := newManyRig(t, nil, 0)
	run := func(n int) (awstest.Units, []string, string) {
		id := enqueueOne(t, r.e.Client, manySteps{N: n, Bytes: 180}, nil)
		r.meter.Reset()
		r.e.Drain(t, r.h)
		return r.meter.Units(), r.meter.Calls(), id
	}
	u1, c1, id1 := run(1)
	u300, c300, id300 := run(300)
	for _, id := range []string{id1, id300} {
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded {
			t.Fatalf("job %s: %s (%s)", id, rec.State, rec.LastError)
		}
	}
	if p1, p300 := count(c1, "DynamoDB.PutItem"), count(c300, "DynamoDB.PutItem"); p1 != 1 || p300 != 300 {
		t.Errorf("PutItems: %d for 1 step, %d for 300; want one a step", p1, p300)
	}
	if q1, q300 := count(c1, "DynamoDB.Query"), count(c300, "DynamoDB.Query"); q1 != 0 || q300 != 0 {
		t.Errorf("Queries: %d and %d; want none (a job's first claim has no step to read back)", q1, q300)
	}
	if u1.Write != 3 || u300.Write-u1.Write != 299 {
		// claim 1, step 1, end 1; and one unit for each step more
		t.Errorf("write units: %d for 1 step, %d for 300; want 3 and 3+299 (a step one unit; claim and end the same)", u1.Write, u300.Write)
	}
	raw := r.e.Client.Store()
	rec, err := raw.Get(context.Background(), id300)
	if err != nil || len(rec.Steps) != 0 {
		t.Errorf("the 300-step job's record holds %d steps (%v); want none", len(rec.Steps), err)
	}
	if all := r.e.Get(t, id300).Steps; len(all) != 300 {
		t.Errorf("the kit's view of the job's steps: %d, want 300", len(all))
	}
}

// 10,000 steps in one job (ledger.MaxJobSteps: 9,998, a sleep, which is a
// step, and one after it), each run once: the woken run replays all of
// them from one Query per MB and records the last. A job of 10,001 fails for good with a
// *ledger.StepError at the step over the limit, before its function runs.
func TestTenThousandStepsInOneJob(t *testing.T) {
	t.Parallel()
	// A lease no loaded machine outlasts: a run taken over mid-way would
	// make its steps at least once, not once, and this test counts them.
	r := newManyRig(t, nil, 10*time.Minute)
	r.meter.Queries()
	id := enqueueOne(t, r.e.Client, manySteps{N: ledger.MaxJobSteps - 2, Bytes: 40, Nap: true}, nil)
	r.runLong(t, id)
	r.e.RequireState(t, id, ledger.Scheduled)
	r.e.Advance(t, time.Hour+time.Minute)
	r.meter.Reset()
	r.e.Drain(t, r.h)
	replay := r.meter.Units()
	calls := r.meter.Calls()
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || len(rec.Steps) != ledger.MaxJobSteps {
		t.Fatalf("job %s (%s), %d steps; want Succeeded with %d", rec.State, rec.LastError, len(rec.Steps), ledger.MaxJobSteps)
	}
	if most, all := r.called(id); most != 1 || all != ledger.MaxJobSteps-1 {
		t.Fatalf("step functions called %d times in all, one of them %d times; want each once", all, most)
	}
	// 10,000 items of under 128 bytes (keys, value, time, expiry): one
	// Query per MB of them, and a read unit per 4 KB.
	const item = 128
	if q, most := count(calls, "DynamoDB.Query"), int(math.Ceil(float64(ledger.MaxJobSteps*item)/(1<<20))); q > most {
		t.Errorf("the replay's Queries: %d, want at most %d", q, most)
	}
	if limit := math.Ceil(float64(ledger.MaxJobSteps*item)/4096) + 2; replay.Read > limit { // + the claim's and a look's reads
		t.Errorf("the replay read %g units, want at most %g (10,000 steps of under %d bytes, per 4 KB)", replay.Read, limit, item)
	}
	over := enqueueOne(t, r.e.Client, manySteps{N: ledger.MaxJobSteps + 1}, nil)
	r.runLong(t, over)
	rec := r.e.Get(t, over)
	r.mu.Lock()
	_, ranLast := r.calls[over+"/"+fmt.Sprintf("s.%d", ledger.MaxJobSteps)]
	r.mu.Unlock()
	if rec.State != ledger.Failed || rec.Attempt != 1 || !strings.Contains(rec.LastError, "ledger.MaxJobSteps") || len(rec.Steps) != ledger.MaxJobSteps {
		t.Errorf("a job of 10,001 steps: %s at attempt %d (%q), %d steps recorded; want Failed at its first attempt by the limit, 10,000 recorded", rec.State, rec.Attempt, rec.LastError, len(rec.Steps))
	}
	if !ranLast {
		t.Errorf("the step over the limit never ran; the refusal comes at its record")
	}
}

// Steps recorded on the record, before the deployment had a steps table,
// are replayed by a run that has one; the steps after go to the table.
func TestStepsOnTheRecordReadAfterTheUpgrade(t *testing.T) {
	t.Parallel()
	r := newManyRig(t, nil, 0)
	id := enqueueOne(t, r.e.Client, manySteps{N: 3, Nap: true}, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[manySteps](func(ctx context.Context, j *handler.Job[manySteps]) error {
		for i := range j.Args.N {
			if _, err := handler.Step(ctx, fmt.Sprintf("s.%d", i), func(context.Context) (string, error) {
				r.mu.Lock()
				r.calls[j.ID+"/"+fmt.Sprintf("s.%d", i)]++
				r.mu.Unlock()
				return "old", nil
			}); err != nil {
				return err
			}
		}
		return handler.Sleep(ctx, "nap", time.Hour)
	}), nil)
	before, err := handler.New(r.e.Cfg, r.e.Table, r.e.QueueURL, reg, &handler.Options{Logger: quiet, Ledger: ledger.Options{Now: r.e.Now}, Backoff: handler.FloorBackoff, DLQURL: r.e.DLQURL, MaxDelay: nexjobtest.DefaultMaxDelay})
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, before)
	rec, err := r.e.Client.Store().Get(context.Background(), id)
	if err != nil || rec.State != ledger.Scheduled || len(rec.Steps) != 4 {
		t.Fatalf("before the upgrade: %s, %d steps on the record (%v); want Scheduled with 3 and the nap", rec.State, len(rec.Steps), err)
	}
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	rec = r.e.Get(t, id)
	if most, all := r.called(id); rec.State != ledger.Succeeded || most != 1 || all != 4 || rec.Steps["s.0"] != `"old"` || rec.Steps["after"] == "" {
		t.Fatalf("after the upgrade: %s (%s), functions called %d (one %d times), steps %v; want Succeeded, the old steps replayed", rec.State, rec.LastError, all, most, rec.Steps)
	}
}

// Every write can fail after it took effect: a step's PutItem applied
// with its reply lost reads as the step recorded (the resend meets the
// item and returns its value); throttled past the SDK's retries, the run
// fails and the next one calls the function again (a step is at least
// once; exactly once when its write lands).
func TestStepsOffTheRecordUnderFaults(t *testing.T) {
	t.Parallel()
	isStep := func(b []byte) bool { return strings.Contains(string(b), `"s.1`) }
	for _, c := range []struct {
		name     string
		rule     faults.Rule
		attempts int
		calls    int
	}{
		{"reply lost", faults.Rule{Op: "DynamoDB.PutItem", Match: isStep, Fault: faults.LostReply}, 1, 3},
		{"throttled past the retries", faults.Rule{Op: "DynamoDB.PutItem", Match: isStep, Fault: faults.Throttle, Times: faults.Attempts}, 2, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newManyRig(t, nil, 0)
			h := r.ft.Add(c.rule)
			id := enqueueOne(t, r.e.Client, manySteps{N: 3}, nil)
			r.e.Drain(t, r.h)
			if r.e.Get(t, id).State == ledger.Scheduled { // the throttled run's retry
				r.e.Advance(t, time.Minute)
				r.e.Drain(t, r.h)
			}
			rec := r.e.Get(t, id)
			_, all := r.called(id)
			if h.Fired() == 0 || rec.State != ledger.Succeeded || rec.Attempt != c.attempts || all != c.calls || len(rec.Steps) != 3 {
				t.Fatalf("fired %d; job %s at attempt %d (%s), functions called %d times, %d steps; want Succeeded at attempt %d, %d calls, 3 steps",
					h.Fired(), rec.State, rec.Attempt, rec.LastError, all, len(rec.Steps), c.attempts, c.calls)
			}
		})
	}
}

// Two runs of a job record the same step (a run whose lease ran out, and
// the run that took over): the first write wins, and the second run goes
// on with the first's value, not its own.
func TestTheFirstWriteOfAStepWins(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	st := e.Client.Store()
	id := enqueueOne(t, e.Client, manySteps{N: 1}, nil)
	rec, err := st.Claim(context.Background(), id, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.PutStep(context.Background(), rec, ledger.OffSteps{}, "charge", `"ch_1"`)
	if err != nil || first != `"ch_1"` {
		t.Fatalf("the first write: %q, %v", first, err)
	}
	second, err := st.PutStep(context.Background(), rec, ledger.OffSteps{}, "charge", `"ch_2"`)
	if err != nil || second != `"ch_1"` {
		t.Fatalf("the second write: %q, %v; want the first's value", second, err)
	}
	var se *ledger.StepError
	if _, err := st.PutStep(context.Background(), rec, ledger.OffSteps{}, "big", `"`+strings.Repeat("x", ledger.MaxStepValueBytes)+`"`); !errors.As(err, &se) {
		t.Fatalf("a value over %d bytes: %v, want a *ledger.StepError", ledger.MaxStepValueBytes, err)
	}
}
