package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Received is the signal a WaitForAny returned: its name and its payload
// (JSON, for the worker to decode as that signal's type).
type Received struct {
	Name    string
	Payload json.RawMessage
}

// Decode decodes the signal's payload into v.
func (r Received) Decode(v any) error { return json.Unmarshal(r.Payload, v) }

// MaxWaitForAny bounds the names of one WaitForAny: each name's wait
// reserves room on the record for its signal (a step of
// ledger.MaxStepBytes) until it is answered, and every one may land.
const MaxWaitForAny = 3

// WaitForAny waits for whichever comes first of the job's signals names
// (sent by enqueue's Client.Signal, each as WaitForSignal's) and its
// timeout: Select over signals and a timer, durably. It returns exactly
// one outcome, the same on every later run of the job: the first of the
// names (in the order given) whose signal is recorded when a run of the
// job decides, recorded then as a step of the package's own (a signal
// sent before the wait is kept and chosen at once); or, at the timeout, a
// *SignalTimeoutError naming the first name, decided on the record in one
// conditional write with every name's slot (a signal in flight at the end
// either landed first and is chosen, or is refused as too late). While it
// waits the job sleeps as in WaitForSignal (no attempt spent, no compute
// held) and any of the signals wakes it. A signal of another of the names
// that lands after the choice is recorded and never returned. Return its
// error as for Sleep.
//
// Names are 1 to MaxWaitForAny distinct signal names; a name already
// waited for by WaitForSignal in the job is one wait. Cost: a wait that
// sleeps is one UpdateItem per name (its end), the run's end, one read
// and a send; the choice one more UpdateItem; a signal as WaitForSignal's.
func WaitForAny(ctx context.Context, names []string, timeout time.Duration) (Received, error) {
	s := stepsOf(ctx)
	if s == nil {
		return Received{}, ErrNotInRun
	}
	if err := checkAnyNames(names); err != nil {
		return Received{}, Permanent(err)
	}
	// The choice, once made, is the wait's outcome on every run.
	choice := anyStep(names)
	s.mu.Lock()
	raw, chosen := s.rec.Steps[choice]
	s.mu.Unlock()
	if s.replay != nil {
		for _, n := range names {
			s.mu.Lock()
			_, begun := s.rec.Steps[ledger.WaitStep(n)]
			s.mu.Unlock()
			if begun {
				s.replay.seen(s, ledger.WaitStep(n)) // the wait is reached, whatever it returns
			}
		}
	}
	if chosen {
		return s.received(raw, names)
	}
	if timeout > MaxWait {
		// Before any landed signal is taken, as WaitForSignal.
		s.mu.Lock()
		_, begun := s.rec.Steps[ledger.WaitStep(names[0])]
		s.mu.Unlock()
		if !begun {
			return Received{}, Permanent(&WaitTooLongError{Name: names[0], Wait: timeout, Signal: true})
		}
	}
	if r, ok := s.landed(names); ok {
		return s.choose(ctx, choice, r.Name, names)
	}
	// One end for every name, the first name's (the job is Scheduled
	// for it, and a signal wakes a job whose run time is its wait's end).
	var at int64
	for i, name := range names {
		end, err := step(ctx, ledger.WaitStep(name), func(context.Context) (int64, error) {
			if timeout > MaxWait {
				return 0, Permanent(&WaitTooLongError{Name: name, Wait: timeout, Signal: true})
			}
			if i > 0 {
				return at, nil
			}
			return s.store.Now().Add(timeout).UnixMilli(), nil
		})
		if err != nil {
			return Received{}, err
		}
		if i == 0 {
			at = end
		}
	}
	if s.store.Now().UnixMilli() < at {
		return Received{}, s.sleep(&sleepError{name: names[0], until: ledger.Millis(at), signals: names})
	}
	s.mu.Lock()
	landed, err := s.recordTimeouts(ctx, names)
	if err == nil {
		for _, name := range names {
			if p, ok := landed[name]; ok {
				s.rec.Steps[ledger.SignalStep(name)] = p
			} else if len(landed) == 0 {
				s.rec.Steps[ledger.SignalStep(name)] = ledger.TimedOut
			}
		}
	}
	s.mu.Unlock()
	if err != nil {
		return Received{}, err
	}
	if r, ok := s.landed(names); ok {
		return s.choose(ctx, choice, r.Name, names)
	}
	return s.choose(ctx, choice, "", names)
}

// landed is the first of names whose signal is on the run's record.
func (s *steps) landed(names []string) (Received, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		if p := s.rec.Steps[ledger.SignalStep(name)]; p != "" && p != ledger.TimedOut {
			return Received{Name: name, Payload: json.RawMessage(p)}, true
		}
	}
	return Received{}, false
}

// choose records the wait's outcome (a name, or "" for its timeout) as
// the step choice and returns it.
func (s *steps) choose(ctx context.Context, choice, name string, names []string) (Received, error) {
	got, err := step(ctx, choice, func(context.Context) (string, error) { return name, nil })
	if err != nil {
		return Received{}, err
	}
	b, _ := json.Marshal(got)
	return s.received(string(b), names)
}

// received is the outcome recorded as raw (a JSON string: a name, or ""
// for the timeout).
func (s *steps) received(raw string, names []string) (Received, error) {
	var name string
	if err := json.Unmarshal([]byte(raw), &name); err != nil {
		return Received{}, Permanent(fmt.Errorf("nexjob: a wait for any of %d signals: its recorded choice does not decode: %w", len(names), err))
	}
	if name == "" {
		return Received{}, &SignalTimeoutError{Name: names[0]}
	}
	s.mu.Lock()
	p := s.rec.Steps[ledger.SignalStep(name)]
	s.mu.Unlock()
	return Received{Name: name, Payload: json.RawMessage(p)}, nil
}

// anyStep is the step that keeps the choice of a wait for any of names.
func anyStep(names []string) string {
	return "nexjob:any:" + shortHash(strings.Join(names, "\x00"), 15)
}

func checkAnyNames(names []string) error {
	if len(names) == 0 || len(names) > MaxWaitForAny {
		return fmt.Errorf("nexjob: WaitForAny takes 1 to %d signal names, not %d", MaxWaitForAny, len(names))
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return fmt.Errorf("nexjob: WaitForAny: signal %q named twice", n)
		}
		seen[n] = true
	}
	return nil
}
