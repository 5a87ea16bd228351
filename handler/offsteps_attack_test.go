package handler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Attacks on the promises of steps off the record (docs/durable-jobs.md,
// "Steps off the record: the steps table"; ledger/offsteps.go). Each test
// quotes the promise it holds the code to.

type atk struct {
	N     int      `json:"n,omitempty"`
	Names []string `json:"names,omitempty"`
	Big   int      `json:"big,omitempty"`
	Nap   bool     `json:"nap,omitempty"`
	Tag   string   `json:"tag,omitempty"`
}

func (atk) Kind() string { return "off-attack" }

// atkRig runs atk jobs with a worker of the test's own, through a fault
// transport and a Meter, counting each step's calls per job.
type atkRig struct {
	e     *nexjobtest.Env
	ft    *faults.Transport
	meter *awstest.Meter
	h     *handler.Handler
	reg   *handler.Registry
	mu    sync.Mutex
	calls map[string]int // job id + "/" + step name
}

type atkWork func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error

func newAtk(t *testing.T, o *nexjobtest.Options, ho *handler.Options, work atkWork) *atkRig {
	t.Helper()
	r := &atkRig{e: nexjobtest.New(t, o), calls: map[string]int{}}
	cfg := r.e.Cfg
	r.meter = awstest.NewMeter(&cfg, r.e.DB)
	r.ft = faults.New(nil)
	r.e.Cfg = faults.Config(cfg, r.ft)
	r.reg = handler.NewRegistry()
	handler.AddWorker(r.reg, handler.WorkFunc[atk](func(ctx context.Context, j *handler.Job[atk]) error {
		return work(r, ctx, j)
	}), nil)
	if ho == nil {
		ho = &handler.Options{}
	}
	ho.Logger = quiet
	r.h = r.e.Handler(t, r.reg, ho)
	return r
}

// atkLease is the take-over tests' lease. The ledger's clock is moved
// past it, so its length costs no wait; the run's real deadline is the
// lease less the finish margin, and a short one (3 s: 1 s to run) cut the
// new run off when a busy machine was slow to answer its Query.
const atkLease = time.Minute

// step records name with value v, counting its function's calls.
func (r *atkRig) step(ctx context.Context, id, name, v string) (string, error) {
	return handler.Step(ctx, name, func(context.Context) (string, error) {
		r.mu.Lock()
		r.calls[id+"/"+name]++
		r.mu.Unlock()
		return v, nil
	})
}

func (r *atkRig) called(id, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[id+"/"+name]
}

func (r *atkRig) enqueue(t *testing.T, a atk, o *enqueue.Opts) string {
	t.Helper()
	return enqueueOne(t, r.e.Client, a, o)
}

// stepsN steps s.0 .. s.N-1, then the named ones, then an hour's nap and
// "after" when Nap.
func stepsN(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
	pad := strings.Repeat("x", j.Args.Big)
	for i := range j.Args.N {
		if _, err := r.step(ctx, j.ID, fmt.Sprintf("s.%d", i), pad+j.Args.Tag); err != nil {
			return err
		}
	}
	for _, n := range j.Args.Names {
		if _, err := r.step(ctx, j.ID, n, n+j.Args.Tag); err != nil {
			return err
		}
	}
	if j.Args.Nap {
		if err := handler.Sleep(ctx, "nap", time.Hour); err != nil {
			return err
		}
		_, err := r.step(ctx, j.ID, "after", "a")
		return err
	}
	return nil
}

// "RequeueFresh ... the earlier items are no longer read": the promise
// "RequeueFresh drops them (the next run calls every step's function
// again); a plain Requeue keeps them", over many generations, with names
// that a generation's key prefix could confuse ("1x" of generation 1 and
// "x" of generation 11, "#", "1#x"), and names of any printable character.
func TestOffAttackRequeueFreshEveryGeneration(t *testing.T) {
	t.Parallel()
	names := []string{"1x", "x", "#", "1#x", "0", "00", "#1#", "a/b", "s.1", " ", "~", "é", "日本", "nexjob", "1"}
	r := newAtk(t, nil, nil, stepsN)
	id := r.enqueue(t, atk{Names: names}, nil)
	ctx := context.Background()
	for gen := 1; gen <= 13; gen++ {
		r.e.Drain(t, r.h)
		rec := r.e.Get(t, id)
		if rec.State != ledger.Succeeded || len(rec.Steps) != len(names) {
			t.Fatalf("generation %d: %s (%s), %d steps; want Succeeded with %d", gen, rec.State, rec.LastError, len(rec.Steps), len(names))
		}
		for _, n := range names {
			if c := r.called(id, n); c != gen {
				t.Fatalf("generation %d: step %q called %d times, want %d (RequeueFresh drops the steps: every function called again)", gen, n, c, gen)
			}
			if rec.Steps[n] != fmt.Sprintf("%q", n) {
				t.Fatalf("generation %d: step %q recorded %s", gen, n, rec.Steps[n])
			}
		}
		// A plain Requeue keeps them.
		if _, err := r.e.Client.Requeue(ctx, id); err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, r.h)
		for _, n := range names {
			if c := r.called(id, n); c != gen {
				t.Fatalf("generation %d, after a plain Requeue: step %q called %d times, want %d (Requeue keeps them)", gen, n, c, gen)
			}
		}
		if _, err := r.e.Client.RequeueFresh(ctx, id); err != nil {
			t.Fatal(err)
		}
		if rec := r.e.Get(t, id); len(rec.Steps) != 0 {
			t.Fatalf("generation %d: after RequeueFresh the job shows %d steps, want none", gen, len(rec.Steps))
		}
	}
}

// "steps recorded on the record before the table existed ... are
// replayed after the upgrade", and "RequeueFresh drops them: the next run
// calls every step's function again": a job whose steps are on its record
// (recorded before the deployment had a steps table), requeued fresh by a
// deployment with one.
func TestOffAttackRequeueFreshDropsStepsOnTheRecord(t *testing.T) {
	t.Parallel()
	r := newAtk(t, nil, nil, stepsN)
	id := r.enqueue(t, atk{N: 3}, nil)
	before, err := handler.New(r.e.Cfg, r.e.Table, r.e.QueueURL, r.reg, &handler.Options{Logger: quiet, Ledger: ledger.Options{Now: r.e.Now}, Backoff: handler.FloorBackoff, DLQURL: r.e.DLQURL, MaxDelay: nexjobtest.DefaultMaxDelay})
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, before)
	if rec, err := r.e.Client.Store().Get(context.Background(), id); err != nil || rec.State != ledger.Succeeded || len(rec.Steps) != 3 {
		t.Fatalf("before the upgrade: %s, %d steps on the record (%v); want Succeeded with 3", rec.State, len(rec.Steps), err)
	}
	// The upgrade: a plain Requeue replays them.
	if _, err := r.e.Client.Requeue(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	if c := r.called(id, "s.0"); c != 1 {
		t.Fatalf("after the upgrade and a Requeue: s.0 called %d times, want 1 (replayed)", c)
	}
	if _, err := r.e.Client.RequeueFresh(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	for i := range 3 {
		if c := r.called(id, fmt.Sprintf("s.%d", i)); c != 2 || rec.State != ledger.Succeeded {
			t.Fatalf("after RequeueFresh: %s, s.%d called %d times, want Succeeded and 2 (every step called again)", rec.State, i, c)
		}
	}
}

// "The first write wins ... the write of a run whose lease this one took
// over ... the run goes on with it, not with its own", and "the run looks
// at its record for a cancel or a newer claim at a step when it has not
// for CancelLook": a run stuck in its step's function past its lease (and
// CancelLook); the run that took over records the step and ends; the
// stuck run, let go, never goes on with its own value, and calls no step
// after it.
func TestOffAttackTakenOverRunStopsAtTheLook(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var charges atomic.Int32
	errA, valA := make(chan error, 1), make(chan string, 1)
	r := newAtk(t, nil, &handler.Options{Lease: atkLease}, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		first := false
		v, err := handler.Step(ctx, "charge", func(context.Context) (string, error) {
			if charges.Add(1) == 1 {
				first = true
				close(entered)
				<-release
				return "A", nil
			}
			return "B", nil
		})
		if first {
			errA <- err
			valA <- v
		}
		if err != nil {
			return err
		}
		_, err = r.step(ctx, j.ID, "after", "x")
		return err
	})
	id := r.enqueue(t, atk{}, nil)
	ev := poller.Event(r.e.QueueURL, r.e.Messages(t, r.e.QueueURL))
	doneA := make(chan struct{})
	go func() { defer close(doneA); _, _ = r.h.Handle(context.Background(), ev) }()
	<-entered
	// Past the run's lease (and so ledger.CancelLook).
	r.e.Advance(t, ledger.Millis(r.e.Get(t, id).LeaseUntil).Sub(r.e.Now())+time.Second)
	// The message again, to another worker (its visibility ran out).
	other := r.e.Handler(t, r.reg, &handler.Options{Logger: quiet, Lease: atkLease})
	if _, err := other.Handle(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	r.e.RequireState(t, id, ledger.Succeeded)
	close(release)
	<-doneA
	if err, v := <-errA, <-valA; err == nil && v != "B" {
		t.Errorf("the run taken over went on with %q, want the recorded B or the newer claim seen", v)
	} else if err == nil {
		t.Errorf("the run taken over, past CancelLook: its step returned the recorded value and no error, want the newer claim seen at the look")
	}
	if rec := r.e.Get(t, id); rec.Steps["charge"] != `"B"` {
		t.Errorf("the job's charge: %s, want the first write's B", rec.Steps["charge"])
	}
	if c := r.called(id, "after"); c != 1 {
		t.Errorf("the step after: called %d times, want once (the run taken over stops at the look)", c)
	}
}

// "a Deadline never expires a job that ran a step": a run that recorded
// its step and was cut off by the invocation's deadline gives its attempt
// back; the deadline passes; the job runs on, its step replayed.
func TestOffAttackDeadlineAfterACutOff(t *testing.T) {
	t.Parallel()
	stepped := make(chan struct{})
	var runs atomic.Int32
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		if _, err := r.step(ctx, j.ID, "charge", "c"); err != nil {
			return err
		}
		if runs.Add(1) == 1 {
			close(stepped)
			<-ctx.Done()
			return ctx.Err()
		}
		_, err := r.step(ctx, j.ID, "ship", "s")
		return err
	})
	id := r.enqueue(t, atk{}, &enqueue.Opts{Deadline: r.e.Now().Add(time.Minute)})
	// The invocation's deadline cuts the run off (as
	// TestCutOffsSpendTheAttempt): the run ends when its context does,
	// after its step.
	ctx, cancel := context.WithTimeout(context.Background(), cutOffTimeout)
	defer cancel()
	msgs := r.e.Messages(t, r.e.QueueURL)
	if _, err := r.h.Handle(ctx, poller.Event(r.e.QueueURL, msgs)); err != nil {
		t.Fatal(err)
	}
	<-stepped
	// Its message comes back (here at once, not after the kit's 60 s).
	if _, err := r.e.SQS.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(r.e.QueueURL), ReceiptHandle: msgs[0].ReceiptHandle, VisibilityTimeout: 0}); err != nil {
		t.Fatal(err)
	}
	rec := r.e.Get(t, id)
	t.Logf("after the cut-off: %s at attempt %d (%s)", rec.State, rec.Attempt, rec.LastError)
	r.e.Advance(t, 5*time.Minute)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || r.called(id, "charge") != 1 || r.called(id, "ship") != 1 {
		t.Fatalf("the job that ran its charge, cut off, past its deadline: %s (%s), charged %d, shipped %d; want Succeeded, each once (a Deadline never expires a job that ran a step)",
			rec.State, rec.LastError, r.called(id, "charge"), r.called(id, "ship"))
	}
}

// "a debounced enqueue never folds into a job that ran": a job of a
// debounce window whose StepWith call failed and paused in a durable
// sleep (no attempt spent) has run; the next enqueue of the key starts a
// new window.
func TestOffAttackDebounceNeverFoldsIntoAStepWithPause(t *testing.T) {
	t.Parallel()
	var fails atomic.Int32
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		if _, err := r.step(ctx, j.ID, "charge", j.Args.Tag); err != nil {
			return err
		}
		_, err := handler.StepWith(ctx, "ship", &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Hour }, WaitInRun: time.Second},
			func(context.Context) (string, error) {
				if fails.Add(1) == 1 {
					return "", errors.New("the carrier is down")
				}
				return j.Args.Tag, nil
			})
		return err
	})
	db := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "cart-9", Period: time.Second}}
	first := r.enqueue(t, atk{Tag: "o-1"}, db)
	r.e.Advance(t, 2*time.Second)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, first)
	if rec.State != ledger.Scheduled || r.called(first, "charge") != 1 {
		t.Fatalf("the first job after its run: %s (%s), charged %d; want Scheduled in the step's pause, charged once", rec.State, rec.LastError, r.called(first, "charge"))
	}
	second := r.enqueue(t, atk{Tag: "o-2"}, db)
	if second == first {
		t.Fatalf("the second enqueue folded into the job %s that ran its charge (a debounced enqueue never folds into a job that ran)", first)
	}
}

// "a Deadline never expires a job that ran a step", for a job whose only
// mark of its run is a StepWith failure's record and its durable pause.
func TestOffAttackDeadlineAfterAStepWithPause(t *testing.T) {
	t.Parallel()
	var fails atomic.Int32
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		_, err := handler.StepWith(ctx, "charge", &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Hour }, WaitInRun: time.Second},
			func(context.Context) (string, error) {
				r.mu.Lock()
				r.calls[j.ID+"/charge"]++
				r.mu.Unlock()
				if fails.Add(1) == 1 {
					return "", errors.New("the provider answered 503 after charging")
				}
				return "ok", nil
			})
		return err
	})
	id := r.enqueue(t, atk{}, &enqueue.Opts{Deadline: r.e.Now().Add(time.Minute)})
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Scheduled {
		t.Fatalf("after the first call: %s (%s), want Scheduled in the step's pause", rec.State, rec.LastError)
	}
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || r.called(id, "charge") != 2 {
		t.Fatalf("past its deadline after a step's failure was recorded: %s (%s), charge called %d; want Succeeded after 2 calls", rec.State, rec.LastError, r.called(id, "charge"))
	}
}

// "A job's first run reads nothing back (its claim is the job's first, so
// no step can exist)": not when a step's write met its own (a lost
// reply), nor at a sleep.
func TestOffAttackFirstRunReadsNothingBack(t *testing.T) {
	t.Parallel()
	r := newAtk(t, nil, nil, stepsN)
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), `s.1"`) }, Fault: faults.LostReply})
	id := r.enqueue(t, atk{N: 3, Nap: true}, nil)
	msgs := r.e.Messages(t, r.e.QueueURL)
	r.meter.Reset()
	if _, err := r.h.Handle(context.Background(), poller.Event(r.e.QueueURL, msgs)); err != nil {
		t.Fatal(err)
	}
	if lost.Fired() != 1 {
		t.Fatalf("the lost reply fired %d times", lost.Fired())
	}
	if q := count(r.meter.Calls(), "DynamoDB.Query"); q != 0 {
		t.Errorf("the job's first run made %d Queries, want none", q)
	}
	if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || len(rec.Steps) != 4 || r.called(id, "s.1") != 1 {
		t.Fatalf("after the first run: %s (%s), %d steps, s.1 called %d; want Scheduled in its nap, 4 steps, s.1 once", rec.State, rec.LastError, len(rec.Steps), r.called(id, "s.1"))
	}
}

// "the claim and the end cost the same at step 1 and step 300": the run
// woken from a sleep, after 1 step or 300, writes the same units.
func TestOffAttackWokenRunCostsTheSameAtEveryCount(t *testing.T) {
	t.Parallel()
	r := newAtk(t, nil, nil, stepsN)
	woken := func(n int) awstest.Units {
		id := r.enqueue(t, atk{N: n, Big: 180, Nap: true}, nil)
		r.e.Drain(t, r.h)
		r.e.RequireState(t, id, ledger.Scheduled)
		r.e.RunNow(t, id)
		r.meter.Reset()
		r.e.Drain(t, r.h)
		if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || r.called(id, "s.0") != 1 {
			t.Fatalf("%d steps: %s (%s), s.0 called %d", n, rec.State, rec.LastError, r.called(id, "s.0"))
		}
		return r.meter.Units()
	}
	u1, u300 := woken(1), woken(300)
	if u1.Write != u300.Write || u1.Write != 3 {
		t.Errorf("the woken run's write units: %d after 1 step, %d after 300; want 3 each (claim, the step after, end)", u1.Write, u300.Write)
	}
}

// "Over a limit: a *ledger.StepError, the job failed for good at its
// first attempt, never retried for ever": a value over
// ledger.MaxStepValueBytes, through Step and through StepWith (whose
// policy must not retry it), after a sleep (the woken run's attempt is
// its first); a value of exactly the limit is recorded.
func TestOffAttackValueLimit(t *testing.T) {
	t.Parallel()
	var withCalls atomic.Int32
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		if j.Args.Nap {
			if err := handler.Sleep(ctx, "nap", time.Hour); err != nil {
				return err
			}
		}
		big := strings.Repeat("x", j.Args.Big-2) // its JSON: Big bytes
		if j.Args.Tag == "with" {
			_, err := handler.StepWith(ctx, "big", &handler.StepOptions{MaxAttempts: 5, Backoff: func(int) time.Duration { return time.Millisecond }},
				func(context.Context) (string, error) { withCalls.Add(1); return big, nil })
			return err
		}
		_, err := r.step(ctx, j.ID, "big", big)
		return err
	})
	exact := r.enqueue(t, atk{Big: ledger.MaxStepValueBytes}, nil)
	over := r.enqueue(t, atk{Big: ledger.MaxStepValueBytes + 1}, nil)
	with := r.enqueue(t, atk{Big: ledger.MaxStepValueBytes + 1, Tag: "with"}, nil)
	napped := r.enqueue(t, atk{Big: ledger.MaxStepValueBytes + 1, Nap: true}, nil)
	r.e.Drain(t, r.h)
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, exact); rec.State != ledger.Succeeded || len(rec.Steps["big"]) != ledger.MaxStepValueBytes {
		t.Errorf("a value of exactly %d bytes: %s (%s), recorded %d bytes; want Succeeded, recorded", ledger.MaxStepValueBytes, rec.State, rec.LastError, len(rec.Steps["big"]))
	}
	for name, id := range map[string]string{"Step": over, "StepWith": with, "after a sleep": napped} {
		rec := r.e.Get(t, id)
		if rec.State != ledger.Failed || rec.Attempt != 1 || !strings.Contains(rec.LastError, "big") || strings.Contains(rec.LastError, "xxxx") || rec.Steps["big"] != "" {
			t.Errorf("%s, a value over the limit: %s at attempt %d (%.200s), recorded %d bytes; want Failed at attempt 1 naming the step, nothing recorded", name, rec.State, rec.Attempt, rec.LastError, len(rec.Steps["big"]))
		}
	}
	if n := withCalls.Load(); n != 1 {
		t.Errorf("StepWith's function called %d times for a value over the limit, want once (it would fail every call)", n)
	}
}

// "a cancel ... is seen at the first step's record once ledger.CancelLook
// has passed since the run last read its record": a cancel that comes
// between two steps (no step's function running), the clock moved past
// CancelLook: the next step's record is refused, nothing after it runs.
func TestOffAttackCancelBetweenSteps(t *testing.T) {
	t.Parallel()
	between, release := make(chan struct{}), make(chan struct{})
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		if _, err := r.step(ctx, j.ID, "a", "1"); err != nil {
			return err
		}
		close(between)
		<-release
		for _, n := range []string{"b", "c"} {
			if _, err := r.step(ctx, j.ID, n, "1"); err != nil {
				return err
			}
		}
		return nil
	})
	id := r.enqueue(t, atk{}, nil)
	done := make(chan struct{})
	go func() { defer close(done); r.e.Drain(t, r.h) }()
	<-between
	var asked *enqueue.CancelRequestedError
	if _, err := r.e.Client.Cancel(context.Background(), id, "withdrawn", time.Hour); !errors.As(err, &asked) {
		t.Fatalf("Cancel of a running job: %v", err)
	}
	r.e.Advance(t, ledger.CancelLook)
	close(release)
	<-done
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "withdrawn") || r.called(id, "c") != 0 || rec.Steps["b"] != "" {
		t.Fatalf("cancelled between steps: %s (%s), c called %d, steps %v; want Failed with the reason, b not recorded, c never called", rec.State, rec.LastError, r.called(id, "c"), rec.Steps)
	}
}

// The same with the worker's clock an hour off the producer's (skewed
// clocks, both ways): CancelLook is measured on the run's own clock from
// its own read.
func TestOffAttackCancelLookUnderSkewedClocks(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			inStep, release := make(chan struct{}), make(chan struct{})
			r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
				if _, err := handler.Step(ctx, "a", func(context.Context) (int, error) { close(inStep); <-release; return 1, nil }); err != nil {
					return err
				}
				_, err := r.step(ctx, j.ID, "b", "1")
				return err
			})
			now := func() time.Time { return r.e.Now().Add(skew) }
			h, err := handler.New(r.e.Cfg, r.e.Table, r.e.QueueURL, r.reg, &handler.Options{Logger: quiet, Ledger: ledger.Options{Now: now, StepsTable: r.e.StepsTable}, Backoff: handler.FloorBackoff, DLQURL: r.e.DLQURL, MaxDelay: nexjobtest.DefaultMaxDelay})
			if err != nil {
				t.Fatal(err)
			}
			id := r.enqueue(t, atk{}, nil)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = h.Handle(context.Background(), poller.Event(r.e.QueueURL, r.e.Messages(t, r.e.QueueURL)))
			}()
			<-inStep
			var asked *enqueue.CancelRequestedError
			if _, err := r.e.Client.Cancel(context.Background(), id, "withdrawn", time.Hour); !errors.As(err, &asked) {
				t.Fatalf("Cancel of a running job: %v", err)
			}
			r.e.Advance(t, ledger.CancelLook)
			close(release)
			<-done
			rec := r.e.Get(t, id)
			if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "withdrawn") || r.called(id, "b") != 0 {
				t.Fatalf("worker clock %v off: %s (%s), b called %d; want Failed with the cancel, b never", skew, rec.State, rec.LastError, r.called(id, "b"))
			}
		})
	}
}

// "The first write wins ... the write of a run whose lease this one took
// over ... the run goes on with it, not with its own": the run taken over
// looked at its record before the take-over, and its step's write lands
// after the new run's claim and before the new run's own write of the
// step. The new run goes on with the old run's value.
func TestOffAttackTakerGoesOnWithTheZombiesValue(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	aHeld, aGo, bHeld, bGo := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	got := make(chan string, 2)
	var runs, puts atomic.Int32
	r := newAtk(t, nil, &handler.Options{Lease: atkLease}, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		run := runs.Add(1)
		v, err := handler.Step(ctx, "charge", func(context.Context) (string, error) {
			if run == 1 {
				close(entered)
				<-release
				return "A", nil
			}
			return "B", nil
		})
		if err != nil {
			return err
		}
		got <- fmt.Sprintf("%d:%s", run, v)
		return nil
	})
	r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), `charge`) }, Fault: faults.Pass, Times: faults.Forever,
		Before: func(*http.Request, []byte) {
			switch puts.Add(1) {
			case 1:
				close(aHeld)
				<-aGo
			case 2:
				close(bHeld)
				<-bGo
			}
		}})
	id := r.enqueue(t, atk{}, nil)
	ev := poller.Event(r.e.QueueURL, r.e.Messages(t, r.e.QueueURL))
	doneA := make(chan struct{})
	go func() { defer close(doneA); _, _ = r.h.Handle(context.Background(), ev) }()
	<-entered
	r.e.Advance(t, ledger.CancelLook+100*time.Millisecond) // the old run looks at its record (nothing yet) before its write
	close(release)
	<-aHeld
	r.e.Advance(t, ledger.Millis(r.e.Get(t, id).LeaseUntil).Sub(r.e.Now())+time.Second)
	other := r.e.Handler(t, r.reg, &handler.Options{Logger: quiet, Lease: atkLease})
	doneB := make(chan struct{})
	go func() { defer close(doneB); _, _ = other.Handle(context.Background(), ev) }()
	<-bHeld // the new run claimed, called its function, and writes
	close(aGo)
	<-doneA
	close(bGo)
	<-doneB
	close(got)
	var vals []string
	for v := range got {
		vals = append(vals, v)
	}
	rec := r.e.Get(t, id)
	if rec.Steps["charge"] != `"A"` {
		t.Fatalf("charge recorded %s, want the first write's A", rec.Steps["charge"])
	}
	for _, v := range vals {
		if v == "2:B" {
			t.Fatalf("the run that took over went on with its own B; runs got %v; want A, the recorded value", vals)
		}
	}
	if rec.State != ledger.Succeeded {
		t.Fatalf("job %s (%s), runs got %v", rec.State, rec.LastError, vals)
	}
}

// "a debounced enqueue never folds into a job that ran", for a job cut
// off by the invocation's deadline after its step (its attempt given
// back, its record Enqueued at attempt 0, no step on it).
func TestOffAttackDebounceAfterACutOff(t *testing.T) {
	t.Parallel()
	stepped := make(chan struct{})
	var runs atomic.Int32
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		if _, err := r.step(ctx, j.ID, "charge", j.Args.Tag); err != nil {
			return err
		}
		if runs.Add(1) == 1 {
			close(stepped)
			<-ctx.Done()
			return ctx.Err()
		}
		_, err := r.step(ctx, j.ID, "ship", j.Args.Tag)
		return err
	})
	db := func() *enqueue.Opts {
		return &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "cart-3", Period: time.Second}, Deadline: r.e.Now().Add(time.Minute)}
	}
	first := r.enqueue(t, atk{Tag: "o-1"}, db())
	r.e.Advance(t, 2*time.Second)
	var msgs []sqstypes.Message
	for len(msgs) == 0 { // its message, due now (the kit's hops)
		for _, m := range r.e.Messages(t, r.e.QueueURL) {
			if strings.Contains(aws.ToString(m.Body), first) {
				msgs = append(msgs, m)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cutOffTimeout) // the function timeout cuts the run off
	defer cancel()
	if _, err := r.h.Handle(ctx, poller.Event(r.e.QueueURL, msgs[:1])); err != nil {
		t.Fatal(err)
	}
	<-stepped
	rec := r.e.Get(t, first)
	t.Logf("after the cut-off: %s at attempt %d (%s)", rec.State, rec.Attempt, rec.LastError)
	res, err := r.e.Client.Enqueue(context.Background(), atk{Tag: "o-2"}, db())
	if err != nil {
		t.Fatal(err)
	}
	if res.ID == first || res.Folded {
		t.Fatalf("the enqueue folded into the job %s that ran its charge and was cut off (a debounced enqueue never folds into a job that ran)", first)
	}
}

// "steps recorded on the record before the table existed ... are
// replayed after the upgrade": StepWith's retries' records are steps, so
// a count of failed calls begun before the upgrade resumes where it was
// ("a run that dies or sleeps between two calls resumes the count where
// it was"): MaxAttempts 3 calls fn three times in the attempt, not more.
func TestOffAttackStepWithCountAcrossTheUpgrade(t *testing.T) {
	t.Parallel()
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		_, err := handler.StepWith(ctx, "charge", &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Hour }, WaitInRun: time.Second},
			func(context.Context) (string, error) {
				r.mu.Lock()
				r.calls[j.ID+"/charge"]++
				r.mu.Unlock()
				return "", errors.New("the provider is down")
			})
		return err
	})
	id := r.enqueue(t, atk{}, &enqueue.Opts{MaxAttempts: 1})
	before, err := handler.New(r.e.Cfg, r.e.Table, r.e.QueueURL, r.reg, &handler.Options{Logger: quiet, Ledger: ledger.Options{Now: r.e.Now}, Backoff: handler.FloorBackoff, DLQURL: r.e.DLQURL, MaxDelay: nexjobtest.DefaultMaxDelay})
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, before)
	if rec, err := r.e.Client.Store().Get(context.Background(), id); err != nil || rec.State != ledger.Scheduled || len(rec.Steps) == 0 {
		t.Fatalf("before the upgrade: %s with %d steps on the record (%v); want Scheduled in the step's pause, its failure recorded", rec.State, len(rec.Steps), err)
	}
	for range 4 {
		r.e.Advance(t, time.Hour+time.Minute)
		r.e.Drain(t, r.h)
		if r.e.Get(t, id).State.Terminal() {
			break
		}
	}
	if rec := r.e.Get(t, id); rec.State != ledger.Failed || r.called(id, "charge") != 3 {
		t.Fatalf("after the upgrade: %s (%s), fn called %d times; want Failed after 3 calls (MaxAttempts 3, the count resumed)", rec.State, rec.LastError, r.called(id, "charge"))
	}
}

// "a lost reply reads as recorded (function called once)": a step's
// PutItem applied and its reply lost as a network timeout, as a 500.
func TestOffAttackTimeoutReadsAsRecorded(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.Timeout, faults.LostReply} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			r := newAtk(t, nil, nil, stepsN)
			h := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), `s.1"`) }, Fault: f, Times: 2})
			id := r.enqueue(t, atk{N: 3}, nil)
			r.e.Drain(t, r.h)
			rec := r.e.Get(t, id)
			if h.Fired() == 0 || rec.State != ledger.Succeeded || rec.Attempt != 1 || r.called(id, "s.1") != 1 || rec.Steps["s.1"] != `""` {
				t.Fatalf("fired %d: %s at attempt %d (%s), s.1 called %d, recorded %s; want Succeeded at attempt 1, once", h.Fired(), rec.State, rec.Attempt, rec.LastError, r.called(id, "s.1"), rec.Steps["s.1"])
			}
		})
	}
}

// "expiring two years after it was written (ledger.StepLife; a run that
// reads items with less than a year left writes their expiry again)": a
// job that steps, sleeps handler.MaxWait (366 days) and wakes keeps its step's item alive.
func TestOffAttackExpiryRewrittenAfterALongSleep(t *testing.T) {
	t.Parallel()
	r := newAtk(t, nil, nil, func(r *atkRig, ctx context.Context, j *handler.Job[atk]) error {
		if _, err := r.step(ctx, j.ID, "before", "b"); err != nil {
			return err
		}
		if err := handler.Sleep(ctx, "long", handler.MaxWait-time.Minute); err != nil {
			return err
		}
		_, err := r.step(ctx, j.ID, "after", "a")
		return err
	})
	id := r.enqueue(t, atk{}, nil)
	r.e.Drain(t, r.h)
	r.e.RequireState(t, id, ledger.Scheduled)
	r.e.RunNow(t, id)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || r.called(id, "before") != 1 {
		t.Fatalf("after the sleep: %s (%s), before called %d", rec.State, rec.LastError, r.called(id, "before"))
	}
	out, err := r.e.DB.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(r.e.StepsTable), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	floor := r.e.Now().Add(365 * 24 * time.Hour).Unix()
	for _, it := range out.Items {
		var exp int64
		for k, v := range it {
			if n, ok := v.(*ddbtypes.AttributeValueMemberN); ok && (strings.Contains(strings.ToLower(k), "exp") || strings.Contains(strings.ToLower(k), "ttl")) {
				if _, err := fmt.Sscan(n.Value, &exp); err != nil {
					t.Fatalf("item attribute %s: %q is not a number: %v", k, n.Value, err)
				}
			}
		}
		if exp > r.e.Now().Add(3*365*24*time.Hour).Unix() {
			t.Fatalf("a step's expiry %d is not in seconds", exp)
		}
		if exp < floor {
			t.Errorf("a step's item expires at %d (%v), before %v: a year from the run that read it", exp, time.Unix(exp, 0), time.Unix(floor, 0))
		}
	}
}
