package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nexjob/nexjob-aws/ledger"
)

// kidFails reports whether rec is a Kid made to fail.
func kidFails(rec ledger.Record) bool {
	var k Kid
	return json.Unmarshal([]byte(rec.Args), &k) == nil && k.Fail
}

// checkChildren holds the child jobs' promises (handler.Invoke) over the
// Invoker jobs' records, their children's records and the Invoker's
// steps (its own and those its children's ends wrote):
//   - a child is started once per caller and name: no two children of a
//     caller have the same index;
//   - a child's end is recorded once in its caller: the caller's
//     ChildEnds is the number of its children whose end its steps keep,
//     every ended child's outcome is there, and it is the child's end
//     (its state, its result), or the caller's timeout that came first;
//   - the caller reads what its steps keep: a Succeeded Invoker's "sum"
//     is the sum of its children's results, its failures and timeouts;
//   - a compensation runs once, and only when promised: an Invoker that
//     Succeeded ran none; one that ended Failed for good (a child failed,
//     or an operator's cancel once it declared it) has its compensation's
//     step recorded and ran it, once, or again only when a worker was
//     killed in one of its runs (between the call and its record);
//   - a caller asleep in its wait is woken by its children's ends: none
//     is left waiting once every child ended (checker ends: no record
//     waits for ever).
func checkChildren(_ context.Context, f *facts) []string {
	var bad []string
	kids := map[string][]ledger.Record{}
	for _, r := range f.recs {
		if r.Caller != "" {
			kids[r.Caller] = append(kids[r.Caller], r)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(kids)) {
		if _, ok := f.byID[id]; !ok {
			bad = append(bad, f.fail(id, "%d children name it as their caller, and it has no record", len(kids[id])))
		}
	}
	selects := map[string][]signalSent{}
	f.led.mu.Lock()
	for _, s := range f.led.selects {
		selects[s.id] = append(selects[s.id], s)
	}
	f.led.mu.Unlock()
	for _, rec := range f.recs {
		if rec.Kind != (Invoker{}).Kind() {
			continue
		}
		rec = f.byID[rec.ID] // with its steps
		var a Invoker
		_ = json.Unmarshal([]byte(rec.Args), &a)
		byIndex := map[int]ledger.Record{}
		for _, k := range kids[rec.ID] {
			var ka Kid
			_ = json.Unmarshal([]byte(k.Args), &ka)
			if o, dup := byIndex[ka.I]; dup {
				bad = append(bad, f.fail(rec.ID, "child %d started twice: jobs %s and %s", ka.I, o.ID, k.ID))
			}
			byIndex[ka.I] = k
		}
		ends := 0 // children whose own end is what the caller keeps (not a timeout)
		sum, failed, late, read := 0, 0, 0, 0
		for i, k := range byIndex {
			raw, ok := rec.Steps[ledger.ChildStep(k.ID)]
			if !ok {
				if k.State.Terminal() {
					bad = append(bad, f.fail(rec.ID, "child %d (%s) ended %s and its caller's steps do not hold its end", i, k.ID, k.State))
				}
				continue
			}
			read++
			var o ledger.ChildOutcome
			if err := json.Unmarshal([]byte(raw), &o); err != nil {
				bad = append(bad, f.fail(rec.ID, "child %d's outcome does not decode: %v", i, err))
				continue
			}
			if o.State != ledger.TimedOutState {
				ends++
			}
			switch {
			case o.State == ledger.TimedOutState:
				late++
			case o.State != k.State:
				bad = append(bad, f.fail(rec.ID, "child %d (%s) is %s, its caller's steps keep %s", i, k.ID, k.State, o.State))
			case o.State == ledger.Succeeded && strings.TrimSpace(string(o.Result)) != k.Result:
				bad = append(bad, f.fail(rec.ID, "child %d (%s) returned %s, its caller's steps keep %s", i, k.ID, k.Result, o.Result))
			case o.State == ledger.Succeeded:
				var v int
				_ = json.Unmarshal(o.Result, &v)
				sum += v
			default:
				failed++
			}
		}
		if rec.ChildEnds != ends {
			bad = append(bad, f.fail(rec.ID, "its record counts %d child ends, its steps keep %d", rec.ChildEnds, ends))
		}
		if s, ok := rec.Steps["sum"]; ok && read == a.Kids {
			if want := fmt.Sprint(sum*10_000 + failed*100 + late); s != want {
				bad = append(bad, f.fail(rec.ID, "its run read %s of its children, their outcomes make %s", s, want))
			}
		}
		bad = append(bad, f.checkSelect(rec, a, selects[rec.ID])...)
		if f.rep != nil && f.rep.Flow != nil {
			f.rep.Flow["children"] += len(byIndex)
			f.rep.Flow["child timeouts"] += late
		}
		undos := 0
		for _, l := range f.rs.steps[rec.ID] {
			if l.name == "undo" && !l.got {
				undos++
			}
		}
		_, compensated := rec.Steps[ledger.CompensationStep("undo"+a.Sfx)]
		if compensated && f.rep != nil && f.rep.Flow != nil {
			f.rep.Flow["compensated"]++
		}
		killed := false
		for _, r := range f.rs.byJob[rec.ID] {
			if r.end == 0 {
				killed = true
			}
		}
		switch {
		case rec.State == ledger.Succeeded && (undos > 0 || compensated):
			bad = append(bad, f.fail(rec.ID, "Succeeded, and its compensation ran %d times (recorded %v)", undos, compensated))
		case rec.State == ledger.Failed && strings.Contains(rec.LastError, "soak: a child failed") && (!compensated || undos == 0):
			bad = append(bad, f.fail(rec.ID, "failed for good (%s) and its compensation ran %d times (recorded %v)", rec.LastError, undos, compensated))
		case undos > 1 && !killed:
			bad = append(bad, f.fail(rec.ID, "its compensation ran %d times, and no run of it was killed", undos))
		case undos > 0 && !compensated && rec.State.Terminal() && !f.orphaned(rec):
			bad = append(bad, f.fail(rec.ID, "its compensation ran and its step was never recorded (%s)", rec.State))
		}
		if rec.State == ledger.Succeeded && len(byIndex) != a.Kids {
			bad = append(bad, f.fail(rec.ID, "Succeeded with %d children recorded, it starts %d", len(byIndex), a.Kids))
		}
	}
	return bad
}

// checkSelect holds an Invoker's select (handler.WaitForAny) to its
// promises, over the signals its producer sent (sent) and what its runs
// got (one value on every run: checker durable):
//   - it chose a name only if a signal of that name was sent;
//   - it timed out only if no signal of its names was accepted (a call
//     that returned nil landed before the choice, or after it, never
//     after the timeout: ErrSignalTooLate);
//   - a Succeeded Invoker with a select made its choice (logged it).
func (f *facts) checkSelect(rec ledger.Record, a Invoker, sent []signalSent) []string {
	if !a.Select {
		return nil
	}
	var bad []string
	chosen, ok := "", false
	for _, l := range f.rs.steps[rec.ID] {
		if l.got && l.name == "select" {
			chosen, ok = l.value, true
		}
	}
	if f.rep != nil && f.rep.Flow != nil && ok {
		f.rep.Flow["selects"]++
	}
	switch {
	case !ok && rec.State == ledger.Succeeded:
		bad = append(bad, f.fail(rec.ID, "Succeeded with a select that chose nothing"))
	case !ok:
	case chosen == "-1":
		for _, s := range sent {
			if s.err == nil {
				bad = append(bad, f.fail(rec.ID, "its select timed out, and the signal %q was accepted", SelectNames[s.payload]+a.Sfx))
			}
		}
	default:
		found := false
		for _, s := range sent {
			found = found || strconv.Itoa(s.payload) == chosen
		}
		if !found {
			bad = append(bad, f.fail(rec.ID, "its select chose %s, a name no one signalled", chosen))
		}
	}
	return bad
}
