package ledger

import "fmt"

// State is where a job stands in its life. The zero value is not a state.
type State string

// The seven states of NexJob's state machine.
const (
	Enqueued             State = "Enqueued"
	Scheduled            State = "Scheduled"
	Processing           State = "Processing"
	AwaitingContinuation State = "AwaitingContinuation"
	Succeeded            State = "Succeeded"
	Failed               State = "Failed"
	Expired              State = "Expired"
)

// ActiveStates are the states in which a job with an idempotency key is
// always deduplicated, whatever the DuplicatePolicy.
var ActiveStates = []State{Enqueued, Scheduled, Processing, AwaitingContinuation}

// TerminalStates are the states a job never leaves on its own. Re-using the
// key of a terminal job is governed by the DuplicatePolicy.
var TerminalStates = []State{Succeeded, Failed, Expired}

// Active reports whether s is one of ActiveStates.
func (s State) Active() bool {
	switch s {
	case Enqueued, Scheduled, Processing, AwaitingContinuation:
		return true
	}
	return false
}

// Terminal reports whether s is one of TerminalStates.
func (s State) Terminal() bool {
	switch s {
	case Succeeded, Failed, Expired:
		return true
	}
	return false
}

// Valid reports whether s is one of the seven states.
func (s State) Valid() bool { return s.Active() || s.Terminal() }

// DuplicatePolicy decides what an enqueue with the key of a terminal job does.
// Active jobs are always deduplicated. The zero value is AllowAfterFailed.
type DuplicatePolicy int

const (
	// AllowAfterFailed (the default) creates a new job once the existing one
	// has reached any terminal state.
	AllowAfterFailed DuplicatePolicy = iota
	// RejectIfFailed rejects re-use of a key whose job Failed; Succeeded and
	// Expired jobs may be repeated.
	RejectIfFailed
	// RejectAlways rejects re-use of a key whose job is in any terminal state.
	RejectAlways
)

// Valid reports whether p is one of the three policies.
func (p DuplicatePolicy) Valid() bool { return p >= AllowAfterFailed && p <= RejectAlways }

// String returns the policy's name as NexJob spells it.
func (p DuplicatePolicy) String() string {
	switch p {
	case AllowAfterFailed:
		return "AllowAfterFailed"
	case RejectIfFailed:
		return "RejectIfFailed"
	case RejectAlways:
		return "RejectAlways"
	}
	return fmt.Sprintf("DuplicatePolicy(%d)", int(p))
}

// ParsePolicy is String's inverse.
func ParsePolicy(name string) (DuplicatePolicy, error) {
	for p := AllowAfterFailed; p <= RejectAlways; p++ {
		if p.String() == name {
			return p, nil
		}
	}
	return 0, fmt.Errorf("nexjob: unknown DuplicatePolicy %q", name)
}

// ReusableStates lists the terminal states whose key p lets a new job take.
func (p DuplicatePolicy) ReusableStates() []State {
	switch p {
	case AllowAfterFailed:
		return []State{Succeeded, Failed, Expired}
	case RejectIfFailed:
		return []State{Succeeded, Expired}
	}
	return nil
}

// Allows reports whether p lets a new job take the key of a job in state s.
func (p DuplicatePolicy) Allows(s State) bool {
	for _, r := range p.ReusableStates() {
		if r == s {
			return true
		}
	}
	return false
}
