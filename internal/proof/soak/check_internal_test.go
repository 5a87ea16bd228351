package soak

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestConcurrencyViolations: the checker counts overlapping runs of one
// tenant's limited jobs from the run logs: three at once is one over the
// limit of two; back to back is no overlap; other tenants and runs with no
// logged end do not count.
func TestConcurrencyViolations(t *testing.T) {
	recs := []ledger.Record{
		{ID: "a", Kind: "soak.limited", Args: `{"N":1,"Tenant":"t0"}`},
		{ID: "b", Kind: "soak.limited", Args: `{"N":2,"Tenant":"t0"}`},
		{ID: "c", Kind: "soak.limited", Args: `{"N":3,"Tenant":"t0"}`},
		{ID: "d", Kind: "soak.limited", Args: `{"N":4,"Tenant":"t1"}`},
	}
	rs := runs{byJob: map[string][]*run{
		"a": {{id: "a", start: 0, end: 10}},
		"b": {{id: "b", start: 10, end: 20}}, // back to back with a
		"c": {{id: "c", start: 5, end: 0}},   // killed: no end logged
		"d": {{id: "d", start: 0, end: 30}},
	}}
	if bad := concurrencyViolations(recs, rs); len(bad) != 0 {
		t.Fatalf("no overlap beyond the limit, got %v", bad)
	}
	rs.byJob["c"] = []*run{{id: "c", start: 5, end: 15}}
	rs.byJob["b"] = []*run{{id: "b", start: 8, end: 20}}
	bad := concurrencyViolations(recs, rs)
	if len(bad) != 1 || !strings.Contains(bad[0], "tenant t0: 3 runs") {
		t.Fatalf("a, b and c overlap at 8..10: got %v", bad)
	}
}

// TestThrottleCheck: ThrottleLimit+1 starts of one tenant within the
// allowed span are a violation (a backlog starting together); spread
// starts and other tenants' are not.
func TestThrottleCheck(t *testing.T) {
	sec := int64(time.Second)
	f := &facts{c: Config{Skew: 2 * time.Second}, rs: runs{byJob: map[string][]*run{}}}
	add := func(id, tenant string, start int64) {
		f.recs = append(f.recs, ledger.Record{ID: id, Kind: "soak.throttled", Args: `{"N":1,"Tenant":"` + tenant + `"}`})
		f.rs.byJob[id] = []*run{{id: id, start: start}}
	}
	for i := range 6 {
		add(fmt.Sprint("a", i), "t0", int64(i)*sec/5*2) // 0.4 s apart: 6 span 2 s, over the 1 s the lag and skew leave of 4 s
		add(fmt.Sprint("b", i), "t1", int64(i)*sec)
	}
	if bad := checkThrottle(context.Background(), f); len(bad) != 0 {
		t.Fatalf("starts spread as the throttle allows: %v", bad)
	}
	for i := range 5 {
		add(fmt.Sprint("d", i), "t2", 60*sec+int64(i)) // a backlog starting together
	}
	add("d5", "t2", 60*sec+10)
	bad := checkThrottle(context.Background(), f)
	if len(bad) != 1 || !strings.Contains(bad[0], "tenant t2") {
		t.Fatalf("the backlog of t2 started together: got %v", bad)
	}
}

// TestRateLimitCheck: a refusal with fewer than RateLimitLimit calls of
// its key within a Period is a violation; a refusal after two is not.
func TestRateLimitCheck(t *testing.T) {
	at := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	call := func(key string, d time.Duration, limited bool) *result {
		return &result{rlKey: key, at: at.Add(d), done: at.Add(d + 10*time.Millisecond), limited: limited}
	}
	f := &facts{led: &ledgerOf{}}
	f.led.all = []*result{call("k", 0, false), call("k", 20*time.Millisecond, false), call("k", 40*time.Millisecond, true)}
	if bad := checkRateLimit(context.Background(), f); len(bad) != 0 {
		t.Fatalf("the third in a burst of three refused: %v", bad)
	}
	f.led.all = append(f.led.all, call("j", 5*time.Second, false), call("j", 5*time.Second+20*time.Millisecond, true))
	if bad := checkRateLimit(context.Background(), f); len(bad) != 1 || !strings.Contains(bad[0], "on j") {
		t.Fatalf("a refusal at 1 of 2: got %v", bad)
	}
}

// TestFiringsCheck: a firing that made two jobs, or a job a firing made
// that never ran to its end, is a violation.
func TestFiringsCheck(t *testing.T) {
	f := &facts{led: &ledgerOf{}, rs: runs{byJob: map[string][]*run{"j1": {{id: "j1", ok: true}}, "j2": {{id: "j2", ok: true}}, "j3": {{id: "j3"}}}}}
	f.led.all = []*result{
		{call: "firing", firing: "T1", id: "j1", created: true},
		{call: "firing", firing: "T1", id: "j1", duplicate: true},
		{call: "firing", firing: "T2", id: "j2", created: true},
	}
	if bad := checkFirings(context.Background(), f); len(bad) != 0 {
		t.Fatalf("one job a firing, each run: %v", bad)
	}
	f.led.all = append(f.led.all, &result{call: "firing", firing: "T1", id: "j3", created: true})
	bad := checkFirings(context.Background(), f)
	if len(bad) != 2 || !strings.Contains(bad[0], "T1 made 2 jobs") || !strings.Contains(bad[1], "never ran to its end") {
		t.Fatalf("a late retry made a second job, which never ran: got %v", bad)
	}
	// Every claim of a firing's job killed before its run reported: an
	// orphan out of attempts, as kills allow; failed otherwise, it is not.
	f.led.all = f.led.all[:3]
	f.led.all = append(f.led.all, &result{call: "firing", firing: "T4", id: "j4", created: true}, &result{call: "firing", firing: "T5", id: "j5", created: true})
	f.byID = map[string]ledger.Record{
		"j4": {ID: "j4", State: ledger.Failed, Attempt: 3, MaxAttempts: 3, LastError: "nexjob: orphaned job: no attempts are left"},
		"j5": {ID: "j5", State: ledger.Failed, Attempt: 0, MaxAttempts: 3, LastError: "nexjob: the job never started"},
	}
	bad = checkFirings(context.Background(), f)
	if len(bad) != 1 || !strings.Contains(bad[0], "j5") || !strings.Contains(bad[0], "never started") {
		t.Fatalf("an orphan out of attempts, and a job failed unrun: got %v", bad)
	}
	// Records gone (the next firing replaced them): one a worker logged
	// failing as an orphan out of attempts ended so; one with no such
	// line did not end as far as anyone knows.
	f.rs.dir = t.TempDir()
	line := "time=2026-12-06T04:15:29.024Z level=WARN msg=\"nexjob: " + orphanFailed + "\" job_id=j6 kind=soak.fired attempt=3\n"
	if err := os.WriteFile(filepath.Join(f.rs.dir, "worker-0.runs.log"), []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	f.led.all = append(f.led.all[:3], &result{call: "firing", firing: "T6", id: "j6", created: true}, &result{call: "firing", firing: "T7", id: "j7", created: true})
	bad = checkFirings(context.Background(), f)
	if len(bad) != 1 || !strings.Contains(bad[0], "j7") || !strings.Contains(bad[0], "its record gone") {
		t.Fatalf("gone, one logged failing as an orphan: got %v", bad)
	}
}

// TestRecordOfAnUnsentDuplicate: a call that met the key's holder and
// could not send it again (a *DispatchError) made no job: a late
// firing's retry that got the next firing's job back is no second job
// of its firing.
func TestRecordOfAnUnsentDuplicate(t *testing.T) {
	de := &enqueue.DispatchError{JobID: "b", Err: errors.New("throttled")}
	if r := record(&result{}, enqueue.Result{ID: "b", Duplicate: true}, de); r.created || !r.duplicate || r.id != "b" {
		t.Fatalf("met and not sent: %+v; want a duplicate", r)
	}
	de = &enqueue.DispatchError{JobID: "a", Err: errors.New("throttled")}
	if r := record(&result{}, enqueue.Result{ID: "a"}, de); !r.created || r.duplicate || r.id != "a" {
		t.Fatalf("created and not sent: %+v; want created", r)
	}
}

// TestDurableCheck: each durable promise's break is a violation, and a
// job that kept them is none.
func TestDurableCheck(t *testing.T) {
	good := []stepLine{
		{name: "draw", value: "7", at: 10, pid: 1},
		{name: "draw", value: "7", at: 11, pid: 1, got: true},
		{name: "draw", value: "7", at: 30, pid: 2, got: true}, // replayed by a retry
		{name: "woke", value: "5000", at: 31, pid: 2},
		{name: "woke", value: "5000", at: 32, pid: 2, got: true},
		{name: "signal", value: "42", at: 33, pid: 2},
		{name: "signal", value: "42", at: 34, pid: 2, got: true},
	}
	rec := ledger.Record{ID: "d1", Kind: "soak.durable", State: ledger.Succeeded,
		Steps:  map[string]string{"draw": "7", "nap": "4000", "woke": "5000", "signal": "42"},
		Result: `{"Draw":7,"Woke":5000,"Signal":42}`}
	var changed map[string][]string // a run's args not its first run's
	var misreports []string
	run := func(lines []stepLine, rec ledger.Record, sig signalSent) []string {
		f := &facts{led: &ledgerOf{signals: []signalSent{sig}, misreports: misreports}, rs: runs{steps: map[string][]stepLine{"d1": lines}, argsChanged: changed},
			byID: map[string]ledger.Record{"d1": rec}, recs: []ledger.Record{rec}, c: Config{Skew: 2 * time.Second}}
		return checkDurable(context.Background(), f)
	}
	sent := signalSent{id: "d1", payload: 42}
	if bad := run(good, rec, sent); len(bad) != 0 {
		t.Fatalf("a job that kept every promise: %v", bad)
	}
	again := append(slices.Clone(good), stepLine{name: "draw", value: "8", at: 20, pid: 3})
	early := slices.Clone(good)
	early[3].value, early[4].value = "1000", "1000"
	earlyRec := rec
	earlyRec.Steps = maps.Clone(rec.Steps)
	earlyRec.Steps["woke"], earlyRec.Result = "1000", `{"Draw":7,"Woke":1000,"Signal":42}`
	wrongResult := rec
	wrongResult.Result = `{"Draw":8,"Woke":5000,"Signal":42}`
	for _, c := range []struct {
		name  string
		lines []stepLine
		rec   ledger.Record
		sig   signalSent
		want  string
	}{
		{"a step run again after its result was recorded", again, rec, sent, `step "draw" ran again`},
		{"a wake before the nap's end", early, earlyRec, sent, "before its nap's end"},
		{"a signal's payload not what the wait returned", good, rec, signalSent{id: "d1", payload: 41}, "signalled 41, its wait returned 42"},
		{"its only signal refused as sent", good, rec, signalSent{id: "d1", payload: 42, err: ledger.ErrSignalSent}, "refused as sent already"},
		{"a result read that is not the steps'", good, wrongResult, sent, "its result reads 8 5000 42"},
	} {
		bad := run(c.lines, c.rec, c.sig)
		if len(bad) != 1 || !strings.Contains(bad[0], c.want) {
			t.Errorf("%s: got %v, want one violation saying %q", c.name, bad, c.want)
		}
	}
	// Names with a suffix: the record keeps them whole, the logs without.
	sfx := rec
	sfx.Args = `{"N":1,"Sfx":"a.b[1]"}`
	sfx.Steps = map[string]string{}
	for k, v := range rec.Steps {
		sfx.Steps[k+"a.b[1]"] = v
	}
	if bad := run(good, sfx, sent); len(bad) != 0 {
		t.Errorf("a job whose names end in a.b[1], that kept every promise: %v", bad)
	}
	changed = map[string][]string{"d1": {"recorded N 1, ran with N 2 (pid 3)"}}
	if bad := run(good, rec, sent); len(bad) != 1 || !strings.Contains(bad[0], "args were not its first run's") {
		t.Errorf("a fold into a job that ran: got %v, want one violation", bad)
	}
	changed, misreports = nil, []string{"job d1: Cancel reported nexjob: job d1 is Scheduled; only Enqueued or Scheduled jobs can be cancelled"}
	if bad := run(good, rec, sent); len(bad) != 1 || !strings.Contains(bad[0], "Cancel reported") {
		t.Errorf("a Cancel that reported an active job not cancellable: got %v, want one violation", bad)
	}
}

// TestCallsCheck: the idempotent calls' checker passes a clean history
// and names each kind of break: a replay of a value no run returned, two
// replays that differ, a run after a recorded result, overlapping runs,
// a run with another payload.
func TestCallsCheck(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1_800_000_000, 0).Add(time.Duration(ms) * time.Millisecond) }
	p := callPayload("k")
	clean := func() *callLog {
		return &callLog{
			runs: []callRun{
				{key: "k", payload: p, value: 1, failed: true, start: at(0), end: at(10)},
				{key: "k", payload: p, value: 2, start: at(20), end: at(30)},
			},
			calls: []callMade{
				{key: "k", err: errors.New("failed"), ranValue: 1, ranFailed: true, start: at(0), end: at(12)},
				{key: "k", value: 2, ranValue: 2, start: at(19), end: at(31)},
				{key: "k", value: 2, replayed: true, start: at(40), end: at(41)},
				{key: "k", mismatch: true, err: errors.New("mismatch"), start: at(50), end: at(51)},
			},
		}
	}
	if bad := checkCalls(context.Background(), &facts{calls: clean()}); len(bad) != 0 {
		t.Fatalf("a clean history: %v", bad)
	}
	for name, tc := range map[string]struct {
		edit func(*callLog)
		want string
	}{
		"unknown value": {func(l *callLog) { l.calls[2].value = 7 }, "which no run of the key returned"},
		"two replays": {func(l *callLog) {
			l.calls = append(l.calls, callMade{key: "k", value: 1, replayed: true, start: at(5), end: at(6)})
		}, "replays returned"},
		"run after": {func(l *callLog) {
			l.runs = append(l.runs, callRun{key: "k", payload: p, value: 3, start: at(60), end: at(61)})
		}, "RejectAlways keeps it"},
		"overlap":        {func(l *callLog) { l.runs[1].start = at(5) }, "overlap"},
		"other payload":  {func(l *callLog) { l.runs[0].payload = "another-payload" }, "another payload"},
		"mismatched ran": {func(l *callLog) { l.calls[3].ranValue = 9 }, "a call with another payload ran"},
	} {
		l := clean()
		tc.edit(l)
		bad := checkCalls(context.Background(), &facts{calls: l})
		if !slices.ContainsFunc(bad, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: got %v, want a violation naming %q", name, bad, tc.want)
		}
	}
}

// TestSelectCheck: each break of an Invoker's select (handler.WaitForAny)
// is a violation, and a select that kept its promises is none.
func TestSelectCheck(t *testing.T) {
	rec := ledger.Record{ID: "i1", Kind: "soak.invoker", State: ledger.Succeeded, Args: `{"N":1,"Kids":0,"Select":true}`}
	got := func(v string) []stepLine { return []stepLine{{name: "select", value: v, at: 5, pid: 1, got: true}} }
	run := func(lines []stepLine, rec ledger.Record, sent ...signalSent) []string {
		f := &facts{rs: runs{steps: map[string][]stepLine{"i1": lines}}}
		return f.checkSelect(rec, Invoker{Select: true}, sent)
	}
	goSent := signalSent{id: "i1", payload: 0}
	stopLate := signalSent{id: "i1", payload: 1, err: ledger.ErrSignalTooLate}
	for _, c := range []struct {
		name  string
		lines []stepLine
		sent  []signalSent
		want  string // "" no violation
	}{
		{"chose the signal sent", got("0"), []signalSent{goSent}, ""},
		{"timed out, the late signal refused", got("-1"), []signalSent{stopLate}, ""},
		{"chose the first, the other accepted after", got("0"), []signalSent{goSent, {id: "i1", payload: 1}}, ""},
		{"timed out with a signal accepted", got("-1"), []signalSent{goSent}, `the signal "go" was accepted`},
		{"chose a name no one signalled", got("1"), []signalSent{goSent}, "chose 1, a name no one signalled"},
		{"Succeeded with no choice", nil, []signalSent{goSent}, "chose nothing"},
	} {
		bad := run(c.lines, rec, c.sent...)
		switch {
		case c.want == "" && len(bad) != 0:
			t.Errorf("%s: %v, want none", c.name, bad)
		case c.want != "" && (len(bad) != 1 || !strings.Contains(bad[0], c.want)):
			t.Errorf("%s: got %v, want one violation saying %q", c.name, bad, c.want)
		}
	}
}

// TestEndedRunAtCheck: an ended job's RunAt after its end, or kept by a
// job that never ran and was not cancelled, is a violation; a last run's
// start, none, or a cancelled job's due time is not.
func TestEndedRunAtCheck(t *testing.T) {
	for _, c := range []struct {
		rec ledger.Record
		bad bool
	}{
		{ledger.Record{State: ledger.Succeeded, Attempt: 1, RunAt: 100, UpdatedAt: 150}, false},
		{ledger.Record{State: ledger.Failed, Attempt: 2, UpdatedAt: 150}, false},
		{ledger.Record{State: ledger.Failed, Cancelled: true, UpdatedAt: 150}, false},
		{ledger.Record{State: ledger.Failed, Cancelled: true, RunAt: 900, UpdatedAt: 150}, false}, // its due time, kept
		{ledger.Record{State: ledger.Failed, RunAt: 90, UpdatedAt: 150}, true},                    // never ran, not cancelled
		{ledger.Record{State: ledger.Succeeded, Attempt: 1, RunAt: 200, UpdatedAt: 150}, true},
	} {
		if got := endedRunAt(c.rec) != ""; got != c.bad {
			t.Errorf("%+v: a violation %v; want %v", c.rec, got, c.bad)
		}
	}
}
