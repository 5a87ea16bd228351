package handler

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ErrNotInRun: Step, Sleep, WaitForSignal or CallbackToken was called
// outside a worker's Work, or ClientFrom outside Handle and
// HandleDeadLetters (the context is not a run's).
var ErrNotInRun = errors.New("nexjob: not in a job's run (this needs the context the handler gives a worker)")

// ErrStepRepeated: a step name was used twice in one run. Steps are named,
// not counted, so each name is one step of the job.
var ErrStepRepeated = errors.New("nexjob: step name used twice in one run")

// steps is a run's view of its job's completed steps.
type steps struct {
	store *ledger.Store
	mu    sync.Mutex
	rec   ledger.Record // the claim's record, its Steps kept current
	used  map[string]bool
	// slept is the sleep (or wait) this run met and must end in: every
	// later Step returns it again, fn not called, and a run that returns
	// nil ends in it all the same (a worker that dropped Sleep's error).
	slept *sleepError
	// off are the job's steps in the steps table (ledger.Options.StepsTable),
	// read at the run's first look-up of one (nil before); ranOff, this
	// run recorded one there; looked, when the run last read its record
	// (its claim, or ledger's Look).
	off    *ledger.OffSteps
	ranOff bool
	looked time.Time
	// comps are the compensations the run declared (Compensate); marked,
	// it marked the record compensable; compensating, it runs them (their
	// steps are no new work, and no look for a cancel); stopped, a run
	// asked to stop and compensate refused something new (stopping).
	comps                         []compensation
	marked, compensating, stopped bool
	// patches are the patches the job's code knew at its first run
	// (settlePatches; nil for a kind with none).
	patches []string
	// tracer makes a span for each step that runs its function (nil:
	// tracing off): the run's child, the parent of what the function does
	// (a child job's enqueue, its own calls).
	tracer trace.Tracer
	// replay, set, makes the run a replay (Registry.Replay): no function
	// of a step is called and nothing is written; what it met is noted.
	replay *replayLog
}

func (s *steps) recorded(ctx context.Context, name string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used[name] {
		// As deterministic as a size error: every run would repeat it.
		return "", false, Permanent(fmt.Errorf("%w: %q", ErrStepRepeated, name))
	}
	if s.used == nil {
		s.used = map[string]bool{} // made on a run's first step: most runs have none
	}
	s.used[name] = true
	return s.value(ctx, name)
}

// record records result as step name's and returns the result the ledger
// holds: result, or (in the steps table) the one a write before it
// recorded, which the run goes on with.
func (s *steps) record(ctx context.Context, name, result string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.replay != nil {
		// The package's own records (a job's patches, a wait for children
		// that timed out) as the live run would write them, in memory.
		s.rec.Steps[name] = result
		return result, nil
	}
	if !s.store.OffRecord(name) {
		steps, err := s.store.RecordStep(ctx, s.rec, name, result)
		if err != nil {
			return "", err
		}
		s.rec.Steps = steps // with the signals that landed since the claim
		return result, nil
	}
	if err := s.load(ctx); err != nil {
		return "", err
	}
	if err := s.lookIfDue(ctx); err != nil {
		return "", err
	}
	// The write itself outside the lock: steps of other goroutines (Map's
	// items) are written meanwhile, each counted here first.
	have := ledger.OffSteps{Count: s.off.Count, Bytes: s.off.Bytes}
	if err := s.store.CheckOffStep(have, name, result); err != nil {
		return "", err
	}
	s.off.Count++
	s.off.Bytes += len(result)
	s.mu.Unlock()
	in, _ := ctx.Value(inStepKey{}).(string)
	v, err := s.store.PutStepIn(ctx, s.rec, have, name, in, result)
	s.mu.Lock()
	if err != nil {
		s.off.Count--
		s.off.Bytes -= len(result)
		return "", err
	}
	s.off.Values[name] = v
	s.off.Bytes += len(v) - len(result)
	s.ranOff = true
	return v, nil
}

// timeout records the wait for signal name timed out (RecordTimeout)
// and returns the signal's payload if one landed first ("" if not).
func (s *steps) timeout(ctx context.Context, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	payload, err := "", error(nil)
	if s.replay != nil {
		payload = s.rec.Steps[ledger.SignalStep(name)] // what landed first, in the replay's records
	} else if payload, err = s.store.RecordTimeout(ctx, s.rec, name); err != nil {
		return "", err
	}
	if payload == "" {
		payload = ledger.TimedOut
	}
	s.rec.Steps[ledger.SignalStep(name)] = payload
	if payload == ledger.TimedOut {
		return "", nil
	}
	return payload, nil
}

// Step runs fn once per job: the first time a step of this name completes
// in a job, its result is recorded in the job's record (as JSON), and
// every later run of the job (a retry, an orphan's take-over, a cut-off's
// rerun, a requeue) gets the recorded result back without calling fn.
// Steps are named, not counted: code that adds a step between
// deployments keeps the others. Call it inside a worker's Work with the
// run's context.
//
// How it fails: fn's error is returned as it is (the run fails as the
// worker returns it: retried, or ended by Permanent), and nothing is
// recorded, so the next run calls fn again. A name used twice in one run
// is ErrStepRepeated (permanent: every run would repeat it); a context not a run's, ErrNotInRun; a run whose
// context ended returns its error before calling fn (a cancelled job
// stops at its next step). A result that cannot be encoded, or is outside
// the ledger's limits (ledger.MaxStepBytes and the others: a
// *ledger.StepError), fails the job permanently: it would fail every
// run. Recording is fenced as the run's end is: a run whose lease a newer
// run took gets ledger.ErrFenced and fn's result is lost to the job. A
// write applied with its reply lost reads as done; a write that fails
// (throttled past the SDK's retries) fails the run, and the next run
// calls fn again. So a step is at least once, and exactly once when its
// write lands: give fn's side effect an idempotency key (StepKey) and the
// provider closes that gap.
//
// Cost: recording is one UpdateItem of the job's record (write units by
// the record's size: one for a small job); a replayed step costs no
// request (its result came with the run's claim).
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	if strings.HasPrefix(name, "nexjob:") {
		var zero T
		return zero, Permanent(&ledger.StepError{Name: name, Reason: `names beginning "nexjob:" are the package's own (signals, waits)`})
	}
	return step(ctx, name, fn)
}

// step is Step without the check of the name: the package's own steps
// (a wait's end) use it.
func step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	return stepWith(ctx, name, nil, fn)
}

// stepWith is step with a step's own retries (o nil: one call of fn).
func stepWith[T any](ctx context.Context, name string, o *StepOptions, fn func(ctx context.Context) (T, error)) (_ T, err error) {
	var zero T
	s := stepsOf(ctx)
	if s == nil {
		return zero, ErrNotInRun
	}
	if p := s.pending(); p != nil {
		return zero, p // the run ends in its sleep: nothing after it runs
	}
	raw, done, err := s.recorded(ctx, name)
	if err != nil {
		return zero, err
	}
	if !done && o != nil {
		// Renamed in code: the result recorded under a former name is
		// this step's (its function is not called again).
		for _, alias := range o.Aliases {
			s.mu.Lock()
			raw, done, err = s.value(ctx, alias)
			s.mu.Unlock()
			if err != nil {
				return zero, err
			}
			if done {
				break
			}
		}
	}
	if s.replay != nil {
		if !done {
			return zero, s.replay.reach(s, name) // a live run would call fn here
		}
		s.replay.reached(s, name, o, raw)
		if err := strictDecode[T](name, raw); err != nil {
			return zero, err
		}
	}
	if done {
		var v T
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			return zero, Permanent(&ResultTypeError{Step: name, Recorded: jsonShape(raw), Want: fmt.Sprintf("%T", v), Err: err})
		}
		return v, nil
	}
	if err := context.Cause(ctx); err != nil {
		return zero, err
	}
	if s.stopping() {
		return zero, s.stopRefusal() // asked to stop and compensate: nothing new runs
	}
	if s.store.OffRecord(name) {
		// A cancel asked since the run last looked is seen before fn is
		// called, not only at its record.
		s.mu.Lock()
		err := s.lookIfDue(ctx)
		s.mu.Unlock()
		if err != nil {
			if errors.Is(err, ledger.ErrCancelRequested) {
				err = Permanent(err)
			}
			return zero, err
		}
	}
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.tracer.Start(ctx, "step", trace.WithAttributes(attribute.String("nexjob.step", name), attribute.String("nexjob.job_id", s.rec.ID)))
		defer span.End()
		defer func() {
			if err != nil && !IsSleep(err) {
				span.RecordError(err)
				span.SetStatus(codes.Error, "step failed")
			}
		}()
	}
	// fn's context knows its step: a step fn records is nested in it
	// (a replay that replays this one does not reach them), and a
	// compensation cannot be declared there (Compensate).
	v, err := callStep(context.WithValue(ctx, inStepKey{}, name), s, name, o, fn)
	if err != nil {
		s.mu.Lock()
		delete(s.used, name) // not recorded: a retry of an enclosing step (a compensation's tries) may call it again
		s.mu.Unlock()
		return zero, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return zero, Permanent(fmt.Errorf("nexjob: step %q: its result does not encode: %w", name, err))
	}
	got, err := s.record(ctx, name, string(b))
	if err != nil {
		var se *ledger.StepError
		if errors.As(err, &se) || errors.Is(err, ledger.ErrCancelRequested) {
			return zero, Permanent(err)
		}
		return zero, err
	}
	if got != string(b) {
		// Another run recorded the step first: its result is the job's.
		var w T
		if err := json.Unmarshal([]byte(got), &w); err != nil {
			return zero, Permanent(fmt.Errorf("nexjob: step %q: its recorded result does not decode: %w", name, err))
		}
		return w, nil
	}
	return v, nil
}

// StepKey is a stable key for the job's step name: the same on every run
// of the job, different for every job and step, made of the job's id and
// the name only (no args, no key). Hand it to a payment provider as its
// idempotency key, so a step whose result was never recorded (see Step)
// charges once all the same. Outside a run it is "".
func StepKey(ctx context.Context, name string) string {
	s := stepsOf(ctx)
	if s == nil {
		return ""
	}
	return "nj-" + shortHash(s.rec.ID+"\x00"+name, 20)
}

// shortHash is the first n bytes of text's SHA-256, in lower-case
// unpadded base32: StepKey's, and the package's own step names.
func shortHash(text string, n int) string {
	sum := sha256.Sum256([]byte(text))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:n]))
}

// inStepKey is a context key: the name of the step whose function ctx is
// (a string).
type inStepKey struct{}

// stepsOf is the steps of the run ctx is in, nil outside one.
func stepsOf(ctx context.Context) *steps {
	if j := runOf(ctx); j != nil {
		return j.steps
	}
	return nil
}

// sleepError ends a run that sleeps: the job is Scheduled for until.
type sleepError struct {
	name    string
	until   time.Time
	signals []string // a wait for these signals (WaitForSignal's one, WaitForAny's)
	// children: a wait for children (AwaitAll): the sleep is marked so
	// (Finish.AwaitChildren), and the run looks for an end that came
	// meanwhile (childrenEndedMeanwhile).
	children bool
	// frontier: not a sleep but a replay's end at step name, the first it
	// reached that was not recorded (Registry.Replay).
	frontier bool
}

func (e *sleepError) Error() string {
	return fmt.Sprintf("nexjob: sleeping (%q) until %s", e.name, e.until.UTC().Format(time.RFC3339))
}

// IsSleep reports whether err (from Sleep, SleepUntil or WaitForSignal,
// or a worker's error wrapping it) ends the run in a durable sleep rather
// than a failure: what a worker that logs or counts its own outcomes
// tells apart.
func IsSleep(err error) bool {
	var s *sleepError
	return errors.As(err, &s)
}

// Sleep is SleepUntil(ctx, name, now + d), now taken once: by the run that
// first meets the sleep.
func Sleep(ctx context.Context, name string, d time.Duration) error {
	s := stepsOf(ctx)
	if s == nil {
		return ErrNotInRun
	}
	return SleepUntil(ctx, name, s.store.Now().Add(d))
}

// SleepUntil sleeps the job until t, durably: the first run that meets it
// records t as the step name (see Step) and ends at once, with no attempt
// spent and no compute held; the job is Scheduled for t, through the
// paths every later run takes (an SQS delay, carried forward, or a
// one-time schedule beyond FarAfter when far schedules are on), and its
// next run replays the steps before the sleep, passes it, and goes on.
// The worker must return its error: a non-nil one is the run's end, not a
// failure. A worker that drops it sleeps all the same: every later Step
// of the run returns the sleep's error again without calling its fn, and
// whatever the run then returns (nil included) ends it in the sleep, with
// a warning logged (TestADroppedSleepErrorStillSleeps). A run that comes back before t (a duplicate delivery) sleeps
// again to the recorded t.
//
// Cost: the sleep's step (one UpdateItem), the run's end (one UpdateItem)
// and one send, whatever the length: a 30-day and a 1-year sleep make the
// same requests (TestSleepCostsTheSameForAMonthAndAYear). With far
// schedules off, a message further than SQS's 15 minutes hops forward
// every 15 minutes (a receive, a send and a delete, no DynamoDB request).
func SleepUntil(ctx context.Context, name string, t time.Time) error {
	if strings.HasPrefix(name, "nexjob:") {
		return Permanent(&ledger.StepError{Name: name, Reason: `names beginning "nexjob:" are the package's own (signals, waits)`})
	}
	return sleepUntil(ctx, name, t)
}

// sleepUntil is SleepUntil without the check of the name: the package's
// own sleeps (a step's retry) use it.
func sleepUntil(ctx context.Context, name string, t time.Time) error {
	s := stepsOf(ctx)
	if s == nil {
		return ErrNotInRun
	}
	until, err := step(ctx, name, func(context.Context) (int64, error) {
		if d := t.Sub(s.store.Now()); d > MaxWait {
			return 0, Permanent(&WaitTooLongError{Name: name, Wait: d})
		}
		return t.UnixMilli(), nil
	})
	if err != nil {
		return err
	}
	if until < minSleepEnd {
		// Not a sleep's end: a step of this name recorded another value
		// (a step renamed to a sleep, or a sleep to a step's name).
		return Permanent(&ResultTypeError{Step: name, Recorded: strconv.FormatInt(until, 10), Want: "a sleep's end (unix ms)", Err: errors.New("the recorded value is not a time")})
	}
	if s.store.Now().UnixMilli() < until {
		return s.sleep(&sleepError{name: name, until: ledger.Millis(until)})
	}
	return nil
}

// minSleepEnd is the earliest a recorded sleep's end can be (2000-01-01,
// unix ms): a smaller number under a sleep's name is another step's value.
const minSleepEnd = 946_684_800_000

// MaxWait is the longest sleep (Sleep, SleepUntil) and the longest wait
// for a signal (WaitForSignal's timeout): the longest schedule, a year and
// a day (enqueue.MaxScheduleAhead). A job is Scheduled for its sleep's or
// wait's end itself, and no run time is further ahead than a schedule
// can reach, so a longer one is refused (*WaitTooLongError) rather than
// cut short on the record (before, a wait of two years woke no one on its
// signal, and math.MaxInt64, "for ever", refused every signal as late).
// A wait with no end is a wait of MaxWait whose *SignalTimeoutError the
// worker answers as it sees fit (fail the job, or ask a person).
const MaxWait = enqueue.MaxScheduleAhead

// WaitTooLongError refuses a sleep or a wait longer than MaxWait, when the
// run first meets it: nothing is recorded, and the job fails permanently
// (Permanent wraps it: it would fail every run). Sleeps and waits recorded
// before this limit replay as they were.
type WaitTooLongError struct {
	Name   string        // the sleep's or the wait's name
	Wait   time.Duration // how long it asked for
	Signal bool          // a wait for a signal (else a sleep)
	// Children: a wait for children (Await, AwaitAll; Name is the first
	// child's).
	Children bool
}

func (e *WaitTooLongError) Error() string {
	what := "sleep"
	switch {
	case e.Children:
		what = "wait for child"
	case e.Signal:
		what = "wait for signal"
	}
	return fmt.Sprintf("nexjob: %s %q of %s is longer than the longest, %s (handler.MaxWait)", what, e.Name, e.Wait, MaxWait)
}

// SignalTimeoutError: WaitForSignal's timeout passed with no signal. The
// worker decides: return it (the run fails and is retried, and the retry
// times out again at once: wrap it in Permanent to end the job) or go on.
type SignalTimeoutError struct{ Name string }

func (e *SignalTimeoutError) Error() string {
	return fmt.Sprintf("nexjob: no signal %q before the wait's timeout", e.Name)
}

// WaitForSignal returns the payload of the job's signal name (sent by
// enqueue's Client.Signal), decoded as T. A signal sent before the wait is
// kept and returned at once. Otherwise the first run that meets the wait
// records its end (now + timeout, as a step) and ends at once, with no
// attempt spent, the job Scheduled for that end: the signal wakes it (its
// next run replays the steps before and returns the payload here), or the
// end does, and the wait returns a *SignalTimeoutError. Return its error
// as for Sleep: a non-nil one other than the timeout is the run's end.
//
// Cost: a wait that sleeps is its end's step, the run's end, one read
// (a signal that came while the run was ending wakes it then) and a send;
// the signal is one or two UpdateItems, one more and a send when it wakes
// the job.
func WaitForSignal[T any](ctx context.Context, name string, timeout time.Duration) (T, error) {
	var zero T
	s := stepsOf(ctx)
	if s == nil {
		return zero, ErrNotInRun
	}
	s.mu.Lock()
	payload, sent := s.rec.Steps[ledger.SignalStep(name)]
	_, begun := s.rec.Steps[ledger.WaitStep(name)]
	s.mu.Unlock()
	if !begun && timeout > MaxWait {
		// Whatever landed: a signal sent first must not make the same
		// code pass once and fail the next time.
		return zero, Permanent(&WaitTooLongError{Name: name, Wait: timeout, Signal: true})
	}
	if s.replay != nil && begun {
		s.replay.seen(s, ledger.WaitStep(name)) // the wait is reached, whatever returns below
	}
	if payload == ledger.TimedOut {
		return zero, &SignalTimeoutError{Name: name} // a run before this one timed out
	}
	if sent {
		var v T
		if err := json.Unmarshal([]byte(payload), &v); err != nil {
			return zero, Permanent(fmt.Errorf("nexjob: signal %q does not decode: %w", name, err))
		}
		return v, nil
	}
	// A JSON number: the ledger compares it, as a number, with now.
	at, err := step(ctx, ledger.WaitStep(name), func(context.Context) (int64, error) {
		return s.store.Now().Add(timeout).UnixMilli(), nil
	})
	if err != nil {
		return zero, err
	}
	if s.store.Now().UnixMilli() >= at {
		// Decided on the record, not by this clock alone: a signal in
		// flight at the wait's end either landed first (its payload is
		// the wait's) or is refused as too late; never accepted while the
		// run fails on the timeout.
		payload, err := s.timeout(ctx, name)
		if err != nil {
			return zero, err
		}
		if payload == "" {
			return zero, &SignalTimeoutError{Name: name}
		}
		var v T
		if err := json.Unmarshal([]byte(payload), &v); err != nil {
			return zero, Permanent(fmt.Errorf("nexjob: signal %q does not decode: %w", name, err))
		}
		return v, nil
	}
	return zero, s.sleep(&sleepError{name: name, until: ledger.Millis(at), signals: []string{name}})
}

// signalledMeanwhile wakes job id if its signal name came while the run
// that began to wait for it was ending (the signal found it Processing and
// woke no one): one read, and the wake when it did.
func (h *Handler) signalledMeanwhile(ctx context.Context, id string, names []string) bool {
	cur, err := h.store.Get(ctx, id)
	if err != nil {
		h.log.WarnContext(ctx, "nexjob: reading a job that began to wait failed; its message comes back to look again", "job_id", id, "err", err)
		return false
	}
	if cur.State != ledger.Scheduled {
		return true
	}
	for _, name := range names {
		if cur.Steps[ledger.SignalStep(name)] != "" {
			return h.wakeSignalled(ctx, cur)
		}
	}
	return true // no signal yet: it wakes the job when it comes
}

// childrenEndedMeanwhile wakes the job claimed if a child's end was
// recorded since its claim (Record.ChildEnds moved on): the child, finding
// the job still running, woke no one. One read, and the wake when so;
// false when either failed (the message comes back, and notClaimable
// wakes a job asleep in a wait for children).
func (h *Handler) childrenEndedMeanwhile(ctx context.Context, claimed ledger.Record) bool {
	cur, err := h.store.Get(ctx, claimed.ID)
	if err != nil {
		h.log.WarnContext(ctx, "nexjob: reading a job that began to wait for children failed; its message comes back to look again", "job_id", claimed.ID, "err", err)
		return false
	}
	if cur.State == ledger.Scheduled && cur.Token == claimed.Token && cur.CancelReq != "" {
		// An operator's cancel reached this run after its last step (a
		// replay that wrote none, woken by one child, asleep again for
		// the others): no later step of this run sees it, and the next
		// run's claim drops it. It is honoured here: the job is withdrawn
		// asleep, and its unfinished children with it (Cancel).
		_, err := h.producer.Cancel(ctx, cur.ID, cur.CancelReq, h.retention(cur.Kind).For(ledger.Failed))
		var notNow *enqueue.NotCancellableError
		if err != nil && !errors.As(err, &notNow) {
			h.log.WarnContext(ctx, "nexjob: cancelling a job asked to stop while it began to wait for children failed; its message comes back", "job_id", cur.ID, "err", err)
			return false
		}
		return true
	}
	if cur.State != ledger.Scheduled || cur.ChildEnds == claimed.ChildEnds {
		return true // a child's end since wakes it when it comes
	}
	return h.wakeSignalled(ctx, cur)
}

// wakeSignalled wakes cur, asleep in a wait whose signal is recorded: the
// record made due now and its message sent. false when either failed:
// the caller keeps the message it holds, which comes back and, finding
// the job still asleep with its signal (notClaimable), tries again; the
// job is never left to sleep to its wait's end (helper-8's attack: one
// throttled read lost the wake for 48 hours).
func (h *Handler) wakeSignalled(ctx context.Context, cur ledger.Record) bool {
	out, ok, err := h.store.Wake(ctx, cur)
	if err != nil {
		h.log.WarnContext(ctx, "nexjob: waking a signalled job failed; it is tried again", "job_id", cur.ID, "err", err)
		return false
	}
	if !ok {
		return true // it moved on: whatever moved it runs it
	}
	if err := h.producer.Dispatch(ctx, out); err != nil {
		h.log.WarnContext(ctx, "nexjob: sending a signalled job failed; it is tried again", "job_id", cur.ID, "err", err)
		return false
	}
	return true
}

// CallbackToken is an opaque token for the job's signal name, for another
// system to complete the wait (enqueue's Client.Complete) without the
// job's id or any other right: a MAC under the deployment's key secret
// binds the job and the name, so no token is guessable from a job id. A
// completed token is refused (ledger.ErrSignalSent) unless it is the same
// completion again (the same payload: a retry), as is one whose
// wait timed out (ledger.ErrSignalTooLate). The same on every run of the
// job. No key secret: ledger.ErrNoKeySecret.
func CallbackToken(ctx context.Context, name string) (string, error) {
	s := stepsOf(ctx)
	if s == nil {
		return "", ErrNotInRun
	}
	if _, err := s.store.CallbackToken(s.rec.ID, name, "check"); err != nil {
		return "", err // no key secret: nothing recorded
	}
	s.mu.Lock()
	raw, issued := s.rec.Steps[ledger.TokenStep(name)]
	s.mu.Unlock()
	if issued { // by this run or one before it: the same token
		var nonce string
		if err := json.Unmarshal([]byte(raw), &nonce); err != nil {
			return "", Permanent(fmt.Errorf("nexjob: callback token %q: its recorded nonce does not decode: %w", name, err))
		}
		return s.store.CallbackToken(s.rec.ID, name, nonce)
	}
	nonce, err := step(ctx, ledger.TokenStep(name), func(context.Context) (string, error) {
		b := make([]byte, 15) // 120 bits
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		return base64.RawURLEncoding.EncodeToString(b), nil
	})
	if err != nil {
		return "", err
	}
	return s.store.CallbackToken(s.rec.ID, name, nonce)
}

// ResultTypeError: a step's recorded result does not decode as the type
// the code now asks for (the step's result type changed while jobs that
// recorded it were asleep). The way forward: decode the recorded shape
// (a type that takes both), or give the step a new name (its function
// then runs again for those jobs: only if that is safe), or let those
// jobs fail (Permanent: the job fails at once, no retry) and requeue them
// once fixed.
type ResultTypeError struct {
	Step     string // the step's name
	Recorded string // its recorded result's shape ("a JSON object of 42 bytes"): never its data
	Want     string // the Go type the code asks for
	Err      error
}

func (e *ResultTypeError) Error() string {
	return fmt.Sprintf("nexjob: step %q: its recorded result, %s, does not decode as %s (the step's result type changed while the job slept: decode the old shape, or rename the step if running it again is safe)", e.Step, e.Recorded, e.Want)
}

func (e *ResultTypeError) Unwrap() error { return e.Err }

// jsonShape says what a recorded result is without its data: errors are
// logged and kept on the record, and a result may be anyone's.
func jsonShape(s string) string {
	kind := "a JSON value"
	if t := strings.TrimSpace(s); t != "" {
		switch t[0] {
		case '{':
			kind = "a JSON object"
		case '[':
			kind = "a JSON array"
		case '"':
			kind = "a JSON string"
		case 't', 'f':
			kind = "a JSON boolean"
		case 'n':
			kind = "JSON null"
		default:
			kind = "a JSON number"
		}
	}
	return fmt.Sprintf("%s of %d bytes", kind, len(s))
}
