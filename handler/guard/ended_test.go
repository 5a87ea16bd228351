package guard_test

import (
	"testing"

	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestChangeEnded: a job's end is the same job going from an active state
// to a terminal one; nothing else is (completion events publish these).
func TestChangeEnded(t *testing.T) {
	for _, c := range []struct {
		name string
		c    guard.Change
		want bool
	}{
		{"a run that Succeeded", guard.Change{ID: "a", OldID: "a", Kind: "k", OldState: ledger.Processing, State: ledger.Succeeded}, true},
		{"a waiting job cancelled", guard.Change{ID: "a", OldID: "a", Kind: "k", OldState: ledger.Scheduled, State: ledger.Failed}, true},
		{"a continuation ended with its parent", guard.Change{ID: "a", OldID: "a", Kind: "k", OldState: ledger.AwaitingContinuation, State: ledger.Failed}, true},
		{"a hook's mark cleared", guard.Change{ID: "a", OldID: "a", Kind: "k", OldState: ledger.Failed, State: ledger.Failed}, false},
		{"a requeue", guard.Change{ID: "a", OldID: "a", Kind: "k", OldState: ledger.Failed, State: ledger.Enqueued}, false},
		{"a replaced holder's archive", guard.Change{ID: "a", Kind: "k", State: ledger.Succeeded}, false},
		{"a new job over an ended one", guard.Change{ID: "b", OldID: "a", Kind: "k", OldState: ledger.Processing, State: ledger.Succeeded}, false},
		{"a kept dead letter (inserted Failed)", guard.Change{ID: "a", Kind: ledger.DeadLetterKind, State: ledger.Failed}, false},
		{"a team's job of the DLQ records' kind", guard.Change{ID: "a", OldID: "a", Kind: ledger.DeadLetterKind, OldState: ledger.Processing, State: ledger.Succeeded}, true},
		{"not a job", guard.Change{OldState: ledger.Processing, State: ledger.Failed}, false},
	} {
		if got := c.c.Ended(); got != c.want {
			t.Errorf("%s: Ended() = %v, want %v", c.name, got, c.want)
		}
	}
}
