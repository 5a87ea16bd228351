// Package replay checks, before a deploy, that new code of a durable kind
// takes the jobs in flight where they stand: it exports the open jobs of
// a kind (their records, steps, sleeps and waits; args and values
// redacted on request) and replays each against the current registry
// with no side effects (handler's Registry.Replay: a recorded step
// returns its recorded value, the first step not recorded ends the replay,
// nothing is written, no AWS call is made).
//
//	ex, _ := replay.Read(ctx, a.Store(), "order.place", nil) // a live table, read only
//	rep, _ := replay.Check(ctx, reg, ex)
//	for _, d := range rep.Divergences { fmt.Println(d) }
//
// A divergence is one of:
//
//   - a recorded step the current code never reaches (renamed without
//     StepOptions.Aliases, removed, or moved behind a step that was not
//     recorded): its side effect would run again under the new name, or
//     its result be lost;
//   - a wait or a sleep the job is in that the current code does not
//     reach (it waits for another signal now, or no longer waits): the
//     job would go on without what it waits for;
//   - a recorded value that no longer decodes as the step's type (a
//     *handler.ResultTypeError naming the step, the recorded shape and
//     the type wanted);
//   - a replay that ended in an error of the current code's (a panic, a
//     call to AWS outside the steps, a step name refused or used twice, a
//     compensation declared inside a step): the next live run would end
//     the same. The worker's own error (a wait that timed out) is
//     Report.Unchecked: the recording code would end the same.
//
// Each names the job, the recorded step and where the current code went
// (the step it reached that was not recorded, or the sleep it ended in).
// A step reached that was not recorded is no divergence by itself: it is
// where a job that is retrying, or was never past it, goes on.
//
// # Running it
//
// In CI, on an export committed to the repository (nexjob export KIND >
// testdata/open-jobs.json, or Read and Write): nexjobtest.CheckReplay(t,
// reg, path) fails the test with each divergence. Before a deploy, against
// the live table, read only: a main of the team's own that calls Main
// with its registry (a registry is the team's code: no binary of ours
// holds it), which exits 1 on a divergence.
//
// # How it fails
//
// Read's errors are the AWS calls' (wrapped). Check returns an error only
// for an export it cannot read (another Format); a kind the registry does
// not know is a divergence of each of its jobs (their worker was removed:
// they would fail at their next run). With redacted values (Options.Redact)
// a value that no longer decodes because its contents were blanked (a
// time held as a string) is not a divergence but Report.Unchecked: only a
// changed shape (an object where a number was) is one. Step names built
// from redacted args differ from the recorded ones: export without
// Redact, to a place as private as the table, for such kinds.
//
// # Cost
//
// Read: per open job a GetItem and one Query per MB of its steps (and a
// GetObject per value kept in the blob bucket), after the byState index's
// Queries (and a Scan of the table for the states it does not hold). Check
// makes no request.
package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Format is the export's format version (Export.Format).
const Format = 1

// Export is the open jobs of one kind, as Read read them: what Check
// replays. Its JSON is what `nexjob export` prints.
type Export struct {
	Format int       `json:"format"`
	Kind   string    `json:"kind"`
	At     time.Time `json:"at"` // when it was read: the replay's clock
	// Redacted: args and values were blanked (Options.Redact).
	Redacted bool  `json:"redacted,omitempty"`
	Jobs     []Job `json:"jobs"`
}

// Job is one open job of an Export.
type Job struct {
	ID      string       `json:"id"`
	State   ledger.State `json:"state"`
	Attempt int          `json:"attempt"`
	Token   int64        `json:"token"`           // its claims so far (0: never claimed)
	RunAt   int64        `json:"runAt,omitempty"` // unix ms it is due
	Ran     bool         `json:"ran,omitempty"`   // a run of it wrote a step
	Args    string       `json:"args"`
	// Steps are its steps, signals and waits by name, each value as
	// recorded (JSON, or the package's own markers).
	Steps map[string]string `json:"steps,omitempty"`
	// Order is Steps' names in the order they were written, as far as
	// known (those kept on the record, whose times are not, last by
	// name): a divergence names the first recorded step not reached.
	Order []string `json:"order,omitempty"`
	// ArgsError says why its args, kept in the blob bucket, could not be
	// read ("" they were): Check reports it, as its next run would fail.
	ArgsError string `json:"argsError,omitempty"`
	// In names, for a step recorded inside another step's function (a
	// Map item's, a step's nested steps), that step: a replay of the
	// outer one does not reach it, and need not.
	In map[string]string `json:"in,omitempty"`
}

// Options tune Read. The zero value reads values as they are.
type Options struct {
	// Redact blanks args and the values of steps, signals and children's
	// results (strings "", numbers 0, booleans false; arrays keep their
	// length, objects their keys) and callback tokens' nonces, keeping
	// the package's own times and ids and a step whose value is a bare
	// unix-ms time of 2000 to 2100 (a sleep's end): an export a team may
	// commit.
	Redact bool
	// Limit caps the jobs read (0: all).
	Limit int
}

// errLimit ends a Read at Options.Limit.
var errLimit = errors.New("limit")

// Read exports the open jobs of kind from store's table (ledger's
// OpenJobs), read only, at store's clock: an operator's Admin.Store, a
// Client's Store, a test Env's Client.Store.
func Read(ctx context.Context, store *ledger.Store, kind string, o *Options) (Export, error) {
	if o == nil {
		o = &Options{}
	}
	ex := Export{Format: Format, Kind: kind, At: store.Now().UTC().Truncate(time.Millisecond), Redacted: o.Redact, Jobs: []Job{}}
	err := store.OpenJobs(ctx, kind, func(r ledger.Record, items []ledger.StepItem, argsErr error) error {
		if o.Limit > 0 && len(ex.Jobs) == o.Limit {
			return errLimit
		}
		j := FromRecord(r, o.Redact)
		if argsErr != nil {
			j.ArgsError = argsErr.Error()
		}
		for _, it := range items {
			j.Order = append(j.Order, it.Name)
			if it.In != "" {
				if j.In == nil {
					j.In = map[string]string{}
				}
				j.In[it.Name] = it.In
			}
		}
		ex.Jobs = append(ex.Jobs, j)
		return nil
	})
	if err != nil && !errors.Is(err, errLimit) {
		return Export{}, fmt.Errorf("nexjob: export the open jobs of %q: %w", kind, err)
	}
	slices.SortFunc(ex.Jobs, func(x, y Job) int { return strings.Compare(x.ID, y.ID) })
	return ex, nil
}

// FromRecord is rec (its steps whole) as an export holds it.
func FromRecord(rec ledger.Record, redacted bool) Job {
	j := Job{ID: rec.ID, State: rec.State, Attempt: rec.Attempt, Token: rec.Token, RunAt: rec.RunAt, Ran: rec.Ran(), Args: rec.Args, Steps: map[string]string{}}
	for name, v := range rec.Steps {
		j.Steps[name] = v
	}
	if redacted {
		j.Args = redactJSON(j.Args)
		for name, v := range j.Steps {
			j.Steps[name] = redactStep(name, v)
		}
	}
	return j
}

// record is j as the replay's record.
func (j Job) record(kind string) ledger.Record {
	steps := ledger.StepMap{}
	for name, v := range j.Steps {
		steps[name] = v
	}
	return ledger.Record{ID: j.ID, Kind: kind, State: j.State, Attempt: j.Attempt, Token: j.Token, RunAt: j.RunAt, RanMark: j.Ran, Args: j.Args, Steps: steps}
}

// Write writes ex to path as indented JSON.
func Write(path string, ex Export) error {
	b, err := json.MarshalIndent(ex, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}

// ReadFile reads an export Write (or `nexjob export`) wrote.
func ReadFile(path string) (Export, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Export{}, err
	}
	var ex Export
	if err := json.Unmarshal(b, &ex); err != nil {
		return Export{}, fmt.Errorf("nexjob: export %s: %w", path, err)
	}
	return ex, nil
}

// Divergence is one job the current code would treat otherwise than the
// code that recorded it.
type Divergence struct {
	JobID string
	Kind  string
	// Recorded is the recorded step concerned ("" none: a type or an
	// error's divergence names its step in Problem).
	Recorded string
	// Current is where the current code went instead: the step it
	// reached that was not recorded, the sleep or wait it ended in, or
	// "" (it returned).
	Current string
	// Problem says what differs, for people.
	Problem string
}

func (d Divergence) String() string {
	s := fmt.Sprintf("job %s (%s): %s", d.JobID, d.Kind, d.Problem)
	if d.Recorded != "" {
		s += fmt.Sprintf("; recorded step %q", d.Recorded)
	}
	if d.Current != "" {
		s += fmt.Sprintf("; the current code reached %q", d.Current)
	}
	return s
}

// Report is what Check found.
type Report struct {
	Kind string
	// Jobs were replayed; NotStarted had recorded nothing (nothing to
	// check: they run the current code from its start).
	Jobs, NotStarted int
	Divergences      []Divergence
	// Unchecked says what a redacted export could not check, a line each.
	Unchecked []string
}

// Err is nil when the report holds no divergence, else an error listing
// them.
func (r Report) Err() error {
	if len(r.Divergences) == 0 {
		return nil
	}
	lines := make([]string, len(r.Divergences))
	for i, d := range r.Divergences {
		lines[i] = "  " + d.String()
	}
	return fmt.Errorf("nexjob: %d of %d open jobs of %q diverge from the current code:\n%s", len(r.Divergences), r.Jobs, r.Kind, strings.Join(lines, "\n"))
}

// Check replays each job of ex against reg (handler's Registry.Replay, at
// ex.At) and reports where the current code diverges from what the job
// recorded (see the package doc).
func Check(ctx context.Context, reg *handler.Registry, ex Export) (Report, error) {
	if ex.Format != Format {
		return Report{}, fmt.Errorf("nexjob: export format %d, this build reads %d", ex.Format, Format)
	}
	rep := Report{Kind: ex.Kind}
	known := slices.Contains(reg.Kinds(), ex.Kind)
	for _, j := range ex.Jobs {
		if !known {
			rep.Jobs++
			rep.Divergences = append(rep.Divergences, Divergence{JobID: j.ID, Kind: ex.Kind, Problem: "its kind is not registered: the job fails at its next run"})
			continue
		}
		if j.ArgsError != "" {
			rep.Jobs++
			rep.Divergences = append(rep.Divergences, Divergence{JobID: j.ID, Kind: ex.Kind, Problem: "its args could not be read: its next run fails too (" + j.ArgsError + ")"})
			continue
		}
		if len(j.Steps) == 0 && !j.Ran {
			rep.NotStarted++
			continue
		}
		rep.Jobs++
		res, err := reg.Replay(ctx, j.record(ex.Kind), ex.At)
		if err != nil {
			return rep, err
		}
		judge(&rep, ex, j, res)
	}
	return rep, nil
}

// judge adds what res shows of job j to rep.
func judge(rep *Report, ex Export, j Job, res handler.Replayed) {
	add := func(recorded, problem string) {
		rep.Divergences = append(rep.Divergences, Divergence{JobID: j.ID, Kind: ex.Kind, Recorded: recorded, Current: where(res), Problem: problem})
	}
	if res.Err != nil {
		var rt *handler.ResultTypeError
		switch {
		case ex.Redacted && !shapeChanged(res.Err):
			rep.Unchecked = append(rep.Unchecked, fmt.Sprintf("job %s: the replay ended in an error the redacted values may explain: %v", j.ID, res.Err))
		case errors.As(res.Err, &rt):
			add(rt.Step, fmt.Sprintf("recorded value of shape %s does not decode as %s (%v): give the step a new name and keep the old one's value readable, or decode both shapes", rt.Recorded, rt.Want, rt.Err))
		case !ownFault(res.Err):
			// The worker's own error (a wait that timed out, a refusal):
			// the code that recorded the job may end the same way.
			rep.Unchecked = append(rep.Unchecked, fmt.Sprintf("job %s: the replay ended in the worker's error (the recording code may too): %v", j.ID, res.Err))
		}
	}
	if len(rep.Divergences) > 0 && rep.Divergences[len(rep.Divergences)-1].JobID == j.ID {
		return // a value that no longer decodes ended the replay: what follows is its consequence
	}
	reached := map[string]bool{}
	for _, n := range res.Reached {
		reached[n] = true
	}
	var missed []string
	for _, name := range j.order() {
		if !reached[name] && required(name) && !j.covered(name, reached) {
			missed = append(missed, name)
		}
	}
	if len(missed) > 0 {
		first := missed[0]
		problem := "a recorded step the current code does not reach (renamed without StepOptions.Aliases, removed, or now behind a step not recorded): its function would run again under another name, or its result be lost"
		switch {
		case res.Err != nil && !ex.Redacted:
			problem = fmt.Sprintf("the replay ended in an error before it reached this recorded step: %v", res.Err)
		case isWait(first) && atoi(j.Steps[first]) > 0:
			problem = "the job waited here (its end " + time.UnixMilli(atoi(j.Steps[first])).UTC().Format(time.RFC3339) + "); the current code does not reach this wait: it would go on without what the job waits for, or wait for something else"
		case isInvoke(first):
			problem = "a child the job started that the current code does not start under this name: it would start another"
		}
		if more := missed[1:]; len(more) > 0 {
			problem += fmt.Sprintf("; %d more recorded after it not reached (%s)", len(more), strings.Join(quoteCap(more, 5), ", "))
		}
		add(first, problem)
		return
	}
	if res.Err != nil && !ex.Redacted && ownFault(res.Err) && !errors.As(res.Err, new(*handler.ResultTypeError)) {
		add("", fmt.Sprintf("the replay ended in an error: %v", res.Err))
	}
}

// ownFault reports whether a replay's error is the current code's fault,
// not an end the recording code may come to as well: a panic, an AWS call
// outside the steps, a step's name refused or used twice.
func ownFault(err error) bool {
	var p *handler.PanicError
	var se *ledger.StepError
	return errors.As(err, &p) || errors.Is(err, handler.ErrReplayCall) || errors.As(err, &se) ||
		errors.Is(err, handler.ErrStepRepeated) || errors.As(err, new(*handler.CompensateInStepError))
}

// required reports whether the replay must reach recorded step name: a
// step of the worker's, a child started, a wait begun (for signals, for
// children, a condition's end).
func required(name string) bool {
	return !strings.HasPrefix(name, "nexjob:") || isInvoke(name) || isWait(name)
}

// covered reports whether step name was recorded inside a step the
// replay reached (or one itself so covered): its function, not called,
// did not reach it again.
func (j Job) covered(name string, reached map[string]bool) bool {
	for seen := 0; seen < len(j.In); seen++ {
		outer, ok := j.In[name]
		if !ok {
			return false
		}
		if reached[outer] {
			return true
		}
		name = outer
	}
	return false
}

// order is j's step names in the order written (Order, then any it
// misses by name).
func (j Job) order() []string {
	out := slices.Clone(j.Order)
	for _, name := range slices.Sorted(maps.Keys(j.Steps)) {
		if !slices.Contains(j.Order, name) {
			out = append(out, name)
		}
	}
	return out
}

// quoteCap is names quoted, at most n of them and "…".
func quoteCap(names []string, n int) []string {
	var out []string
	for i, name := range names {
		if i == n {
			return append(out, "…")
		}
		out = append(out, strconv.Quote(name))
	}
	return out
}

// where is where the replay went: its frontier, its sleep, or "".
func where(res handler.Replayed) string {
	if res.Frontier != "" {
		return res.Frontier
	}
	return res.Sleeps
}

// shapeChanged reports whether err is a value whose JSON shape no longer
// fits its type (not contents a redaction blanked).
func shapeChanged(err error) bool {
	var ute *json.UnmarshalTypeError
	var se *json.SyntaxError
	return errors.As(err, &ute) || errors.As(err, &se)
}

// isInvoke reports whether name holds a started child's id.
func isInvoke(name string) bool {
	_, ok := ledger.IsInvokeStep(name)
	return ok
}

// isWait reports whether name holds the end of a wait the job began:
// for signals, for children, a condition's.
func isWait(name string) bool {
	return strings.HasPrefix(name, ledger.WaitStep("")) || strings.HasPrefix(name, ledger.AwaitStep("")) ||
		strings.HasPrefix(name, ledger.ConditionStep("", "")) && strings.HasSuffix(name, "#end")
}

func atoi(v string) int64 {
	n, _ := strconv.ParseInt(strings.Trim(v, `"`), 10, 64)
	return n
}
