package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/nexjob/nexjob-aws/ledger"
)

// ReplayTimeout bounds one job's replay (Replay): a worker that blocks
// outside its steps is reported, not waited for.
const ReplayTimeout = 10 * time.Second

// Replayed is what a replay of a job (Replay) met: where the current code
// went with the job's recorded steps.
type Replayed struct {
	// Reached are the recorded steps the code reached, in the order it
	// reached them (their functions not called): a step's own name, or
	// the former name (StepOptions.Aliases) whose record it took.
	Reached []string
	// Frontier is the first step the code reached that was not recorded
	// ("" none): a live run would call its function there. Nothing after
	// it ran in the replay.
	Frontier string
	// Sleeps is the recorded sleep or wait the replay ended in, not yet
	// due at the replay's time ("" none): a sleep's name, a wait's end's
	// step (ledger.WaitStep of its first signal's name); Until its end.
	Sleeps string
	Until  time.Time
	// Err is what the worker returned other than a sleep or the frontier
	// (nil: it returned nil): a *ResultTypeError when a recorded value no
	// longer decodes, a *PanicError, or the worker's own error.
	Err error
}

// ErrReplayCall refuses every AWS call of a replay (Registry.Replay): a
// replay writes nothing and reads nothing but what it was given.
var ErrReplayCall = errors.New("nexjob: a replay makes no AWS call (the worker or the package reached one outside its recorded steps)")

// Replay runs rec's job through its kind's worker in reg against the
// steps rec holds (Record.Steps whole: ledger's WithSteps, or an export's),
// with the clock at now and no side effect: a recorded step returns its
// recorded value without calling its function; the first step not
// recorded ends the replay there (Replayed.Frontier), its function not
// called; a recorded sleep or wait not due at now ends it as the live run
// would sleep; a wait whose end passed returns the recorded signal or its
// timeout without writing one. No AWS call is made: anything that would
// make one (a Client taken with ClientFrom, a child's result too large
// for its step) fails the replay with an error saying so. Code outside
// steps runs as it runs in every live replay.
//
// How it fails: a kind reg does not know is an error; what the worker
// met is in the Replayed, for the caller to judge (the replay package
// compares it with what the job recorded).
func (r *Registry) Replay(ctx context.Context, rec ledger.Record, now time.Time) (Replayed, error) {
	e, ok := r.lookup(rec.Kind)
	if !ok {
		return Replayed{}, fmt.Errorf("nexjob: replay of job %s: kind %q is not registered", rec.ID, rec.Kind)
	}
	// A key secret of its own: a callback token a replay makes is never
	// handed to anyone.
	store, err := ledger.New(refuseAll{}, "replay", &ledger.Options{Now: func() time.Time { return now }, StepsTable: "replay", KeySecret: []byte("nexjob replay")})
	if err != nil {
		return Replayed{}, err
	}
	if rec.Steps == nil {
		rec.Steps = ledger.StepMap{}
	}
	rec.Token++ // as the next run's claim would: a job that ran once is not taken for one never claimed (its patches)
	log := &replayLog{}
	ctx = withRun(ctx, slog.New(slog.DiscardHandler), rec, time.Now())
	s := &steps{store: store, rec: rec, looked: now, replay: log, off: &ledger.OffSteps{Values: map[string]string{}}}
	runOf(ctx).steps = s
	runCtx, cancel := context.WithTimeout(ctx, ReplayTimeout)
	defer cancel()
	if len(e.opts.Patches) > 0 {
		if err := s.settlePatches(ctx, e.opts.Patches); err != nil {
			return log.result(err), nil
		}
	}
	_, err = safeRun(runCtx, e, rec)
	if p := s.pending(); p != nil && err == nil {
		err = p // went on past its sleep: it ends there all the same
	}
	if err == nil && runCtx.Err() != nil {
		err = fmt.Errorf("nexjob: the replay did not end within %s", ReplayTimeout)
	}
	return log.result(err), nil
}

// replayLog is what a replay's steps met.
type replayLog struct {
	steps    []string // the recorded steps reached, in order
	frontier string
}

// reach notes step name, reached and not recorded, as the replay's
// frontier (the first one) and ends the replay there: every later step
// returns the same end. Called with s.mu not held.
func (l *replayLog) reach(s *steps, name string) error {
	s.mu.Lock()
	if l.frontier == "" {
		l.frontier = name
	}
	s.mu.Unlock()
	return s.sleep(&sleepError{name: name, frontier: true})
}

// reached notes that the replay reached recorded step name, or (raw not
// its own) the former name of o's whose record it took.
func (l *replayLog) reached(s *steps, name string, o *StepOptions, raw string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, own := s.rec.Steps[name]; !own && o != nil {
		for _, a := range o.Aliases {
			if v, ok := s.rec.Steps[a]; ok && v == raw {
				name = a
				break
			}
		}
	}
	l.steps = append(l.steps, name)
}

// seen notes that the replay reached the package's own recorded step
// name (a condition's look) other than through a step.
func (l *replayLog) seen(s *steps, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.steps = append(l.steps, name)
}

// result is the replay's outcome, the worker having returned err.
func (l *replayLog) result(err error) Replayed {
	out := Replayed{Reached: l.steps, Frontier: l.frontier}
	var sl *sleepError
	switch {
	case errors.As(err, &sl) && sl.frontier:
	case errors.As(err, &sl) && len(sl.signals) > 0:
		out.Sleeps, out.Until = ledger.WaitStep(sl.name), sl.until // a wait: its end's step
	case errors.As(err, &sl):
		out.Sleeps, out.Until = sl.name, sl.until
	default:
		out.Err = err
	}
	return out
}

// refuseAll is the replay's DynamoDB: every call refused.
type refuseAll struct{}

func (refuseAll) GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return nil, ErrReplayCall
}

func (refuseAll) PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return nil, ErrReplayCall
}

func (refuseAll) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return nil, ErrReplayCall
}

func (refuseAll) DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return nil, ErrReplayCall
}

func (refuseAll) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return nil, ErrReplayCall
}

func (refuseAll) Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return nil, ErrReplayCall
}

func (refuseAll) Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	return nil, ErrReplayCall
}

// recordTimeouts is the ledger's RecordTimeouts for a wait for any of
// names; in a replay, the signals the replay's records hold, none
// written.
func (s *steps) recordTimeouts(ctx context.Context, names []string) (map[string]string, error) {
	if s.replay == nil {
		return s.store.RecordTimeouts(ctx, s.rec, names)
	}
	landed := map[string]string{}
	for _, n := range names {
		if p, ok := s.rec.Steps[ledger.SignalStep(n)]; ok && p != ledger.TimedOut {
			landed[n] = p
		}
	}
	return landed, nil
}

// strictDecode refuses, in a replay, a recorded value with fields T no
// longer has (a renamed JSON field decodes to its zero value live,
// silently): a *ResultTypeError naming step name.
func strictDecode[T any](name, raw string) error {
	var v T
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil && strings.Contains(err.Error(), "unknown field") {
		return Permanent(&ResultTypeError{Step: name, Recorded: jsonShape(raw), Want: fmt.Sprintf("%T", v), Err: err})
	}
	return nil
}
