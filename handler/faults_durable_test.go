package handler_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Fault tests of five conditional writes of durable jobs: a step's record
// meeting a signal (RecordStep's re-read), the requeue's reopening of
// timed-out waits (ReopenTimedOutWaits), a wait for any's timeout
// (RecordTimeouts), a step retry's failure record (StepWith) and a
// callback token's nonce (CallbackToken). Each write, (a) applied with its
// reply lost, is resent by the SDK and must read as the success it was,
// nothing done twice, no attempt spent, no warning (also with three
// signals landing before the resend: the write's nonce is then out of the
// record's three, and the write's own check of its effect decides); (b) throttled past the SDK's retries, fails the run
// cleanly, and a later run completes the job, each step's function called
// once (but the one whose record failed: Step's documented at-least-once,
// with one StepKey). The handler's DynamoDB requests go through the fault
// transport; the test's own Client's do not.

type fdJob struct{}

func (fdJob) Kind() string { return "fault-durable" }

// fdRig is an Env whose handler's DynamoDB client goes through ft, and
// what the runs did: calls of each step's fn, the StepKeys they were
// called with, and what each run saw.
type fdRig struct {
	e  *nexjobtest.Env
	ft *faults.Transport
	h  *handler.Handler
	mu sync.Mutex
	// calls of a step's fn by "job/step", and their StepKeys.
	calls map[string]int
	keys  map[string][]string
	// saw is what each run of a job saw at its end (an approver, a
	// timeout), in order; tokens the callback tokens the runs handed out.
	saw, tokens map[string][]string
	// logs are the handler's warnings and errors.
	logs fdLogs
}

// fdLogs is a log's text, written by the handler's goroutines.
type fdLogs struct {
	mu sync.Mutex
	b  []byte
}

func (l *fdLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *fdLogs) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = nil
}

func (l *fdLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

func newFDRig(t *testing.T, o *nexjobtest.Options, work func(r *fdRig, ctx context.Context, j *handler.Job[fdJob]) error) *fdRig {
	t.Helper()
	r := &fdRig{e: nexjobtest.New(t, o), ft: faults.New(nil), calls: map[string]int{}, keys: map[string][]string{},
		saw: map[string][]string{}, tokens: map[string][]string{}}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[fdJob](func(ctx context.Context, j *handler.Job[fdJob]) error {
		return work(r, ctx, j)
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	lg := slog.New(slog.NewTextHandler(&r.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: lg, DynamoDB: dynamodb.NewFromConfig(faults.Config(r.e.Cfg, r.ft))})
	return r
}

// land sends job id the signals names (the test's Client: no fault), and
// returns their errors. Landing between a write applied and the SDK's
// resend of it, three writes shift its nonce out of the three the record
// keeps (Record.Wrote): only the write's own recognition of its effect
// can tell the resend's failed condition from another's write.
func (r *fdRig) land(id string, names ...string) error {
	var errs []error
	for _, n := range names {
		errs = append(errs, r.e.Client.Signal(context.Background(), id, n, approval{By: n}))
	}
	return errors.Join(errs...)
}

// quietRun fails the test when the handler warned: a resend that read as
// the success it was leaves nothing to warn about (a run put off, a wake
// failed).
func (r *fdRig) quietRun(t *testing.T) {
	t.Helper()
	if l := r.logs.String(); l != "" {
		t.Fatalf("the handler warned:\n%s", l)
	}
}

// step is a Step whose fn counts its call (the side effect) with its
// StepKey.
func (r *fdRig) step(ctx context.Context, id, name string) error {
	_, err := handler.Step(ctx, name, func(ctx context.Context) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls[id+"/"+name]++
		r.keys[id+"/"+name] = append(r.keys[id+"/"+name], handler.StepKey(ctx, name))
		return true, nil
	})
	return err
}

func (r *fdRig) note(m map[string][]string, id, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m[id] = append(m[id], what)
}

func (r *fdRig) count(id, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[id+"/"+name]
}

func (r *fdRig) seen(m map[string][]string, id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(m[id])
}

func (r *fdRig) enqueue(t *testing.T) string {
	t.Helper()
	return enqueueOne(t, r.e.Client, fdJob{}, nil)
}

// has is a Match for requests whose body holds every one of parts.
func has(parts ...string) func([]byte) bool {
	return func(body []byte) bool {
		for _, p := range parts {
			if !bytes.Contains(body, []byte(p)) {
				return false
			}
		}
		return true
	}
}

// fdFaults are the faults each write is put through: its reply lost
// (with nothing between the write and its resend, or three signals of
// other names landing between), and throttled past the SDK's retries.
var fdFaults = []struct {
	name    string
	fault   faults.Fault
	times   int
	between []string // signals that land between the write and its resend
}{
	{"reply lost", faults.LostReply, 1, nil},
	{"reply lost, three signals land before the resend", faults.LostReply, 1, []string{"memo1", "memo2", "memo3"}},
	{"throttled past the retries", faults.Throttle, faults.Attempts, nil},
}

// TestStepRecordUnderFaultsWithASignalBetween: a step's record
// (RecordStep, conditional on the steps' count the run last saw) meets a
// signal landing between. Its reply lost with the signal landing before
// the SDK's resend (alone, or with two others: the write's nonce shifted
// out, RecordStep's own check decides), or the signal landing before the
// write (the re-read) and the rewrite's reply lost: the resend reads as
// the step recorded, the step's fn called once, the job done in its
// first attempt with the signal as the wait's payload. Throttled past
// the retries, with the signal landing meanwhile: the run fails with an
// attempt spent, and the next run calls the unrecorded step again with
// the same StepKey, the step before it once, and takes the signal.
func TestStepRecordUnderFaultsWithASignalBetween(t *testing.T) {
	t.Parallel()
	isCharge := has(`"charge"`)
	const (
		lost    = "reply lost, the signal lands before the resend"
		shifted = "reply lost, the signal and two others land before the resend"
		reread  = "the signal lands first, the re-read write's reply lost"
		thrott  = "throttled past the retries, the signal lands meanwhile"
	)
	for _, c := range []string{lost, shifted, reread, thrott} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			r := newFDRig(t, &nexjobtest.Options{StepsOnRecord: true}, func(r *fdRig, ctx context.Context, j *handler.Job[fdJob]) error {
				if err := r.step(ctx, j.ID, "prepare"); err != nil {
					return err
				}
				if err := r.step(ctx, j.ID, "charge"); err != nil {
					return err
				}
				a, err := handler.WaitForSignal[approval](ctx, "approval", time.Hour)
				if err != nil {
					return err
				}
				r.note(r.saw, j.ID, a.By)
				return nil
			})
			id := r.enqueue(t)
			var once sync.Once
			var sigErr error
			var others []string
			if c == shifted {
				others = []string{"memo1", "memo2"}
			}
			signal := func(*http.Request, []byte) {
				once.Do(func() {
					sigErr = errors.Join(r.e.Client.Signal(context.Background(), id, "approval", approval{By: "ada"}), r.land(id, others...))
				})
			}
			var fired []faults.Handle
			throttled := c == thrott
			switch c {
			case lost, shifted:
				fired = append(fired, r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isCharge, Fault: faults.LostReply, After: func() { signal(nil, nil) }}))
			case reread:
				fired = append(fired, r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isCharge, Fault: faults.Pass, Before: signal}),
					r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isCharge, Fault: faults.LostReply}))
			default:
				fired = append(fired, r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isCharge, Fault: faults.Throttle, Times: faults.Attempts, Before: signal}))
			}
			r.e.DrainNow(t, r.h)
			for i, f := range fired {
				if f.Fired() == 0 {
					t.Fatalf("fault %d never fired", i)
				}
			}
			if sigErr != nil {
				t.Fatalf("the signal: %v", sigErr)
			}
			if throttled {
				rec := r.e.Get(t, id)
				if rec.State != ledger.Scheduled || rec.Attempt != 1 || rec.LastError == "" || rec.Steps["charge"] != "" || r.count(id, "charge") != 1 {
					t.Fatalf("the run whose step's record was throttled: %s at attempt %d (%q), charge recorded %q, called %d times; want it failed, Scheduled for its retry, nothing recorded",
						rec.State, rec.Attempt, rec.LastError, rec.Steps["charge"], r.count(id, "charge"))
				}
			}
			r.e.Drain(t, r.h)
			rec := r.e.Get(t, id)
			wantAttempt, wantCharges := 1, 1
			if throttled {
				wantAttempt, wantCharges = 2, 2 // the step whose record failed is called again (Step: at least once)
			}
			if rec.State != ledger.Succeeded || rec.Attempt != wantAttempt || !slices.Equal(r.seen(r.saw, id), []string{"ada"}) {
				t.Fatalf("job %s at attempt %d (%q), runs saw %q; want Succeeded at attempt %d, approved by ada once", rec.State, rec.Attempt, rec.LastError, r.seen(r.saw, id), wantAttempt)
			}
			keys := r.seen(r.keys, id+"/charge")
			if p, ch := r.count(id, "prepare"), r.count(id, "charge"); p != 1 || ch != wantCharges || len(slices.Compact(keys)) != 1 {
				t.Fatalf("prepare called %d times, charge %d times with keys %q; want 1, %d, one key", p, ch, keys, wantCharges)
			}
			if rec.Steps["charge"] != "true" || rec.Steps[ledger.SignalStep("approval")] != `{"by":"ada"}` {
				t.Fatalf("the record's steps: %q", rec.Steps)
			}
			if !throttled {
				r.quietRun(t)
			}
		})
	}
}

// TestReopenTimedOutWaitsUnderFaults: a requeued job whose wait timed out
// (admin Requeue marks it reopenWaits) has its waits opened again by its
// run (ReopenTimedOutWaits). Its reply lost: the resend reads as the
// waits opened, and the run waits afresh. Throttled past the retries:
// the run is put off with no attempt spent and its mark kept, and the
// next delivery opens them. Either way the late approver's signal is
// taken, the step before the wait called once in all.
func TestReopenTimedOutWaitsUnderFaults(t *testing.T) {
	t.Parallel()
	for _, c := range fdFaults {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newFDRig(t, nil, func(r *fdRig, ctx context.Context, j *handler.Job[fdJob]) error {
				if err := r.step(ctx, j.ID, "before"); err != nil {
					return err
				}
				a, err := handler.WaitForSignal[approval](ctx, "approval", time.Hour)
				var timeout *handler.SignalTimeoutError
				if errors.As(err, &timeout) {
					r.note(r.saw, j.ID, "timeout")
					return handler.Permanent(err)
				}
				if err != nil {
					return err
				}
				r.note(r.saw, j.ID, a.By)
				return nil
			})
			id := r.enqueue(t)
			r.e.Drain(t, r.h)
			r.e.Advance(t, time.Hour+time.Minute)
			r.e.Drain(t, r.h)
			if rec := r.e.Get(t, id); rec.State != ledger.Failed {
				t.Fatalf("after the wait's timeout: %s", rec.State)
			}
			ctx := context.Background()
			if _, err := r.e.Client.Requeue(ctx, id); err != nil {
				t.Fatal(err)
			}
			r.logs.reset() // the timeout's run warned of its permanent failure
			var landErr error
			f := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: has(`"reopenWaits"`, ledger.WaitStep("approval")), Fault: c.fault, Times: c.times,
				After: func() { landErr = r.land(id, c.between...) }})
			if c.fault == faults.Throttle {
				r.e.DrainNow(t, r.h)
				if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || !rec.ReopenWaits || rec.Steps[ledger.SignalStep("approval")] != ledger.TimedOut {
					t.Fatalf("the run whose reopening was throttled: %s, mark %v, slot %q; want put off with its mark and the waits as they were", rec.State, rec.ReopenWaits, rec.Steps[ledger.SignalStep("approval")])
				}
			}
			r.e.Drain(t, r.h)
			if f.Fired() != c.times || landErr != nil {
				t.Fatalf("the fault fired %d times, want %d; signals between: %v", f.Fired(), c.times, landErr)
			}
			if c.fault == faults.LostReply {
				r.quietRun(t) // not put off: the resend read as the waits opened
			}
			rec := r.e.Get(t, id)
			if _, slot := rec.Steps[ledger.SignalStep("approval")]; rec.State != ledger.Scheduled || rec.ReopenWaits || slot || rec.Steps[ledger.WaitStep("approval")] == "" {
				t.Fatalf("the requeued job: %s (%q), mark %v, steps %q; want it waiting afresh, its mark removed", rec.State, rec.LastError, rec.ReopenWaits, rec.Steps)
			}
			if err := r.e.Client.Signal(ctx, id, "approval", approval{By: "late approver"}); err != nil {
				t.Fatalf("the late approver's signal: %v", err)
			}
			r.e.Drain(t, r.h)
			rec = r.e.Get(t, id)
			if rec.State != ledger.Succeeded || !slices.Equal(r.seen(r.saw, id), []string{"timeout", "late approver"}) || r.count(id, "before") != 1 {
				t.Fatalf("job %s (%q), runs saw %q, the step before called %d times; want Succeeded by the late approver, the step once", rec.State, rec.LastError, r.seen(r.saw, id), r.count(id, "before"))
			}
		})
	}
}

// TestRecordTimeoutsUnderFaults: a wait for any of two signals meets its
// timeout, decided in one write of both slots (RecordTimeouts). Its reply
// lost, with a signal sent before the resend (refused: the slot decided):
// the resend reads as the timeout recorded. Throttled past the retries:
// the run fails with an attempt spent, and the retry records the timeout.
// Either way one run sees the timeout, the step before the wait called
// once, and a signal afterwards is refused as too late.
func TestRecordTimeoutsUnderFaults(t *testing.T) {
	t.Parallel()
	names := []string{"approved", "rejected"}
	for _, c := range fdFaults {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newFDRig(t, nil, func(r *fdRig, ctx context.Context, j *handler.Job[fdJob]) error {
				if err := r.step(ctx, j.ID, "before"); err != nil {
					return err
				}
				got, err := handler.WaitForAny(ctx, names, time.Hour)
				var timeout *handler.SignalTimeoutError
				switch {
				case errors.As(err, &timeout):
					r.note(r.saw, j.ID, "timed out")
				case err != nil:
					return err
				default:
					r.note(r.saw, j.ID, got.Name)
				}
				return nil
			})
			id := r.enqueue(t)
			r.e.Drain(t, r.h)
			if rec := r.e.Get(t, id); rec.State != ledger.Scheduled {
				t.Fatalf("the job in its wait: %s", rec.State)
			}
			r.e.Advance(t, time.Hour+time.Minute)
			ctx := context.Background()
			var between, landErr error
			rule := faults.Rule{Op: "DynamoDB.UpdateItem", Match: has(ledger.SignalStep("approved"), ledger.SignalStep("rejected"), "timed out"), Fault: c.fault, Times: c.times}
			if c.fault == faults.LostReply {
				rule.After = func() {
					between = r.e.Client.Signal(ctx, id, "approved", approval{By: "ada"})
					landErr = r.land(id, c.between...)
				}
			}
			f := r.ft.Add(rule)
			if c.fault == faults.Throttle {
				r.e.DrainNow(t, r.h)
				if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || rec.Attempt != 1 || rec.LastError == "" || rec.Steps[ledger.SignalStep("approved")] != "" {
					t.Fatalf("the run whose timeout's record was throttled: %s at attempt %d (%q), slot %q; want it failed, Scheduled for its retry, nothing recorded",
						rec.State, rec.Attempt, rec.LastError, rec.Steps[ledger.SignalStep("approved")])
				}
			}
			r.e.Drain(t, r.h)
			if f.Fired() != c.times {
				t.Fatalf("the fault fired %d times, want %d", f.Fired(), c.times)
			}
			if c.fault == faults.LostReply && (!errors.Is(between, ledger.ErrSignalTooLate) || landErr != nil) {
				t.Fatalf("a signal after the timeout's write, before its resend: %v, want ErrSignalTooLate; signals of other names: %v", between, landErr)
			}
			if c.fault == faults.LostReply {
				r.quietRun(t)
			}
			want := 1
			if c.fault == faults.Throttle {
				want = 2
			}
			rec := r.e.Get(t, id)
			if rec.State != ledger.Succeeded || rec.Attempt != want || !slices.Equal(r.seen(r.saw, id), []string{"timed out"}) || r.count(id, "before") != 1 {
				t.Fatalf("job %s at attempt %d (%q), runs saw %q, the step before called %d times; want Succeeded at attempt %d, one timeout, the step once",
					rec.State, rec.Attempt, rec.LastError, r.seen(r.saw, id), r.count(id, "before"), want)
			}
			for _, n := range names {
				if rec.Steps[ledger.SignalStep(n)] != ledger.TimedOut {
					t.Fatalf("signal %q's slot: %q, want the timeout", n, rec.Steps[ledger.SignalStep(n)])
				}
			}
			if err := r.e.Client.Signal(ctx, id, "rejected", approval{By: "bo"}); !errors.Is(err, ledger.ErrSignalTooLate) && !errors.Is(err, ledger.ErrJobEnded) {
				t.Fatalf("a signal after the timeout: %v, want refused", err)
			}
		})
	}
}

// TestStepRetryFailureRecordUnderFaults: a step under a retry policy
// fails its first call, and the failure is recorded (a step named
// nexjob:try:…) before the retry. That record's reply lost: the resend
// reads as recorded, the retry succeeds in the same run, one failure on
// the record. Throttled past the retries: the run fails with an attempt
// spent, nothing recorded, and the next attempt's call succeeds. Either
// way the step's fn is called twice (one failure, one success: its side
// effect once) and the step before it once.
func TestStepRetryFailureRecordUnderFaults(t *testing.T) {
	t.Parallel()
	for _, c := range fdFaults {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newFDRig(t, &nexjobtest.Options{StepsOnRecord: true}, func(r *fdRig, ctx context.Context, j *handler.Job[fdJob]) error {
				if err := r.step(ctx, j.ID, "before"); err != nil {
					return err
				}
				o := &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Millisecond }}
				got, err := handler.StepWith(ctx, "charge", o, func(context.Context) (string, error) {
					r.mu.Lock()
					r.calls[j.ID+"/charge"]++
					n := r.calls[j.ID+"/charge"]
					r.mu.Unlock()
					if n == 1 {
						return "", errors.New("the provider timed out")
					}
					r.note(r.saw, j.ID, "charged")
					return "ch_1", nil
				})
				if err != nil {
					return err
				}
				if got != "ch_1" {
					return handler.Permanent(errors.New("charge: " + got))
				}
				return nil
			})
			id := r.enqueue(t)
			var landErr error
			f := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: has("nexjob:try:"), Fault: c.fault, Times: c.times,
				After: func() { landErr = r.land(id, c.between...) }})
			r.e.DrainNow(t, r.h)
			if f.Fired() != c.times || landErr != nil {
				t.Fatalf("the fault fired %d times, want %d; signals between: %v", f.Fired(), c.times, landErr)
			}
			want, wantTries := 1, 1
			if c.fault == faults.Throttle {
				want, wantTries = 2, 0 // the first attempt's failure never recorded; the second's call succeeds
				if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || rec.Attempt != 1 || rec.LastError == "" || tries(rec) != 0 || r.count(id, "charge") != 1 {
					t.Fatalf("the run whose failure record was throttled: %s at attempt %d (%q), %d failures recorded, %d calls; want it failed, Scheduled for its retry, nothing recorded, 1 call",
						rec.State, rec.Attempt, rec.LastError, tries(rec), r.count(id, "charge"))
				}
			}
			r.e.Drain(t, r.h)
			rec := r.e.Get(t, id)
			if rec.State != ledger.Succeeded || rec.Attempt != want || tries(rec) != wantTries || rec.Steps["charge"] != `"ch_1"` {
				t.Fatalf("job %s at attempt %d (%q), %d failures recorded, charge %q; want Succeeded at attempt %d, %d recorded", rec.State, rec.Attempt, rec.LastError, tries(rec), rec.Steps["charge"], want, wantTries)
			}
			if n, saw, b := r.count(id, "charge"), r.seen(r.saw, id), r.count(id, "before"); n != 2 || len(saw) != 1 || b != 1 {
				t.Fatalf("charge called %d times, charged %d times, the step before called %d times; want 2, 1, 1", n, len(saw), b)
			}
			if c.fault == faults.LostReply {
				r.quietRun(t)
			}
		})
	}
}

// TestCallbackTokenNonceUnderFaults: a callback token's nonce is recorded
// as the step nexjob:token:<name> on its first call. That record's reply
// lost: the resend reads as recorded, and the token the run handed out
// is the one every later run hands out and completes the wait.
// Throttled past the retries: the run fails with an attempt spent, no
// token handed out, and the retry's token completes it. The step before
// called once.
func TestCallbackTokenNonceUnderFaults(t *testing.T) {
	t.Parallel()
	for _, c := range fdFaults {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newFDRig(t, &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("a deployment's secret")}},
				func(r *fdRig, ctx context.Context, j *handler.Job[fdJob]) error {
					if err := r.step(ctx, j.ID, "before"); err != nil {
						return err
					}
					tok, err := handler.CallbackToken(ctx, "bank")
					if err != nil {
						return err
					}
					r.note(r.tokens, j.ID, tok)
					a, err := handler.WaitForSignal[approval](ctx, "bank", time.Hour)
					if err != nil {
						return err
					}
					r.note(r.saw, j.ID, a.By)
					return nil
				})
			id := r.enqueue(t)
			var landErr error
			f := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: has(ledger.TokenStep("bank")), Fault: c.fault, Times: c.times,
				After: func() { landErr = r.land(id, c.between...) }})
			want := 0
			if c.fault == faults.Throttle {
				want = 1
				r.e.DrainNow(t, r.h)
				if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || rec.Attempt != 1 || rec.LastError == "" || rec.Steps[ledger.TokenStep("bank")] != "" || len(r.seen(r.tokens, id)) != 0 {
					t.Fatalf("the run whose nonce's record was throttled: %s at attempt %d (%q), nonce %q, tokens %d; want it failed, Scheduled for its retry, nothing recorded or handed out",
						rec.State, rec.Attempt, rec.LastError, rec.Steps[ledger.TokenStep("bank")], len(r.seen(r.tokens, id)))
				}
			}
			r.e.Drain(t, r.h)
			if f.Fired() != c.times || landErr != nil {
				t.Fatalf("the fault fired %d times, want %d; signals between: %v", f.Fired(), c.times, landErr)
			}
			rec := r.e.Get(t, id)
			tokens := r.seen(r.tokens, id)
			if rec.State != ledger.Scheduled || rec.Attempt != want || len(tokens) != 1 {
				t.Fatalf("the job in its wait: %s at attempt %d (%q), %d tokens handed out; want Scheduled, attempt %d, one token", rec.State, rec.Attempt, rec.LastError, len(tokens), want)
			}
			if err := r.e.Client.Complete(context.Background(), tokens[0], approval{By: "bank"}); err != nil {
				t.Fatalf("the token the run handed out: %v", err)
			}
			r.e.Drain(t, r.h)
			rec, tokens = r.e.Get(t, id), r.seen(r.tokens, id)
			if rec.State != ledger.Succeeded || !slices.Equal(r.seen(r.saw, id), []string{"bank"}) || r.count(id, "before") != 1 {
				t.Fatalf("job %s (%q), runs saw %q, the step before called %d times; want Succeeded by the token, the step once", rec.State, rec.LastError, r.seen(r.saw, id), r.count(id, "before"))
			}
			if len(tokens) != 2 || tokens[0] != tokens[1] {
				t.Fatalf("the runs handed out %d tokens, the same: %v; want the waiting run's and the woken run's, one token", len(tokens), len(tokens) == 2 && tokens[0] == tokens[1])
			}
			if c.fault == faults.LostReply {
				r.quietRun(t)
			}
		})
	}
}
