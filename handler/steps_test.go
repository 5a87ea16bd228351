package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Steps (issue 29): a step whose result was recorded never runs again in
// its job, whatever ends a run after it.

type stepped struct {
	Order string `json:"order"`
	Big   int    `json:"big,omitempty"` // bytes of the charge step's result
}

func (stepped) Kind() string { return "stepped" }

// receipt is the charge step's result.
type receipt struct {
	ChargeID string `json:"chargeId"`
	Key      string `json:"key"`
	Pad      string `json:"pad,omitempty"`
}

// stepsEnv runs the stepped kind: a charge step (counted per job), then
// fail() decides whether the run fails after it, then a mark step.
type stepsEnv struct {
	e       *nexjobtest.Env
	ft      *faults.Transport
	counter *awstest.Meter
	h       *handler.Handler
	mu      sync.Mutex
	charges map[string]int
	keys    map[string][]string // StepKey("charge") per run
	marks   map[string]int
	fail    func(attempt int) error
}

// newSteps keeps the steps on the record (no steps table): these tests pin
// that layout's writes, faults and limits; offsteps_test.go the steps
// table's.
func newSteps(t *testing.T) *stepsEnv {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{StepsOnRecord: true})
	s := &stepsEnv{e: e, charges: map[string]int{}, keys: map[string][]string{}, marks: map[string]int{}, fail: func(int) error { return nil }}
	s.ft = faults.New(nil)
	cfg := faults.Config(e.Cfg, s.ft)
	s.counter = awstest.NewMeter(&cfg, e.DB)
	e.Cfg = cfg
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[stepped](func(ctx context.Context, j *handler.Job[stepped]) error {
		r, err := handler.Step(ctx, "charge", func(ctx context.Context) (receipt, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.charges[j.ID]++
			return receipt{ChargeID: "ch_" + j.Args.Order, Key: handler.StepKey(ctx, "charge"), Pad: strings.Repeat("x", j.Args.Big)}, nil
		})
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.keys[j.ID] = append(s.keys[j.ID], r.Key)
		s.mu.Unlock()
		if err := s.fail(j.Attempt); err != nil {
			return err
		}
		_, err = handler.Step(ctx, "mark", func(ctx context.Context) (bool, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.marks[j.ID]++
			return true, nil
		})
		return err
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	s.h = e.Handler(t, reg, &handler.Options{Logger: quiet})
	return s
}

func (s *stepsEnv) enqueue(t *testing.T, args stepped) string {
	t.Helper()
	res, err := s.e.Client.Enqueue(context.Background(), args, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// drain runs everything, moving the kit's clock over each retry's backoff.
func (s *stepsEnv) drain(t *testing.T, id string) ledger.Record {
	t.Helper()
	for range 10 {
		s.e.Drain(t, s.h)
		if rec := s.e.Get(t, id); rec.State.Terminal() {
			return rec
		}
		s.e.RunNow(t, id)
	}
	t.Fatalf("job %s did not end", id)
	return ledger.Record{}
}

func (s *stepsEnv) count(id string) (charges, marks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges[id], s.marks[id]
}

// A run fails after its charge step: the retry gets the recorded receipt
// back and charges nothing; StepKey is the same on both runs.
func TestStepRunsOnceAcrossRetries(t *testing.T) {
	t.Parallel()
	s := newSteps(t)
	s.fail = func(attempt int) error {
		if attempt == 1 {
			return errors.New("the order service is down")
		}
		return nil
	}
	id := s.enqueue(t, stepped{Order: "1001"})
	rec := s.drain(t, id)
	charges, marks := s.count(id)
	if rec.State != ledger.Succeeded || rec.Attempt != 2 || charges != 1 || marks != 1 {
		t.Fatalf("job %s after %d attempts, %d charges and %d marks; want Succeeded after 2, one each", rec.State, rec.Attempt, charges, marks)
	}
	s.mu.Lock()
	keys := s.keys[id]
	s.mu.Unlock()
	if len(keys) != 2 || keys[0] != keys[1] || keys[0] == "" {
		t.Fatalf("StepKey per run: %q, want one key twice", keys)
	}
	if got := rec.Steps["charge"]; !strings.Contains(got, `"ch_1001"`) || rec.Steps["mark"] != "true" {
		t.Fatalf("recorded steps %v", rec.Steps)
	}
	other := s.enqueue(t, stepped{Order: "1002"})
	s.drain(t, other)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[other][0] == keys[0] {
		t.Fatal("two jobs got one StepKey")
	}
}

// The step's write is applied and its reply lost: it reads as done (one
// charge, one run). Throttled past the SDK's retries, the run fails and
// the retry charges again: the result was never recorded.
func TestStepUnderFaults(t *testing.T) {
	t.Parallel()
	isStep := func(body []byte) bool {
		return strings.Contains(string(body), `"steps"`) && strings.Contains(string(body), `"charge"`)
	}
	for _, c := range []struct {
		name              string
		rule              faults.Rule
		attempts, charges int
	}{
		{"lost reply", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isStep, Fault: faults.LostReply}, 1, 1},
		{"timeout", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isStep, Fault: faults.Timeout}, 1, 1},
		{"throttled past the retries", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isStep, Fault: faults.Throttle, Times: faults.Attempts}, 2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSteps(t)
			fault := s.ft.Add(c.rule)
			id := s.enqueue(t, stepped{Order: "1001"})
			rec := s.drain(t, id)
			charges, marks := s.count(id)
			if fault.Fired() == 0 {
				t.Fatal("the fault never fired")
			}
			if rec.State != ledger.Succeeded || rec.Attempt != c.attempts || charges != c.charges || marks != 1 {
				t.Fatalf("job %s after %d attempts, %d charges, %d marks; want Succeeded after %d, %d charges, one mark",
					rec.State, rec.Attempt, charges, marks, c.attempts, c.charges)
			}
		})
	}
}

// A result over ledger.MaxStepBytes fails the job permanently, with the
// step's name and no result in the error; nothing is recorded.
func TestStepTooLargeFailsTheJob(t *testing.T) {
	t.Parallel()
	s := newSteps(t)
	id := s.enqueue(t, stepped{Order: "secret-order", Big: ledger.MaxStepBytes})
	rec := s.drain(t, id)
	if rec.State != ledger.Failed || rec.Attempt != 1 || len(rec.Steps) != 0 {
		t.Fatalf("job %s after %d attempts with steps %v; want Failed after one, none recorded", rec.State, rec.Attempt, rec.Steps)
	}
	if !strings.Contains(rec.LastError, `step "charge"`) || strings.Contains(rec.LastError, "xxxx") {
		t.Fatalf("error %q: want the step's name and none of its result", rec.LastError)
	}
}

// A run whose claim a newer run took (its lease ran out) is fenced: its
// step is refused and nothing is written.
func TestStepOfAZombieIsFenced(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	id, err := e.Client.Enqueue(context.Background(), stepped{Order: "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := e.Client.Store()
	ctx := context.Background()
	zombie, err := st.Claim(ctx, id.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.Advance(t, 2*time.Minute)
	if _, err := st.Claim(ctx, id.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordStep(ctx, zombie, "charge", `{"chargeId":"ch_1"}`); !errors.Is(err, ledger.ErrFenced) {
		t.Fatalf("the zombie's step: %v, want ErrFenced", err)
	}
	if rec := e.Get(t, id.ID); len(rec.Steps) != 0 {
		t.Fatalf("the zombie's step was written: %v", rec.Steps)
	}
}

// Outside a run there is nothing to record to; a name used twice in one
// run is refused; names and results outside the limits are *StepError.
func TestStepMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := handler.Step(ctx, "x", func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, handler.ErrNotInRun) {
		t.Fatalf("outside a run: %v", err)
	}
	if k := handler.StepKey(ctx, "x"); k != "" {
		t.Fatalf("StepKey outside a run: %q", k)
	}
	e := nexjobtest.New(t, nil)
	var twice error
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[stepped](func(ctx context.Context, j *handler.Job[stepped]) error {
		if _, err := handler.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return err
		}
		_, twice = handler.Step(ctx, "a", func(context.Context) (int, error) { return 2, nil })
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	if _, err := e.Client.Enqueue(ctx, stepped{Order: "1"}, nil); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	if !errors.Is(twice, handler.ErrStepRepeated) {
		t.Fatalf("a name used twice: %v", twice)
	}
	var se *ledger.StepError
	for _, name := range []string{"", strings.Repeat("n", ledger.MaxStepName+1)} {
		if err := ledger.CheckStep(ledger.Record{}, name, "1"); !errors.As(err, &se) {
			t.Fatalf("name of %d bytes: %v", len(name), err)
		}
	}
	full := ledger.Record{Steps: map[string]string{}}
	for i := range ledger.MaxSteps {
		full.Steps[strings.Repeat("s", i+1)] = "1"
	}
	if err := ledger.CheckStep(full, "one-more", "1"); !errors.As(err, &se) {
		t.Fatalf("step %d: %v", ledger.MaxSteps+1, err)
	}
}

// The requests of a run with steps, pinned: recording a step is one
// UpdateItem; a run that replays recorded steps makes no request for
// them (they came with its claim).
func TestStepCosts(t *testing.T) {
	t.Parallel()
	s := newSteps(t)
	s.fail = func(attempt int) error {
		if attempt == 1 {
			return &handler.RetryAfterError{Delay: time.Hour, Err: errors.New("fail after the charge")}
		}
		return nil
	}
	id := s.enqueue(t, stepped{Order: "1"})
	s.counter.Reset()
	s.e.DrainNow(t, s.h) // the first run: claim, the charge step, the failure's finish, the retry's send (Drain would follow the retry)
	first, firstUnits := dynamoCalls(s.counter.Counter), s.counter.Units()
	s.e.RunNow(t, id)
	s.counter.Reset()
	s.e.Drain(t, s.h) // the retry: claim, the charge replayed, the mark step, finish
	second, secondUnits := dynamoCalls(s.counter.Counter), s.counter.Units()
	t.Logf("a run with one new step: %v; %v", first, firstUnits)
	t.Logf("a run replaying one step and recording one: %v; %v", second, secondUnits)
	want1 := []string{"DynamoDB.UpdateItem", "DynamoDB.UpdateItem", "DynamoDB.UpdateItem"}
	if strings.Join(first, " ") != strings.Join(want1, " ") {
		t.Errorf("a run with one new step: %v, want %v (claim, step, finish)", first, want1)
	}
	if strings.Join(second, " ") != strings.Join(want1, " ") {
		t.Errorf("a run replaying one step and recording one: %v, want %v (claim, the new step, finish)", second, want1)
	}
	// Units (docs/costs.md): each run's claim, step and finish, 1 write
	// unit each for this small record; the first run's retry puts the job
	// in the index, the second's claim takes it out. Sends are not
	// compared: the kit's one-second hops re-send the retry's message
	// whenever it comes due before Drain returns.
	firstUnits.Sends, secondUnits.Sends = 0, 0
	if want := (awstest.Units{Write: 3, Index: 1}); firstUnits != want || secondUnits != want {
		t.Errorf("units: a run with one new step %v, one replaying a step and recording one %v; want %v each", firstUnits, secondUnits, want)
	}
	if rec := s.e.Get(t, id); rec.State != ledger.Succeeded {
		t.Fatalf("job %s", rec.State)
	}
}

// dynamoCalls are the DynamoDB requests among the counted ones, without
// the kit's own reads (Drain's Scan).
func dynamoCalls(c *awstest.Counter) []string {
	var out []string
	for _, call := range c.Calls() {
		if strings.HasPrefix(call, "DynamoDB.") && call != "DynamoDB.Scan" {
			out = append(out, call)
		}
	}
	return out
}

// Requeue keeps a job's recorded steps (its next run replays them);
// RequeueFresh drops them (its next run calls them again). RequeueFresh
// of an active job is refused and writes nothing.
func TestRequeueKeepsStepsAndFreshDropsThem(t *testing.T) {
	t.Parallel()
	s := newSteps(t)
	s.fail = func(int) error { return handler.Permanent(errors.New("the order is gone")) }
	id := s.enqueue(t, stepped{Order: "1"})
	if rec := s.drain(t, id); rec.State != ledger.Failed {
		t.Fatalf("job %s", rec.State)
	}
	ctx := context.Background()
	if _, err := s.e.Client.Requeue(ctx, id); err != nil {
		t.Fatal(err)
	}
	s.drain(t, id)
	if charges, _ := s.count(id); charges != 1 {
		t.Fatalf("after Requeue: %d charges, want 1 (the step replayed)", charges)
	}
	if _, err := s.e.Client.RequeueFresh(ctx, id); err != nil {
		t.Fatal(err)
	}
	if rec := s.e.Get(t, id); rec.State != ledger.Enqueued || len(rec.Steps) != 0 {
		t.Fatalf("after RequeueFresh: %s with steps %v, want Enqueued with none", rec.State, rec.Steps)
	}
	s.drain(t, id)
	if charges, _ := s.count(id); charges != 2 {
		t.Fatalf("after RequeueFresh: %d charges, want 2 (the step called again)", charges)
	}
	active := s.enqueue(t, stepped{Order: "2"})
	var nt *enqueue.NotTerminalError
	if _, err := s.e.Client.RequeueFresh(ctx, active); !errors.As(err, &nt) {
		t.Fatalf("RequeueFresh of an Enqueued job: %v, want *NotTerminalError", err)
	}
}

// napper steps, sleeps for its Days, and steps again.
type napper struct {
	Days int `json:"days"`
}

func (napper) Kind() string { return "napper" }

// A sleep of 30 days and of a year, in the kit's time: the run that meets
// it ends at once with no attempt spent, the job waits Scheduled for its
// time, and the next run replays the step before the sleep and goes on.
// Both sleeps cost the same requests: the sleep's step, the run's end and
// one send.
func TestSleepCostsTheSameForAMonthAndAYear(t *testing.T) {
	t.Parallel()
	var calls [2][]string
	var units, woken [2]awstest.Units
	for i, days := range []int{30, 365} {
		e := nexjobtest.New(t, &nexjobtest.Options{StepsOnRecord: true}) // the record's layout: its writes pinned below
		cfg := e.Cfg
		counter := awstest.NewMeter(&cfg, e.DB)
		e.Cfg = cfg
		var mu sync.Mutex
		before, after := 0, 0
		reg := handler.NewRegistry()
		handler.AddWorker(reg, handler.WorkFunc[napper](func(ctx context.Context, j *handler.Job[napper]) error {
			if _, err := handler.Step(ctx, "before", func(context.Context) (int, error) { mu.Lock(); before++; mu.Unlock(); return 1, nil }); err != nil {
				return err
			}
			if err := handler.Sleep(ctx, "nap", time.Duration(j.Args.Days)*24*time.Hour); err != nil {
				return err
			}
			mu.Lock()
			after++
			mu.Unlock()
			return nil
		}), nil)
		h := e.Handler(t, reg, &handler.Options{Logger: quiet})
		res, err := e.Client.Enqueue(context.Background(), napper{Days: days}, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := e.Now()
		// The run alone, counted: its message handed to the handler as
		// one invocation (a Drain would also count the sleep's one-second
		// hop when the loaded machine let it come due first).
		msgs := e.Messages(t, e.QueueURL)
		counter.Reset()
		resp, err := h.Handle(context.Background(), poller.Event(e.QueueURL, msgs))
		if err != nil || len(msgs) != 1 || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("the run: %d messages, %+v %v", len(msgs), resp, err)
		}
		for _, c := range counter.Calls() {
			if c != "DynamoDB.Scan" {
				calls[i] = append(calls[i], c)
			}
		}
		units[i] = counter.Units()
		t.Logf("the run that meets a %d-day sleep: %v; %v", days, calls[i], units[i])
		if _, err := e.SQS.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(e.QueueURL), ReceiptHandle: msgs[0].ReceiptHandle}); err != nil {
			t.Fatal(err)
		}
		rec := e.Get(t, res.ID)
		wake := start.Add(time.Duration(days) * 24 * time.Hour)
		if rec.State != ledger.Scheduled || rec.Attempt != 0 || ledger.Millis(rec.RunAt).Before(wake) || ledger.Millis(rec.RunAt).After(wake.Add(time.Minute)) {
			t.Fatalf("%d days: the sleeping job is %s, attempt %d, run at %v; want Scheduled, attempt 0, at %v", days, rec.State, rec.Attempt, ledger.Millis(rec.RunAt), wake)
		}
		e.Advance(t, time.Duration(days-1)*24*time.Hour)
		e.Drain(t, h) // a day early: still asleep (its message hops)
		if rec := e.Get(t, res.ID); rec.State != ledger.Scheduled || after != 0 {
			t.Fatalf("%d days, a day early: %s after %d runs past the sleep", days, rec.State, after)
		}
		e.RunNow(t, res.ID)
		counter.Reset()
		e.Drain(t, h)
		woken[i] = counter.Units()
		woken[i].Read, woken[i].Sends = 0, 0 // the kit's hops and reads, not the run's
		rec = e.Get(t, res.ID)
		mu.Lock()
		if rec.State != ledger.Succeeded || rec.Attempt != 1 || before != 1 || after != 1 {
			t.Fatalf("%d days: %s after %d attempts, the step before the sleep run %d times, the rest %d; want Succeeded after one, once each", days, rec.State, rec.Attempt, before, after)
		}
		mu.Unlock()
	}
	want := []string{"DynamoDB.UpdateItem", "DynamoDB.UpdateItem", "DynamoDB.UpdateItem", "DynamoDB.UpdateItem", "SQS.SendMessage"}
	for i, days := range []int{30, 365} {
		if strings.Join(calls[i], " ") != strings.Join(want, " ") {
			t.Errorf("the run that meets a %d-day sleep: %v, want %v (claim, the step before, the sleep's step, its end, its send)", days, calls[i], want)
		}
		// Units (docs/costs.md): 1 write unit each for this small record,
		// the job Scheduled while it sleeps (an index entry).
		if wantUnits := (awstest.Units{Write: 4, Index: 1, Sends: 1}); units[i] != wantUnits {
			t.Errorf("the run that meets a %d-day sleep: %v, want %v", days, units[i], wantUnits)
		}
		// The woken run: its claim (the Scheduled entry left) and its end.
		// So the sleep itself is its step, the end that sleeps and the
		// woken run's claim: 3 write units + 2 index and one send, the
		// figure docs/durable-jobs.md gives.
		if wantUnits := (awstest.Units{Write: 2, Index: 1}); woken[i] != wantUnits {
			t.Errorf("the run woken from a %d-day sleep: %v, want %v", days, woken[i], wantUnits)
		}
		t.Logf("the run woken from a %d-day sleep: %v", days, woken[i])
	}
}

// Cancel of a running job asks it to stop: its next step's record is
// refused and the run fails for good with the reason; the steps after it
// never run.
func TestCancelStopsARunningJobAtItsNextStep(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	inStep, release := make(chan struct{}), make(chan struct{})
	var after atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[stepped](func(ctx context.Context, j *handler.Job[stepped]) error {
		if _, err := handler.Step(ctx, "a", func(context.Context) (int, error) { close(inStep); <-release; return 1, nil }); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "b", func(context.Context) (int, error) { after.Add(1); return 2, nil })
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, stepped{Order: "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); e.Drain(t, h) }()
	<-inStep
	var asked *enqueue.CancelRequestedError
	if _, err := e.Client.Cancel(ctx, res.ID, "the order was withdrawn", time.Hour); !errors.As(err, &asked) {
		t.Fatalf("Cancel of a running job: %v, want *CancelRequestedError", err)
	}
	// With the steps off the record, the run reads its record for a cancel
	// at a step when it has not for ledger.CancelLook.
	e.Advance(t, ledger.CancelLook)
	close(release)
	<-done
	rec := e.Get(t, res.ID)
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "cancelled by an operator while running") || after.Load() != 0 || len(rec.Steps) != 0 {
		t.Fatalf("the cancelled run: %s (%q), step b ran %d times, steps %v; want Failed with the cancel, b never, nothing recorded", rec.State, rec.LastError, after.Load(), rec.Steps)
	}
}
