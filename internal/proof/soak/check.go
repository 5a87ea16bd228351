package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// run is one run of a job as the run logs tell it.
type run struct {
	id         string
	attempt    int
	start, end int64 // unix nanoseconds; end 0: no end logged (its process was killed)
	pid        int
	ok         bool
	slept      bool // it ended in a durable sleep: no attempt spent
}

// stepLine is a durable job's step as its run logged it: its function
// called (got false) or its result returned (got true).
type stepLine struct {
	name, value string
	at          int64 // unix nanoseconds
	pid         int
	got         bool
}

// runs are every run logged, and every dead-letter hook call by job.
type runs struct {
	byJob map[string][]*run
	dead  map[string][]int // the pids whose hook call it logged
	steps map[string][]stepLine
	// argsChanged are the runs, by job, whose args were not those its
	// first run recorded (their "argsChanged" lines).
	argsChanged map[string][]string
	dir         string
}

// laterIn reports whether another of rs started after r in r's process.
func laterIn(rs []*run, r *run) bool {
	for _, o := range rs {
		if o.pid == r.pid && o.start > r.start {
			return true
		}
	}
	return false
}

func readRuns(dir string) (runs, error) {
	out := runs{byJob: map[string][]*run{}, dead: map[string][]int{}, steps: map[string][]stepLine{}, argsChanged: map[string][]string{}, dir: dir}
	files, err := filepath.Glob(filepath.Join(dir, "*.runs"))
	if err != nil {
		return out, err
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return out, err
		}
		open := map[string]*run{} // id/attempt/pid → its start
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			w := strings.Fields(sc.Text())
			switch {
			case len(w) == 3 && w[0] == "dead":
				pid, _ := strconv.Atoi(w[2])
				out.dead[w[1]] = append(out.dead[w[1]], pid)
			case len(w) == 6 && w[0] == "argsChanged":
				out.argsChanged[w[1]] = append(out.argsChanged[w[1]], fmt.Sprintf("recorded N %s, ran with N %s (pid %s)", w[2], w[3], w[5]))
			case len(w) == 6 && (w[0] == "step" || w[0] == "got"):
				at, _ := strconv.ParseInt(w[4], 10, 64)
				pid, _ := strconv.Atoi(w[5])
				out.steps[w[1]] = append(out.steps[w[1]], stepLine{name: w[2], value: w[3], at: at, pid: pid, got: w[0] == "got"})
			case len(w) >= 5 && (w[0] == "start" || w[0] == "end"):
				att, _ := strconv.Atoi(w[2])
				at, _ := strconv.ParseInt(w[3], 10, 64)
				pid, _ := strconv.Atoi(w[4])
				k := w[1] + "/" + w[2] + "/" + w[4]
				if w[0] == "start" {
					r := &run{id: w[1], attempt: att, start: at, pid: pid}
					open[k] = r
					out.byJob[w[1]] = append(out.byJob[w[1]], r)
				} else if r := open[k]; r != nil {
					r.end, r.ok, r.slept = at, len(w) > 5 && w[5] == "ok", len(w) > 5 && w[5] == "sleep"
				}
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			return out, err
		}
	}
	return out, nil
}

// scan reads every job record of the table.
func scan(ctx context.Context, db *dynamodb.Client, table string) ([]ledger.Record, error) {
	return scanWith(ctx, db, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
}

// scanWith is scan with in's projection (the whole item when it has none).
func scanWith(ctx context.Context, db *dynamodb.Client, in *dynamodb.ScanInput) ([]ledger.Record, error) {
	var recs []ledger.Record
	p := dynamodb.NewScanPaginator(db, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		var part []ledger.Record
		if err := attributevalue.UnmarshalListOfMaps(page.Items, &part); err != nil {
			return nil, err
		}
		for _, r := range part {
			// Flow control's items (rate logs, concurrency slots) share
			// the table and have no job id: jobs only.
			if r.ID != "" {
				recs = append(recs, r)
			}
		}
	}
	return recs, nil
}

// check reads the ledger and the run logs against the invariants; it
// returns the violations, each with the job's history.
// facts are what the checkers read: the ledger at quiet, what the
// producers were told, the run logs and the kills.
type facts struct {
	env      Env
	st       *ledger.Store
	cl       *enqueue.Client // the checker's own, through no fault
	led      *ledgerOf
	rs       runs
	killedAt map[int]int64 // pid → kill time (unix ns)
	recs     []ledger.Record
	byID     map[string]ledger.Record
	rep      *Report
	c        Config
	calls    *callLog // the idempotent calls
}

// fail formats a violation about job id with its runs and log lines.
func (f *facts) fail(id, format string, args ...any) string {
	h := history(f.rs.byJob[id])
	return fmt.Sprintf("job %s: %s; runs: %s; logs:\n%s", id, fmt.Sprintf(format, args...), h, logLines(f.rs.dir, id))
}

// check runs every checker (Checkers) over the facts of a run.
func check(ctx context.Context, env Env, cl *enqueue.Client, led *ledgerOf, rs runs, kills []kill, calls *callLog, rep *Report, c Config) []string {
	st := cl.Store()
	recs, err := scan(ctx, dynamodb.NewFromConfig(env.Cfg), env.Table)
	if err != nil {
		return []string{"scan: " + err.Error()}
	}
	f := &facts{env: env, st: st, cl: cl, led: led, rs: rs, killedAt: map[int]int64{}, recs: recs, byID: map[string]ledger.Record{}, rep: rep, c: c, calls: calls}
	for _, r := range recs {
		f.byID[r.ID] = r
	}
	for _, k := range kills {
		f.killedAt[k.pid] = k.at
	}
	for i, r := range recs {
		if r.Kind == (Durable{}).Kind() || r.Kind == (Invoker{}).Kind() {
			// Its steps whole: those in the steps table too.
			if recs[i], err = st.WithSteps(ctx, r); err != nil {
				return []string{"read the steps of " + r.ID + ": " + err.Error()}
			}
			f.byID[r.ID] = recs[i]
		}
	}
	rep.Jobs = len(recs)
	var bad []string
	for _, name := range slices.Sorted(maps.Keys(Checkers)) {
		bad = append(bad, Checkers[name](ctx, f)...)
	}
	return bad
}

// deleted reports whether the operator deleted (or may have deleted) job id.
func (f *facts) deleted(id string) bool {
	r := f.led.results[id]
	return r != nil && r.deleted
}

// parentDeleted: a continuation whose parent the operator deleted is
// refused as bad input (no such parent): the mix's own doing.
func (f *facts) parentDeleted(r *result) bool {
	for _, p := range r.parents {
		if f.deleted(p) {
			return true
		}
	}
	return false
}

// checkRecords: no call of the mix was refused as bad input; every job a
// producer was given has its record (a replaced recurring firing's is
// gone by design: its run is checked instead); no record appears that no
// call could have made (a child job's caller's run made it).
func checkRecords(_ context.Context, f *facts) []string {
	var bad []string
	// The mix makes no bad input: a refusal as such is the soak's own bug
	// (its first debounced enqueues asked for a 500 ms period, and every
	// one was refused unnoticed).
	for _, r := range f.led.all {
		if errors.Is(r.err, enqueue.ErrInvalidInput) && !f.parentDeleted(r) {
			bad = append(bad, fmt.Sprintf("a %s call (%s) was refused as bad input: %v", r.call, r.kind, r.err))
		}
	}
	unknown := 0
	for _, r := range f.led.all {
		if !r.created && r.err != nil && r.rejected == nil && !r.limited {
			unknown++ // the call failed: its job may or may not exist
		}
		if !r.created {
			continue
		}
		rec, ok := f.byID[r.id]
		if !ok && r.call != "firing" && !r.deleted {
			bad = append(bad, f.fail(r.id, "returned by %s (%s) and not in the ledger", r.call, r.kind))
		}
		if ok && !r.duplicate && rec.Queue != r.queue {
			bad = append(bad, f.fail(r.id, "sent to queue %q, but its record says %q", r.queue, rec.Queue))
		}
	}
	extra := 0
	for id, rec := range f.byID {
		if _, caller := f.byID[rec.Caller]; rec.Caller != "" && caller {
			continue // a child job: its caller's run made it (checker children)
		}
		if f.led.results[id] == nil {
			extra++
		}
	}
	if extra > unknown {
		bad = append(bad, fmt.Sprintf("%d records no enqueue returned, but only %d calls failed with an outcome left open", extra, unknown))
	}
	return bad
}

// checkPolicy: every duplicate names the key's holder and every rejection
// matches the policy table for the holder's state.
func checkPolicy(_ context.Context, f *facts) []string {
	var bad []string
	for _, r := range f.led.all {
		switch {
		case r.duplicate && r.call != "firing" && !f.deleted(r.id):
			h, ok := f.byID[r.id]
			if !ok || h.KeyHash != f.st.HashKey(r.key) {
				bad = append(bad, f.fail(r.id, "returned as the duplicate for key %q, but it does not hold that key", r.key))
			}
		case r.rejected != nil:
			if r.policy.Allows(r.rejected.ExistingState) || !r.rejected.ExistingState.Terminal() {
				bad = append(bad, f.fail(r.id, "rejected under %s with the holder %s: the policy lets that state go", r.policy, r.rejected.ExistingState))
			}
		}
	}
	return bad
}

// endedRunAt says what is wrong with an ended job's RunAt, or "": it is
// its last run's start (what the dashboard times), nothing, or for a
// cancelled job its due time: never a time after its end, never kept by a
// job that did not run, unless cancelled.
func endedRunAt(rec ledger.Record) string {
	if rec.RunAt != 0 && !rec.Cancelled && (rec.RunAt > rec.UpdatedAt || rec.Attempt == 0 && !rec.Compensable) {
		return fmt.Sprintf("ended %s at %d (attempt %d, cancelled %v) with RunAt %d: not its last run's start", rec.State, rec.UpdatedAt, rec.Attempt, rec.Cancelled, rec.RunAt)
	}
	return ""
}

// checkEnds: every record ended (none waits for ever), as its kind and
// its runs say; a recorded hook ran once per failure; continuations and
// fan-in children followed their parents; runs never overlap and never
// outnumber the attempts.
func checkEnds(_ context.Context, f *facts) []string {
	var bad []string
	// Each record ended as its runs say, with no two runs at once.
	uncleared := clearFailures(f.rs.dir)
	cutOffs := loggedCount(f.rs.dir, "job cut off by the invocation deadline; attempt given back")
	for _, rec := range f.recs {
		jr := f.rs.byJob[rec.ID]
		f.rep.Runs += len(jr)
		f.rep.MaxRuns = max(f.rep.MaxRuns, len(jr))
		if !rec.State.Terminal() {
			told := "no producer was told of it"
			if r := f.led.results[rec.ID]; r != nil {
				told = fmt.Sprintf("%s returned it (err: %v)", r.call, r.err)
			}
			bad = append(bad, f.fail(rec.ID, "left %s: attempt %d, run at %d, created %d, updated %d, undispatched %v, key hash %q; %s",
				rec.State, rec.Attempt, rec.RunAt, rec.CreatedAt, rec.UpdatedAt, rec.Undispatched, rec.KeyHash, told))
			continue
		}
		if rec.Kind == ledger.DeadLetterKind {
			continue
		}
		if why := endedRunAt(rec); why != "" {
			bad = append(bad, f.fail(rec.ID, "%s", why))
		}
		okRun := false
		for _, r := range jr {
			okRun = okRun || (r.end != 0 && r.ok)
		}
		switch {
		case rec.Cancelled:
			if rec.State != ledger.Failed {
				bad = append(bad, f.fail(rec.ID, "cancelled but %s", rec.State))
			}
		case rec.Kind == "soak.doomed":
			if rec.State != ledger.Failed {
				bad = append(bad, f.fail(rec.ID, "a doomed job ended %s", rec.State))
			}
			// Once per time it became Failed (a requeue fails it again);
			// more only after a kill between the hook and the write that
			// clears its mark, or that write's failure past its retries
			// (at least once, by design).
			calls := f.rs.dead[rec.ID]
			want, extra := 1, 0
			if r := f.led.results[rec.ID]; r != nil {
				want, extra = 1+r.requeued, r.requeueUnknown
			}
			killedHooks := 0
			for _, pid := range calls {
				if f.killedAt[pid] != 0 {
					killedHooks++
				}
			}
			if len(calls) < want || len(calls) > want+extra+killedHooks+uncleared[rec.ID] {
				bad = append(bad, f.fail(rec.ID, "Failed %d times (requeued %d, %d requeues unknown) with its dead-letter hook run %d times (%d in killed processes); its record: %s", want, want-1, extra, len(calls), killedHooks, describe(rec)))
			}
		case rec.Kind == (Keyed{}).Kind() && keyPanics(rec):
			// Its key function panics: the run fails as a worker's panic
			// does (never escaping Handle), every attempt, and never starts;
			// its last error is the panic's, or an orphan's when a kill
			// came between its last claim and its end (seed 7, 3,000 jobs).
			if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "panicked") && !strings.Contains(rec.LastError, "orphaned") || len(jr) != 0 {
				bad = append(bad, f.fail(rec.ID, "a job whose key function panics ended %s after %d runs (last error %q); want Failed, never run", rec.State, len(jr), rec.LastError))
			}
		case len(rec.Parents) > 0 && f.parentDeleted(&result{parents: rec.Parents}):
			// A parent the operator deleted: its end is not known here
			// (released if it had Succeeded, ended otherwise). That the
			// child ended at all, checked above, is what holds.
		case len(rec.Parents) > 0:
			// A fan-in child: Succeeded once every parent did; otherwise it
			// ended as a parent that did not.
			all := true
			for _, id := range rec.Parents {
				p, ok := f.byID[id]
				all = all && ok && p.State == ledger.Succeeded
			}
			// Its write and its links are one transaction: a call that
			// failed wrote no child, and one whose outcome stayed open
			// wrote it whole, so every child here runs once its parents
			// all Succeeded.
			if all && rec.State != ledger.Succeeded {
				bad = append(bad, f.fail(rec.ID, "a fan-in child of parents that all Succeeded ended %s", rec.State))
			}
			if !all && rec.State == ledger.Succeeded {
				bad = append(bad, f.fail(rec.ID, "a fan-in child Succeeded though a parent did not"))
			}
		case rec.ParentID != "":
			if p, ok := f.byID[rec.ParentID]; ok && p.State == ledger.Succeeded && rec.State != ledger.Succeeded {
				bad = append(bad, f.fail(rec.ID, "a continuation of a Succeeded parent ended %s", rec.State))
			}
		case rec.Kind == (Durable{}).Kind() && durableArgs(rec).WaitMs > handler.MaxWait.Milliseconds():
			// A wait longer than the longest schedule: refused when the run
			// meets it, the job failed for good, the wait never recorded.
			// (Or it expired unrun, or ended an orphan out of attempts
			// before its run met the wait, as kills allow.)
			waited := rec.Steps[ledger.WaitStep("go"+durableArgs(rec).Sfx)] != ""
			refused := rec.State == ledger.Failed && (strings.Contains(rec.LastError, "longer than the longest") || f.orphaned(rec))
			if waited || rec.State == ledger.Succeeded || rec.State == ledger.Expired && len(jr) > 0 || rec.State == ledger.Failed && !refused {
				bad = append(bad, f.fail(rec.ID, "a durable job waiting two years ended %s (%q) after %d runs, its wait recorded %v; want Failed at once, refused", rec.State, rec.LastError, len(jr), waited))
			}
		case rec.Kind == (Invoker{}).Kind() && strings.Contains(rec.LastError, "soak: a child failed"):
			// A child failed: it fails for good, and compensates (checker children).
			if rec.State != ledger.Failed {
				bad = append(bad, f.fail(rec.ID, "an invoker whose child failed ended %s", rec.State))
			}
		case rec.Kind == (Kid{}).Kind() && kidFails(rec):
			// A child made to fail: Failed at its first run, for good.
			if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "soak: kid fails") && !f.orphaned(rec) {
				bad = append(bad, f.fail(rec.ID, "a failing child ended %s (%q)", rec.State, rec.LastError))
			}
		case rec.State == ledger.Expired:
			if r := f.led.results[rec.ID]; r == nil || !r.mayExpire {
				bad = append(bad, f.fail(rec.ID, "Expired, but it had no deadline"))
			}
			if len(jr) > 0 {
				bad = append(bad, f.fail(rec.ID, "Expired after %d runs", len(jr)))
			}
		default:
			// Kills spend attempts: a run claimed in a process killed before
			// it reported counts as one. Such a job may end Failed as an
			// orphan out of attempts, and only then.
			// A run whose end was logged is cut too when its process was
			// killed later and it was that process's last run of the job:
			// the kill may have come between the run's end and the write
			// that records it (seed 2, on CI: a soak.flaky job's last
			// attempt succeeded, its worker died before Finish, and the
			// next delivery failed it as an orphan out of attempts).
			if rec.State != ledger.Succeeded && !f.orphaned(rec) {
				bad = append(bad, f.fail(rec.ID, "a %s job ended %s (last error %q)", rec.Kind, rec.State, rec.LastError))
			}
		}
		if rec.State == ledger.Succeeded && !okRun {
			bad = append(bad, f.fail(rec.ID, "Succeeded with no run that ended well"))
		}
		// A requeue starts the attempts again; a run the invocation's
		// deadline cut off gave its attempt back (the record's CutOffs
		// counts the current attempt's only: the logged ones count all;
		// the 10k soak, seed 1796502170212235855, read 4 runs for 3
		// attempts where a cut-off came first, claims being slow under
		// the outage's backlog).
		limit := rec.Attempt + max(rec.CutOffs, cutOffs[rec.ID])
		if r := f.led.results[rec.ID]; r != nil {
			limit += (r.requeued + r.requeueUnknown) * rec.MaxAttempts
		}
		spent := 0 // a run that ended in a durable sleep gave its attempt back
		for _, r := range jr {
			if !r.slept {
				spent++
			}
		}
		if spent > limit {
			bad = append(bad, f.fail(rec.ID, "%d runs for %d attempts (at most %d with its requeues)", spent, rec.Attempt, limit))
		}
		// No overlap: a run with no end ended when its process was killed,
		// or when its lease ran out if that came first: past it the run's
		// context is done and every write of it is fenced, whatever its
		// process does (10k soak, seed 1796526818492146927: a process
		// stalled 30 s by the machine's load, its run's lease long out, was
		// read as running beside the run that took the job over).
		sorted := append([]*run(nil), jr...)
		sort.Slice(sorted, func(a, b int) bool { return sorted[a].start < sorted[b].start })
		for i := 1; i < len(sorted); i++ {
			prev := sorted[i-1]
			end := prev.end
			if end == 0 {
				end = prev.start + runLeaseBound.Nanoseconds()
				if k := f.killedAt[prev.pid]; k != 0 && k < end {
					end = k
				}
			}
			if end > sorted[i].start {
				bad = append(bad, f.fail(rec.ID, "run %d (pid %d) started before run %d (pid %d) ended", sorted[i].attempt, sorted[i].pid, prev.attempt, prev.pid))
			}
		}
	}
	return bad
}

// orphaned reports whether rec ended Failed as an orphan out of
// attempts, as kills allow: fewer of its runs reported an end than it
// spent attempts (a run claimed in a process killed before it reported
// counts as one).
func (f *facts) orphaned(rec ledger.Record) bool {
	jr := f.rs.byJob[rec.ID]
	ended := 0
	for _, r := range jr {
		if r.end != 0 && (f.killedAt[r.pid] == 0 || laterIn(jr, r)) {
			ended++
		}
	}
	return rec.State == ledger.Failed && strings.Contains(rec.LastError, "orphaned") && ended < rec.Attempt
}

// keyPanics reports whether a Keyed record's key function panics.
func keyPanics(rec ledger.Record) bool {
	var a Keyed
	return json.Unmarshal([]byte(rec.Args), &a) == nil && panics(a.N)
}

// concurrencyViolations: no more than LimitPerTenant runs of one tenant's
// Limited jobs at once (the runs whose end was logged: a killed run's
// slot is held until its lease ends, and its end is not known).
func concurrencyViolations(recs []ledger.Record, rs runs) []string {
	type edge struct {
		at    int64
		delta int
	}
	byTenant := map[string][]edge{}
	for _, rec := range recs {
		if rec.Kind != (Limited{}).Kind() {
			continue
		}
		var a Limited
		if err := json.Unmarshal([]byte(rec.Args), &a); err != nil {
			continue
		}
		for _, r := range rs.byJob[rec.ID] {
			if r.end != 0 {
				byTenant[a.Tenant] = append(byTenant[a.Tenant], edge{r.start, 1}, edge{r.end, -1})
			}
		}
	}
	var bad []string
	for tenant, edges := range byTenant {
		// Ends before starts at the same instant: back to back is no overlap.
		sort.Slice(edges, func(i, j int) bool {
			return edges[i].at < edges[j].at || edges[i].at == edges[j].at && edges[i].delta < edges[j].delta
		})
		n, most := 0, 0
		for _, e := range edges {
			n += e.delta
			most = max(most, n)
		}
		if most > LimitPerTenant {
			bad = append(bad, fmt.Sprintf("tenant %s: %d runs of its limited jobs at once; the limit is %d", tenant, most, LimitPerTenant))
		}
	}
	return bad
}

func history(rs []*run) string {
	var b strings.Builder
	for _, r := range rs {
		end := "killed"
		if r.end != 0 {
			end = fmt.Sprintf("+%dms ok=%v", (r.end-r.start)/1e6, r.ok)
		}
		fmt.Fprintf(&b, "[attempt %d pid %d at %d %s] ", r.attempt, r.pid, r.start, end)
	}
	return b.String()
}

// logLines are the log lines that name id, from every process's log.
func logLines(dir, id string) string {
	var b strings.Builder
	n := 0
	eachLine(dir, func(file, line string) {
		if strings.Contains(line, id) && n < 30 {
			fmt.Fprintf(&b, "    %s: %s\n", file, line)
			n++
		}
	})
	return b.String()
}

// clearFailures counts, by job id, the workers' logged failures to clear
// a dead-letter hook's mark after the hook ran (a throttle past every
// retry): each lets the hook run once more, by design (at least once).
func clearFailures(dir string) map[string]int {
	return loggedCount(dir, "clearing the dead-letter hook's mark failed")
}

// describe is what a violation quotes of a record.
func describe(rec ledger.Record) string {
	return fmt.Sprintf("%s attempt %d of %d, token %d, returns %d, hook pending %t, updated %s, last error %q",
		rec.State, rec.Attempt, rec.MaxAttempts, rec.Token, rec.Returns, rec.HookPending, ledger.Millis(rec.UpdatedAt).UTC().Format(time.RFC3339Nano), rec.LastError)
}

// orphanFailed is the worker's log line that fails an orphan out of
// attempts.
const orphanFailed = "orphaned job out of attempts; failing it"

// loggedCount counts, by job id, the log lines that say msg.
func loggedCount(dir, msg string) map[string]int {
	n := map[string]int{}
	eachLine(dir, func(_, line string) {
		if !strings.Contains(line, msg) {
			return
		}
		if _, rest, ok := strings.Cut(line, "job_id="); ok {
			id, _, _ := strings.Cut(rest, " ")
			n[id]++
		}
	})
	return n
}

// eachLine calls f with every line of the run's log files.
func eachLine(dir string, f func(file, line string)) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			f(filepath.Base(name), line)
		}
	}
}
