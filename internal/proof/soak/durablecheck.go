package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// signalSent is one producer's Signal call to a Durable job.
type signalSent struct {
	id      string
	payload int
	err     error
}

// wokeSlack is how early a Durable job may wake in real time: the
// worker whose clock runs Config.Skew ahead reads the nap's end that much
// sooner, and the logs' clock is read after the ledger's.
const wokeSlack = 50 * time.Millisecond

// checkDurable holds the durable jobs' promises over their step logs
// (loggedStep), their records and the producers' signals:
//   - a step whose result was recorded never runs again: no call of a
//     step's function after the first time the step returned its result
//     (it returns only a recorded or replayed result), and every return of
//     a step is the same value, the one the record keeps;
//   - a sleeping job wakes once (its "woke" step, above), not before its
//     time: the wake is at or after the nap's end the record keeps (less
//     the skewed worker's lead);
//   - a signalled job resumes once with the payload: a signal whose call
//     returned nil is what the job's "signal" step got; one refused as
//     too late, the job timed out (-1); the first signal of a name is
//     never refused as already sent (a lost reply's resend meets its own);
//   - every result read matches what the run recorded: a Succeeded job's
//     result, read through the client as a user reads it, is its steps'
//     values.
func checkDurable(ctx context.Context, f *facts) []string {
	var bad []string
	signals := map[string][]signalSent{}
	f.led.mu.Lock()
	for _, s := range f.led.signals {
		signals[s.id] = append(signals[s.id], s)
	}
	f.led.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(f.rs.steps)) {
		rec, kept := f.byID[id]
		got := map[string]string{}
		first := map[string]int64{}
		for _, l := range f.rs.steps[id] {
			if !l.got {
				continue
			}
			if v, ok := got[l.name]; ok && v != l.value {
				bad = append(bad, f.fail(id, "step %q returned %s and %s", l.name, v, l.value))
			}
			got[l.name] = l.value
			if first[l.name] == 0 || l.at < first[l.name] {
				first[l.name] = l.at
			}
		}
		for _, l := range f.rs.steps[id] {
			if !l.got && first[l.name] != 0 && l.at > first[l.name] {
				bad = append(bad, f.fail(id, "step %q ran again (pid %d) %s after its result %s was recorded", l.name, l.pid, time.Duration(l.at-first[l.name]), got[l.name]))
			}
		}
		if !kept || rec.Kind != (Durable{}).Kind() {
			continue // its record is gone (nothing removes a Durable job's record before quiet: checkRecords says so), or an Invoker's (checker children)
		}
		sfx := durableArgs(rec).Sfx // the record's steps are named with it, the logs without
		for name, v := range got {
			if r, ok := rec.Steps[name+sfx]; !ok || r != v {
				bad = append(bad, f.fail(id, "step %q returned %s, the record keeps %q", name+sfx, v, r))
			}
		}
		if w, ok := got["woke"]; ok {
			woke, _ := strconv.ParseInt(w, 10, 64)
			nap, _ := strconv.ParseInt(rec.Steps["nap"+sfx], 10, 64)
			if early := time.Duration(nap-woke) * time.Millisecond; early > f.c.Skew+wokeSlack {
				bad = append(bad, f.fail(id, "woke %s before its nap's end", early))
			}
		}
		for _, s := range signals[id] {
			switch sig := got["signal"]; {
			case s.err == nil && sig != "" && sig != strconv.Itoa(s.payload):
				bad = append(bad, f.fail(id, "signalled %d, its wait returned %s", s.payload, sig))
			case s.err == nil && rec.State == ledger.Succeeded && sig == "":
				bad = append(bad, f.fail(id, "signalled %d and Succeeded with no signal step", s.payload))
			case errors.Is(s.err, ledger.ErrSignalTooLate) && sig != "" && sig != "-1":
				bad = append(bad, f.fail(id, "its signal was refused as too late, and its wait returned %s", sig))
			case errors.Is(s.err, ledger.ErrSignalSent) && len(signals[id]) == 1:
				bad = append(bad, f.fail(id, "its only signal was refused as sent already"))
			}
		}
		if rec.State == ledger.Succeeded {
			r, err := f.durableResult(ctx, rec)
			if err != nil {
				bad = append(bad, f.fail(id, "its result does not read: %v", err))
				continue
			}
			want := fmt.Sprintf("%s %s %s", got["draw"], got["woke"], got["signal"])
			if have := fmt.Sprintf("%d %d %d", r.Draw, r.Woke, r.Signal); have != want {
				bad = append(bad, f.fail(id, "its result reads %s, its steps returned %s", have, want))
			}
		}
	}
	// A fold joins only a job that never ran: no run of a job finds args
	// other than those its first run recorded.
	for _, id := range slices.Sorted(maps.Keys(f.rs.argsChanged)) {
		for _, l := range f.rs.argsChanged[id] {
			bad = append(bad, f.fail(id, "a run's args were not its first run's: %s", l))
		}
	}
	// A call that said what did not happen (a Cancel that reported a job
	// still active not cancellable: it lost a race with the job's run).
	f.led.mu.Lock()
	bad = append(bad, f.led.misreports...)
	f.led.mu.Unlock()
	// Every Durable job that Succeeded logged its steps.
	for _, rec := range f.recs {
		if rec.Kind == (Durable{}).Kind() && rec.State == ledger.Succeeded && len(f.rs.steps[rec.ID]) == 0 {
			bad = append(bad, f.fail(rec.ID, "a durable job Succeeded with no step logged"))
		}
	}
	return bad
}

// durableArgs is rec's args as a Durable job (zero if they do not
// decode).
func durableArgs(rec ledger.Record) Durable {
	var a Durable
	_ = json.Unmarshal([]byte(rec.Args), &a)
	return a
}

// durableResult reads rec's result as a user does, through the client
// (Client.Result); the checker's own tests, with no client, decode the
// record's.
func (f *facts) durableResult(ctx context.Context, rec ledger.Record) (DurableResult, error) {
	var r DurableResult
	if f.cl == nil {
		return r, json.Unmarshal([]byte(rec.Result), &r)
	}
	return r, f.cl.Result(ctx, rec.ID, &r)
}
