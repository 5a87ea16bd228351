package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// ConditionOptions are WaitForCondition's: how often it looks and for how
// long.
type ConditionOptions struct {
	// Every is the pause between two looks: a durable sleep (no compute
	// held, no attempt spent). Defaults to DefaultConditionEvery; at
	// least a second.
	Every time.Duration
	// Timeout bounds the wait from its first look: MaxWait when zero.
	Timeout time.Duration
}

// DefaultConditionEvery is ConditionOptions.Every's default.
const DefaultConditionEvery = time.Minute

// ConditionTimeoutError: WaitForCondition's condition did not hold
// within its timeout. Recorded: every later run of the job gets it too.
type ConditionTimeoutError struct {
	Name    string
	Timeout time.Duration
	Looks   int // how many times the condition was looked at
}

func (e *ConditionTimeoutError) Error() string {
	return fmt.Sprintf("nexjob: condition %q did not hold within %s (%d looks)", e.Name, e.Timeout, e.Looks)
}

// conditionOutcome is a WaitForCondition's recorded end.
type conditionOutcome struct {
	Value    json.RawMessage `json:"v,omitempty"`
	TimedOut bool            `json:"timedOut,omitempty"`
	Looks    int             `json:"looks"`
}

// WaitForCondition waits, durably, until check reports done, and returns
// the value it returned then: Lambda durable functions' waitForCondition.
// check is called once per look (a read of another system's state: a
// payout settled, a file landed); between two looks the job sleeps
// o.Every (a durable sleep: the run ends, nothing held, no attempt
// spent), until o.Timeout from the first look, when it is a
// *ConditionTimeoutError. The outcome (the value, or the timeout) is
// recorded as a step: a run after it gets the same, and check is not
// called again. An error from check is the run's (the job's retry policy
// decides; the looks before it stand). The worker must return the error
// of WaitForCondition as that of Sleep. name is a step name's (1 to 128
// bytes, not beginning "nexjob:").
//
// Cost: a look that finds the condition false is a sleep (its step, the
// run's end, the next run's claim and a send); the look that finds it
// true records one step. WaitForSignal is cheaper when the other system
// can call back.
func WaitForCondition[T any](ctx context.Context, name string, check func(ctx context.Context) (T, bool, error), o *ConditionOptions) (T, error) {
	var zero T
	if err := checkUserName(name); err != nil {
		return zero, err
	}
	s := stepsOf(ctx)
	if s == nil {
		return zero, ErrNotInRun
	}
	every, timeout := DefaultConditionEvery, MaxWait
	if o != nil && o.Every > 0 {
		every = max(o.Every, time.Second)
	}
	if o != nil && o.Timeout > 0 {
		timeout = o.Timeout
	}
	if timeout > MaxWait {
		return zero, Permanent(&WaitTooLongError{Name: name, Wait: timeout})
	}
	end, err := step(ctx, ledger.ConditionStep(name, "end"), func(context.Context) (int64, error) {
		return s.store.Now().Add(timeout).UnixMilli(), nil
	})
	if err != nil {
		return zero, err
	}
	peek := func(key string) (string, bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.value(ctx, key)
	}
	decode := func(raw string) (T, error) {
		var out conditionOutcome
		if err := json.Unmarshal([]byte(raw), &out); err != nil {
			return zero, Permanent(fmt.Errorf("nexjob: condition %q: its recorded outcome does not decode: %w", name, err))
		}
		if out.TimedOut {
			return zero, &ConditionTimeoutError{Name: name, Timeout: timeout, Looks: out.Looks}
		}
		var v T
		if len(out.Value) > 0 {
			if err := json.Unmarshal(out.Value, &v); err != nil {
				return zero, Permanent(fmt.Errorf("nexjob: condition %q: its recorded value does not decode as %T: %w", name, v, err))
			}
		}
		return v, nil
	}
	if raw, ok, err := peek(ledger.ConditionStep(name, "")); err != nil || ok {
		if err != nil {
			return zero, err
		}
		return decode(raw)
	}
	// The looks so far: each one that found the condition false is the
	// sleep after it (base#n), recorded with its end.
	n := 0
	for ; ; n++ {
		raw, ok, err := peek(ledger.ConditionStep(name, strconv.Itoa(n)))
		if err != nil {
			return zero, err
		}
		if !ok {
			break
		}
		if s.replay != nil {
			s.replay.seen(s, ledger.ConditionStep(name, strconv.Itoa(n)))
		}
		var until int64
		_ = json.Unmarshal([]byte(raw), &until)
		if s.store.Now().UnixMilli() < until {
			return zero, s.sleep(&sleepError{name: name, until: ledger.Millis(until)}) // back early (a duplicate): sleep on
		}
	}
	if s.replay != nil {
		// A look is a call to another system: a replay reaches it and
		// stops, as at a step not recorded.
		return zero, s.replay.reach(s, ledger.ConditionStep(name, strconv.Itoa(n)))
	}
	v, done, err := check(ctx)
	if err != nil {
		return zero, err
	}
	now := s.store.Now()
	if done || now.UnixMilli() >= end {
		out := conditionOutcome{Looks: n + 1, TimedOut: !done}
		if done {
			b, err := json.Marshal(v)
			if err != nil {
				return zero, Permanent(fmt.Errorf("nexjob: condition %q: its value does not encode: %w", name, err))
			}
			out.Value = b
		}
		raw, err := step(ctx, ledger.ConditionStep(name, ""), func(context.Context) (conditionOutcome, error) { return out, nil })
		if err != nil {
			return zero, err
		}
		b, _ := json.Marshal(raw)
		return decode(string(b))
	}
	return zero, sleepUntil(ctx, ledger.ConditionStep(name, strconv.Itoa(n)), ledger.Millis(min(now.Add(every).UnixMilli(), end)))
}
