package nexjobtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/replay"
)

// RunSteps bounds RunToEnd: how many times it may move the clock to the
// next job due.
const RunSteps = 1000

// runHorizon is how far ahead RunToEnd looks for the next job due: past
// the longest sleep or wait (handler.MaxWait), twice.
const runHorizon = 2 * handler.MaxWait

// RunToEnd runs job id to its end with time advancing by itself: each
// pass runs what is due (Drain's DrainNow), and when nothing is due the
// Env's clock jumps to the earliest job Scheduled, however far ahead (a
// retry's backoff, a sleep of a month, a wait's timeout, a child's
// retry): a durable job whose sleeps and waits span a year ends in the
// time its runs take. It returns the job's record, its steps whole. It
// fails the test, naming every job still pending (its state, run time,
// attempt and last error), when the job has not ended after RunSteps
// jumps, or when nothing is left to run and the job waits for what only
// the test can send (a signal, a callback): send it, and call RunToEnd
// again. It needs the Env's own clock (not Options.Ledger.Now) and h
// reading it (Env.Handler).
func (e *Env) RunToEnd(t testing.TB, h *handler.Handler, id string) ledger.Record {
	t.Helper()
	if e.clock == nil {
		t.Fatal("nexjobtest: RunToEnd needs the Env's own clock (Options.Ledger.Now was set)")
	}
	for range RunSteps {
		e.DrainNow(t, h)
		rec := e.Get(t, id)
		if rec.State.Terminal() {
			return rec
		}
		next, ok := e.nextScheduled(t, e.Now(), runHorizon, false)
		if !ok {
			t.Fatalf("nexjobtest: job %s is %s and nothing is scheduled to move it (it waits for a signal or a callback the test must send?); pending:\n%s", id, rec.State, e.Pending(t))
		}
		if d := next.Sub(e.Now()); d > 0 {
			e.Advance(t, d)
		}
	}
	t.Fatalf("nexjobtest: job %s has not ended after %d moves of the clock; pending:\n%s", id, RunSteps, e.Pending(t))
	return ledger.Record{}
}

// Pending lists the jobs that have not ended, one a line: id, kind,
// state, run time (on the Env's clock), attempt of max, and last error.
func (e *Env) Pending(t testing.TB) string {
	t.Helper()
	var lines []string
	now := e.Now()
	for _, r := range e.Scan(t) {
		if r.ID == "" || r.State.Terminal() || r.ExpiredAt(now) {
			continue
		}
		at := "now"
		if r.RunAt != 0 {
			at = fmt.Sprintf("%s (in %s)", ledger.Millis(r.RunAt).UTC().Format(time.RFC3339), ledger.Millis(r.RunAt).Sub(now).Round(time.Second))
		}
		lines = append(lines, fmt.Sprintf("  %s %s %s run at %s, attempt %d of %d, last error %q", r.ID, r.Kind, r.State, at, r.Attempt, r.MaxAttempts, r.LastError))
	}
	slices.Sort(lines)
	if len(lines) == 0 {
		return "  (none)"
	}
	return strings.Join(lines, "\n")
}

// Export is replay's export of the Env's open jobs of kind (the steps
// whole), at the Env's clock: what `nexjob export KIND` prints for a
// deployment. Write it to a file with replay.Write to commit it for
// CheckReplay.
func (e *Env) Export(t testing.TB, kind string, o *replay.Options) replay.Export {
	t.Helper()
	ex, err := replay.Read(context.Background(), e.Client.Store(), kind, o)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// CheckReplay replays the open jobs exported to path (`nexjob export
// KIND > path`, or replay.Write) against reg, with no side effects and
// no AWS call (package replay), and fails the test with each divergence:
// a recorded step the code no longer reaches, a wait it no longer waits
// in, a value that no longer decodes. A team's CI runs it on a committed
// export before a deploy.
func CheckReplay(t testing.TB, reg *handler.Registry, path string) replay.Report {
	t.Helper()
	ex, err := replay.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := replay.Check(context.Background(), reg, ex)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Divergences {
		t.Errorf("replay check: %s", d)
	}
	return rep
}
