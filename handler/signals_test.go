package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Signals (issue 29): a job waits for a named signal with a timeout; the
// signal wakes it, or was kept from before the wait.

type reconcile struct {
	Ledger string `json:"ledger"`
}

func (reconcile) Kind() string { return "reconcile" }

type approval struct {
	By string `json:"by"`
}

// signalEnv runs reconcile jobs: a prepare step, a wait for "approval"
// (48 hours), and the approver recorded. meanwhile, if set, runs in the
// first run that begins to wait, before it ends.
type signalEnv struct {
	e         *nexjobtest.Env
	h         *handler.Handler
	counter   *awstest.Meter
	mu        sync.Mutex
	prepared  map[string]int
	approver  map[string]string
	meanwhile func(id string)
	// timedOut, if set, runs in the run that met the wait's timeout (the
	// timeout recorded), before it ends.
	timedOut func(id string)
}

func newSignals(t *testing.T) *signalEnv {
	t.Helper()
	s, _ := newSignalsFaulty(t, false)
	return s
}

// newSignalsFaulty is newSignals whose handler's requests go through a
// fault transport when faulty (returned; nil otherwise).
func newSignalsFaulty(t *testing.T, faulty bool) (*signalEnv, *faults.Transport) {
	t.Helper()
	return newSignalsWith(t, faulty, &nexjobtest.Options{})
}

// newSignalsWith is newSignalsFaulty on a kit env made with o.
func newSignalsWith(t *testing.T, faulty bool, o *nexjobtest.Options) (*signalEnv, *faults.Transport) {
	t.Helper()
	e := nexjobtest.New(t, o)
	s := &signalEnv{e: e, prepared: map[string]int{}, approver: map[string]string{}}
	cfg := e.Cfg
	s.counter = awstest.NewMeter(&cfg, e.DB)
	var ft *faults.Transport
	if faulty {
		ft = faults.New(nil)
		cfg = faults.Config(cfg, ft)
	}
	e.Cfg = cfg
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[reconcile](func(ctx context.Context, j *handler.Job[reconcile]) error {
		if _, err := handler.Step(ctx, "prepare", func(context.Context) (bool, error) {
			s.mu.Lock()
			s.prepared[j.ID]++
			s.mu.Unlock()
			return true, nil
		}); err != nil {
			return err
		}
		a, err := handler.WaitForSignal[approval](ctx, "approval", 48*time.Hour)
		var timeout *handler.SignalTimeoutError
		switch {
		case errors.As(err, &timeout):
			if f := s.timedOut; f != nil {
				f(j.ID)
			}
			return handler.Permanent(err)
		case err != nil:
			if f := s.meanwhile; f != nil {
				s.meanwhile = nil
				f(j.ID)
			}
			return err
		}
		s.mu.Lock()
		s.approver[j.ID] = a.By
		s.mu.Unlock()
		return nil
	}), nil)
	s.h = e.Handler(t, reg, &handler.Options{Logger: quiet})
	return s, ft
}

func (s *signalEnv) enqueue(t *testing.T, key string) string {
	t.Helper()
	var opts *enqueue.Opts
	if key != "" {
		opts = &enqueue.Opts{IdempotencyKey: key}
	}
	res, err := s.e.Client.Enqueue(context.Background(), reconcile{Ledger: "2026-11"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

func (s *signalEnv) seen(id string) (prepared int, by string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prepared[id], s.approver[id]
}

// The job waits, Scheduled with no attempt spent; the signal wakes it with
// no clock moved, and the run replays its step and reads the payload. A
// second signal to the ended job is refused. Requests pinned: the waiting
// run, and the signal that wakes it. The waiting job's message is delayed
// SQS's longest (the kit's one-second hops would add a re-send to the
// count whenever the loaded machine let one come due before the count).
func TestSignalWakesAWaitingJob(t *testing.T) {
	t.Parallel()
	s, _ := newSignalsWith(t, false, &nexjobtest.Options{MaxDelay: 15 * time.Minute, StepsOnRecord: true}) // the record's layout: its writes pinned below
	id := s.enqueue(t, "")
	s.counter.Reset()
	s.e.Drain(t, s.h)
	waiting, waitUnits := dynamoAndSQS(s.counter), s.counter.Units()
	if rec := s.e.Get(t, id); rec.State != ledger.Scheduled || rec.Attempt != 0 {
		t.Fatalf("the waiting job: %s, attempt %d; want Scheduled, attempt 0", rec.State, rec.Attempt)
	}
	ctx := context.Background()
	s.counter.Reset()
	if err := s.h.Producer().Signal(ctx, id, "approval", approval{By: "ada"}); err != nil { // the counted client
		t.Fatal(err)
	}
	signal, signalUnits := dynamoAndSQS(s.counter), s.counter.Units()
	t.Logf("the run that begins to wait: %v; %v", waiting, waitUnits)
	t.Logf("a signal that wakes the job: %v; %v", signal, signalUnits)
	s.e.Drain(t, s.h)
	if prepared, by := s.seen(id); s.e.Get(t, id).State != ledger.Succeeded || prepared != 1 || by != "ada" {
		t.Fatalf("after the signal: %s, prepared %d times, approved by %q", s.e.Get(t, id).State, prepared, by)
	}
	var refused *ledger.SignalRefusedError
	if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "bo"}); !errors.As(err, &refused) || !errors.Is(err, ledger.ErrJobEnded) {
		t.Fatalf("a signal to the ended job: %v, want ErrJobEnded", err)
	}
	wantWait := "DynamoDB.UpdateItem DynamoDB.UpdateItem DynamoDB.UpdateItem DynamoDB.UpdateItem SQS.SendMessage DynamoDB.GetItem"
	if got := strings.Join(waiting, " "); got != wantWait {
		t.Errorf("the run that begins to wait: %s, want %s (claim, the step, the wait's end, the run's end, its send, the read for a signal meanwhile)", got, wantWait)
	}
	if got, want := strings.Join(signal, " "), "DynamoDB.GetItem DynamoDB.UpdateItem DynamoDB.UpdateItem SQS.SendMessage"; got != want {
		t.Errorf("a signal that wakes the job: %s, want %s (the read for the steps' limits, the signal, the wake, the send)", got, want)
	}
	// Units (docs/costs.md): the waiting run's claim, its step, the wait's
	// step and the run's end (Scheduled: an index entry), its consistent
	// read; the signal's consistent read, its write and the wake (the
	// entry removed).
	if want := (awstest.Units{Write: 4, Index: 1, Read: 1, Sends: 1}); waitUnits != want {
		t.Errorf("the run that begins to wait: %v, want %v", waitUnits, want)
	}
	if want := (awstest.Units{Write: 2, Index: 1, Read: 1, Sends: 1}); signalUnits != want {
		t.Errorf("a signal that wakes the job: %v, want %v", signalUnits, want)
	}
}

// A signal sent before the wait is kept: the first run reads it and never
// sleeps. A second signal of the name is refused while the job waits.
// SignalByKey finds the job by its idempotency key.
func TestSignalBeforeTheWaitIsKept(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	id := s.enqueue(t, "reconcile-2026-11")
	ctx := context.Background()
	if err := s.e.Client.SignalByKey(ctx, "reconcile-2026-11", "approval", approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "bo"}); !errors.Is(err, ledger.ErrSignalSent) {
		t.Fatalf("a second signal: %v, want ErrSignalSent", err)
	}
	s.e.Drain(t, s.h)
	if rec := s.e.Get(t, id); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("%s after %d attempts", rec.State, rec.Attempt)
	}
	if _, by := s.seen(id); by != "ada" {
		t.Fatalf("approved by %q, want the first signal's", by)
	}
}

// The run that meets the wait's end records the timeout: a signal then is
// refused (ErrSignalTooLate), and the run gets a *SignalTimeoutError (here
// it fails the job).
func TestSignalAfterTheTimeoutIsRefused(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	var refused error
	s.timedOut = func(id string) {
		refused = s.e.Client.Signal(context.Background(), id, "approval", approval{By: "ada"})
	}
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h)
	s.e.Advance(t, 48*time.Hour+time.Minute)
	s.e.Drain(t, s.h)
	if !errors.Is(refused, ledger.ErrSignalTooLate) {
		t.Fatalf("a signal after the timeout was recorded: %v, want ErrSignalTooLate", refused)
	}
	rec := s.e.Get(t, id)
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, `no signal "approval"`) {
		t.Fatalf("after the timeout: %s (%q), want Failed with the timeout", rec.State, rec.LastError)
	}
	if prepared, by := s.seen(id); prepared != 1 || by != "" {
		t.Fatalf("prepared %d times, approved by %q", prepared, by)
	}
}

// The wait's end passed by the sender's clock, and no run has met it yet:
// the timeout is not recorded, so the signal lands and is the wait's
// payload. No clock but the record decides (a producer's clock two hours
// ahead of the workers' had every signal to a wait of an hour refused).
// Before: "a signal late by the clock, before the timeout's run: nexjob:
// job …: signal "approval" refused: the job's wait for this signal timed
// out".
func TestASignalLateByTheClockLandsUntilTheTimeoutIsRecorded(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h)
	s.e.Advance(t, 48*time.Hour+time.Minute)
	if err := s.e.Client.Signal(context.Background(), id, "approval", approval{By: "ada"}); err != nil {
		t.Fatalf("a signal late by the clock, before the timeout's run: %v", err)
	}
	s.e.Drain(t, s.h)
	if prepared, by := s.seen(id); s.e.Get(t, id).State != ledger.Succeeded || prepared != 1 || by != "ada" {
		t.Fatalf("job %s, prepared %d times, approved by %q; want Succeeded by the signal", s.e.Get(t, id).State, prepared, by)
	}
}

// A producer whose clock runs ahead of the workers' past the wait's end
// signals it: the signal lands (no run recorded the timeout) and wakes the
// job now, by the workers' clock. Before: refused as too late; then, once
// accepted, the job slept on to the wait's end (the wake set its run time
// to the producer's now, and its message was carried forward unread).
func TestASignalFromAClockAheadWakesTheWait(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h)
	ahead, err := enqueue.New(s.e.Cfg, s.e.Table, s.e.QueueURL, &enqueue.ClientOptions{Logger: quiet, MaxDelay: time.Second,
		Ledger: ledger.Options{Now: func() time.Time { return s.e.Now().Add(50 * time.Hour) }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ahead.Signal(context.Background(), id, "approval", approval{By: "ada"}); err != nil {
		t.Fatalf("a signal from a clock 50 h ahead to a wait of 48 h: %v", err)
	}
	s.e.Drain(t, s.h) // no clock moved
	if prepared, by := s.seen(id); s.e.Get(t, id).State != ledger.Succeeded || prepared != 1 || by != "ada" {
		t.Fatalf("job %s, prepared %d times, approved by %q; want woken and Succeeded by the signal", s.e.Get(t, id).State, prepared, by)
	}
}

// The signal comes while the run that begins to wait is ending (the job
// is Processing: the signal wakes no one): the run, once its wait is
// recorded, finds the signal and wakes the job. No clock moved.
func TestSignalWhileTheWaitBegins(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	s.meanwhile = func(id string) {
		if err := s.e.Client.Signal(context.Background(), id, "approval", approval{By: "ada"}); err != nil {
			t.Error(err)
		}
	}
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h)
	if rec := s.e.Get(t, id); rec.State != ledger.Succeeded {
		t.Fatalf("the job signalled as its wait began: %s, want Succeeded (woken)", rec.State)
	}
	if _, by := s.seen(id); by != "ada" {
		t.Fatalf("approved by %q", by)
	}
}

func dynamoAndSQS(c *awstest.Meter) []string {
	var out []string
	for _, call := range c.Calls() {
		if call != "DynamoDB.Scan" && !strings.HasPrefix(call, "SQS.GetQueue") {
			out = append(out, call)
		}
	}
	return out
}

// Cancel ends a job asleep in its wait as it ends any Scheduled job: it
// never runs again, and a signal then is refused (ErrJobEnded).
func TestCancelAWaitingJob(t *testing.T) {
	t.Parallel()
	s := newSignals(t)
	id := s.enqueue(t, "")
	s.e.Drain(t, s.h)
	ctx := context.Background()
	if _, err := s.e.Client.Cancel(ctx, id, "", 7*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.e.Client.Signal(ctx, id, "approval", approval{By: "ada"}); !errors.Is(err, ledger.ErrJobEnded) {
		t.Fatalf("a signal to the cancelled job: %v, want ErrJobEnded", err)
	}
	s.e.Advance(t, 49*time.Hour) // past the wait's end: its message comes and is dropped
	s.e.Drain(t, s.h)
	rec := s.e.Get(t, id)
	if prepared, by := s.seen(id); rec.State != ledger.Failed || !rec.Cancelled || prepared != 1 || by != "" {
		t.Fatalf("the cancelled job: %s (cancelled %v), prepared %d times, approved by %q", rec.State, rec.Cancelled, prepared, by)
	}
}

// Callback tokens: a worker hands another system a token for its wait;
// the token completes it once. A forged or altered token, a reused one
// and an expired one are refused with nothing written; a deployment with
// no key secret makes none.
func TestCallbackTokens(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("a deployment's secret")}})
	tokens, late := make(chan string, 4), make(chan error, 1)
	var got sync.Map
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[reconcile](func(ctx context.Context, j *handler.Job[reconcile]) error {
		tok, err := handler.CallbackToken(ctx, "bank")
		if err != nil {
			return err
		}
		tokens <- tok
		a, err := handler.WaitForSignal[approval](ctx, "bank", time.Hour)
		if err != nil {
			var timeout *handler.SignalTimeoutError
			if errors.As(err, &timeout) {
				// The timeout is recorded: the token has expired.
				late <- e.Client.Complete(context.Background(), tok, approval{By: "late"})
				return handler.Permanent(err)
			}
			return err
		}
		got.Store(j.ID, a.By)
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	first, err := e.Client.Enqueue(ctx, reconcile{Ledger: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	tok := <-tokens
	if strings.Contains(tok, first.ID) {
		t.Fatalf("the token %q shows the job's id", tok)
	}
	second, err := e.Client.Enqueue(ctx, reconcile{Ledger: "b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	other := <-tokens
	forged := []string{"", "njcb1.", tok + "x", tok[:len(tok)-2], strings.Replace(tok, "njcb2.", "njcb3.", 1), strings.Replace(tok, "njcb2.", "njcb1.", 1),
		tok[:strings.LastIndexByte(tok, '.')] + other[strings.LastIndexByte(other, '.'):]} // the first job's name, the second's MAC
	for _, f := range forged {
		if err := e.Client.Complete(ctx, f, approval{By: "mallory"}); !errors.Is(err, ledger.ErrBadCallbackToken) {
			t.Fatalf("forged token %q: %v, want ErrBadCallbackToken", f, err)
		}
	}
	if err := e.Client.Complete(ctx, tok, approval{By: "bank"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Complete(ctx, tok, approval{By: "bank again"}); !errors.Is(err, ledger.ErrSignalSent) {
		t.Fatalf("a reused token: %v, want ErrSignalSent", err)
	}
	e.Drain(t, h)
	if by, _ := got.Load(first.ID); by != "bank" || e.Get(t, first.ID).State != ledger.Succeeded {
		t.Fatalf("completed by %v, job %s", by, e.Get(t, first.ID).State)
	}
	e.Advance(t, time.Hour+time.Minute)
	e.Drain(t, h)
	select {
	case err := <-late:
		if !errors.Is(err, ledger.ErrSignalTooLate) {
			t.Fatalf("an expired token: %v, want ErrSignalTooLate", err)
		}
	default:
		t.Fatal("no run met the second job's timeout")
	}
	if rec := e.Get(t, second.ID); rec.State != ledger.Failed {
		t.Fatalf("the job whose token expired: %s", rec.State)
	}
	if _, err := newSignals(t).e.Client.Store().CallbackToken(first.ID, "bank", "n"); !errors.Is(err, ledger.ErrNoKeySecret) {
		t.Fatalf("a token with no key secret: %v", err)
	}
}

// TestSignalUnderFaults: every write of a signal can fail after it took
// effect. The signal's UpdateItem applied with its reply lost reads as
// done, and the job is woken, as does the wake's past the SDK's retries
// (read back); the wake throttled past the SDK's retries, or the send,
// fails the call with the signal recorded: the caller's
// retry of the same signal is no error (before: ErrSignalSent, the
// caller's own signal refused) and wakes the job then, not at the wait's
// timeout 48 hours on. Another payload is still refused.
func TestSignalUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	isSignal := func(body []byte) bool { return strings.Contains(string(body), "nexjob:signal:approval") }
	isWake := func(body []byte) bool { return !isSignal(body) && strings.Contains(string(body), `"Scheduled"`) }
	for _, c := range []struct {
		name  string
		rule  faults.Rule
		retry bool // the first call fails: the caller retries
	}{
		{"signal's reply lost", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isSignal, Fault: faults.LostReply}, false},
		{"wake throttled past the retries", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isWake, Fault: faults.Throttle, Times: faults.Attempts}, true},
		{"wake's reply lost past the retries (read back: its own)", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isWake, Fault: faults.LostReply, Times: faults.Attempts}, false},
		{"send throttled past the retries", faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts}, true},
		{"read throttled past the retries", faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Throttle, Times: faults.Attempts}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSignals(t)
			id := s.enqueue(t, "")
			s.e.Drain(t, s.h)
			if rec := s.e.Get(t, id); rec.State != ledger.Scheduled {
				t.Fatalf("the waiting job: %s", rec.State)
			}
			ft, fc := (&awstest.Env{Env: s.e}).Faulty()
			cl, err := enqueue.New(fc, s.e.Table, s.e.QueueURL, &enqueue.ClientOptions{Logger: quiet, Ledger: ledger.Options{Now: s.e.Now}})
			if err != nil {
				t.Fatal(err)
			}
			h := ft.Add(c.rule)
			err = cl.Signal(ctx, id, "approval", approval{By: "ada"})
			if c.retry {
				if err == nil {
					t.Fatal("the first call succeeded through the fault")
				}
				if err = cl.Signal(ctx, id, "approval", approval{By: "ada"}); err != nil {
					t.Fatalf("the caller's retry of its signal: %v, want no error", err)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Fired() == 0 {
				t.Fatal("the fault never fired")
			}
			s.e.Drain(t, s.h) // no clock moved: woken by the signal, not the timeout
			if prepared, by := s.seen(id); s.e.Get(t, id).State != ledger.Succeeded || prepared != 1 || by != "ada" {
				t.Fatalf("after the signal: %s, prepared %d times, approved by %q", s.e.Get(t, id).State, prepared, by)
			}
			var refused *ledger.SignalRefusedError
			if err := cl.Signal(ctx, id, "approval", approval{By: "bo"}); !errors.As(err, &refused) {
				t.Fatalf("another signal after the end: %v, want refused", err)
			}
		})
	}
}

// TestWaitTimeoutUnderFaults: the write that records a wait's timeout on
// the record (ledger.RecordTimeout, conditional on the run's token and on
// no signal recorded) applied with its reply lost reads as done, and
// throttled past the SDK's retries fails the run, whose retry records it
// then: either way the job ends with the timeout, its first step run
// once.
func TestWaitTimeoutUnderFaults(t *testing.T) {
	t.Parallel()
	isTimeout := func(body []byte) bool {
		return strings.Contains(string(body), "nexjob:signal:approval") && strings.Contains(string(body), "timed out")
	}
	for _, c := range []struct {
		name string
		rule faults.Rule
	}{
		{"reply lost", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isTimeout, Fault: faults.LostReply}},
		{"throttled past the retries", faults.Rule{Op: "DynamoDB.UpdateItem", Match: isTimeout, Fault: faults.Throttle, Times: faults.Attempts}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, ft := newSignalsFaulty(t, true)
			id := s.enqueue(t, "")
			s.e.Drain(t, s.h)
			s.e.Advance(t, 48*time.Hour+time.Minute)
			h := ft.Add(c.rule)
			s.e.Drain(t, s.h)
			if h.Fired() == 0 {
				t.Fatal("the fault never fired")
			}
			rec := s.e.Get(t, id)
			if rec.State != ledger.Failed || !strings.Contains(rec.LastError, `no signal "approval"`) {
				t.Fatalf("after the timeout: %s (%q), want Failed with the timeout", rec.State, rec.LastError)
			}
			if prepared, by := s.seen(id); prepared != 1 || by != "" {
				t.Fatalf("prepared %d times, approved by %q", prepared, by)
			}
		})
	}
}
