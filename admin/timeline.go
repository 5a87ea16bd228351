package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Event is one line of a durable job's timeline (Timeline).
type Event struct {
	At    int64  // unix ms it was recorded; 0 when not kept (a step on the record)
	What  string // for people; every user's name is quoted (%q), never markup
	Name  string // the step's name as recorded
	Size  int    // its value's bytes
	Where string // "record" or "steps table"
	Value string // its value (JSON): shown only on request, escaped and capped by the viewer
}

// MaxTimelineChildren bounds how many children's states Timeline reads
// (one GetItem each); the others are listed by id.
const MaxTimelineChildren = 50

// Timeline returns job id's record and its durable timeline: each step
// (its name, when it was written, its size and where it is kept), the
// sleeps and waits with their ends, the signals received, the callback
// tokens issued, a step's retries, the children it started (with their
// states, read) and their ends, the compensations that ran, a condition's
// looks. Values are in Event.Value, for a viewer to show on request. One
// GetItem, one Query per MB of steps, one GetItem per child (at most
// MaxTimelineChildren), and a GetObject for args and a result kept in
// the blob bucket (Record.Args and Result then hold them).
func (a *Admin) Timeline(ctx context.Context, id string) (ledger.Record, []Event, error) {
	rec, err := a.store.Get(ctx, id)
	if err != nil {
		return rec, nil, err
	}
	if rec.ArgsBlob != "" {
		// Args over the record's room: read from the blob bucket (not
		// renewed: a reader writes nothing).
		if rec.Args, err = a.store.ArgsOf(ctx, rec, false); err != nil {
			return rec, nil, err
		}
	}
	if rec.ResultBlob != "" {
		// A result over the record's room: read from the blob bucket, so a
		// viewer shows it (or its size) as any other.
		if rec.Result, err = a.store.ResultOf(ctx, rec); err != nil {
			return rec, nil, err
		}
	}
	items, err := a.store.StepItems(ctx, rec)
	if err != nil {
		return rec, nil, err
	}
	children := 0
	var evs []Event
	for _, it := range items {
		ev := Event{At: it.At, Name: it.Name, Size: len(it.Value), Where: it.Where, Value: it.Value}
		ev.What = a.describe(ctx, it, &children)
		evs = append(evs, ev)
	}
	return rec, evs, nil
}

// describe says what step it records.
func (a *Admin) describe(ctx context.Context, it ledger.StepItem, children *int) string {
	when := func(v string) string {
		ms, err := strconv.ParseInt(strings.Trim(v, `"`), 10, 64)
		if err != nil {
			return v
		}
		return ledger.Millis(ms).UTC().Format(time.RFC3339)
	}
	n := it.Name
	cut := func(prefix string) (string, bool) { return strings.CutPrefix(n, prefix) }
	if s, ok := cut(ledger.WaitStep("")); ok {
		return fmt.Sprintf("waits for signal %q until %s", s, when(it.Value))
	}
	if s, ok := cut(ledger.SignalStep("")); ok {
		if it.Value == ledger.TimedOut {
			return fmt.Sprintf("the wait for signal %q timed out", s)
		}
		return fmt.Sprintf("signal %q received (%d bytes)", s, len(it.Value))
	}
	if s, ok := cut(ledger.TokenStep("")); ok {
		return fmt.Sprintf("callback token issued for signal %q", s)
	}
	if s, ok := ledger.IsInvokeStep(n); ok {
		var child string
		_ = json.Unmarshal([]byte(it.Value), &child)
		state := "state not read"
		if *children < MaxTimelineChildren {
			*children++
			if c, err := a.store.Get(ctx, child); err == nil {
				state = string(c.State)
			} else {
				state = err.Error()
			}
		}
		return fmt.Sprintf("child %q started: job %s (%s)", s, child, state)
	}
	if s, ok := cut(ledger.ChildStep("")); ok {
		var o ledger.ChildOutcome
		_ = json.Unmarshal([]byte(it.Value), &o)
		if o.State == ledger.TimedOutState {
			return fmt.Sprintf("the wait for child %s timed out", s)
		}
		return fmt.Sprintf("child %s ended %s", s, o.State)
	}
	if _, ok := cut(ledger.AwaitStep("")); ok {
		return fmt.Sprintf("waits for children until %s", when(it.Value))
	}
	if s, ok := cut(ledger.CompensationStep("")); ok {
		return fmt.Sprintf("compensation %q ran", s)
	}
	if s, ok := cut(ledger.ConditionStep("", "")); ok {
		name, look, isLook := strings.Cut(s, "#")
		switch {
		case isLook && look == "end":
			return fmt.Sprintf("condition %q: waits until %s", name, when(it.Value))
		case isLook:
			return fmt.Sprintf("condition %q: look %s found it false; sleeps until %s", name, look, when(it.Value))
		}
		return fmt.Sprintf("condition %q: ended (%d bytes)", name, len(it.Value))
	}
	if _, ok := cut("nexjob:try:"); ok {
		return fmt.Sprintf("a step's call failed and is retried: %s", oneLine(it.Value))
	}
	if _, ok := cut("nexjob:retry:"); ok {
		return fmt.Sprintf("a step's retry sleeps until %s", when(it.Value))
	}
	if _, ok := cut("nexjob:any:"); ok {
		return "a wait for any of several signals chose one"
	}
	return fmt.Sprintf("step %q (%d bytes, %s)", n, len(it.Value), it.Where)
}

// oneLine is s on one line, at most 200 bytes, quoted.
func oneLine(s string) string {
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strconv.Quote(s)
}
