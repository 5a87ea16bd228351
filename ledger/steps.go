package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// AttrSteps is a job's map of completed step name to its result (JSON):
// Record.Steps, written by RecordStep.
const AttrSteps = "steps"

// Limits of a job's steps (RecordStep). They keep the record within
// DynamoDB's 400 KB item: a step is refused when its result would pass
// MaxStepBytes, its job would pass MaxSteps steps or MaxStepsBytes in
// all, or the record (its args included) would pass the item limit.
//
// A wait for a signal (WaitStep) reserves, while no signal answers it,
// room for the signal it waits for (one step of MaxStepBytes): a signal
// to an open wait always fits, and a job at its limit cannot begin a wait
// no signal could complete. A signal that no wait has asked for yet (sent
// early, or never waited for: anyone with the job's id may send one) is
// held to a budget of its own, MaxEarlySignals signals and
// MaxEarlySignalBytes in all, outside the steps' 100 and 64 KB: such
// signals cannot take the room of the job's own steps. A wait recorded
// for an early signal counts it with the steps from then on.
const (
	MaxStepName         = 128
	MaxStepBytes        = 16 << 10
	MaxSteps            = 100
	MaxStepsBytes       = 64 << 10
	MaxEarlySignals     = 8
	MaxEarlySignalBytes = 48 << 10
)

// StepError refuses a step's record: its name or its result is outside
// the limits. Nothing was written. It names the step, never its result.
type StepError struct {
	Name   string // the step's name, cut to MaxStepName
	Reason string
}

func (e *StepError) Error() string {
	return fmt.Sprintf("nexjob: step %q not recorded: %s", e.Name, e.Reason)
}

// stepBudget is what a job's steps take of their limits: its own steps
// (waits with the room they reserve, and the signals they took) and the
// signals no wait has asked for, in steps and in bytes as the record keeps
// them (stepKey).
type stepBudget struct {
	steps, bytes  int // the job's own
	early, eBytes int // signals no wait asked for
}

func budgetOf(steps map[string]string) stepBudget {
	var b stepBudget
	for k, v := range steps {
		size := len(stepKey(k)) + len(v)
		if name, ok := strings.CutPrefix(k, signalStep); ok {
			if _, waited := steps[WaitStep(name)]; !waited {
				b.early++
				b.eBytes += size
				continue
			}
		}
		b.steps++
		b.bytes += size
		if name, ok := strings.CutPrefix(k, waitStep); ok {
			if _, answered := steps[SignalStep(name)]; !answered {
				b.steps++ // the room its signal will take
				b.bytes += len(stepKey(SignalStep(name))) + MaxStepBytes
			}
		}
	}
	return b
}

// CheckStep says whether a step named name with a result of result's size
// may be added to rec's steps (nil: it may), by the limits above.
func CheckStep(rec Record, name, result string) error {
	// A signal's, a wait's or a token's name is the user's, under the
	// package's prefix: the limit is the user's name's (a wait of 116
	// bytes or more began, and no signal could complete it).
	base := usersName(name)
	switch {
	case base == "" || len(base) > MaxStepName || !utf8.ValidString(name):
		return &StepError{Name: truncate(name, MaxStepName), Reason: fmt.Sprintf("a step's name is 1 to %d bytes of UTF-8", MaxStepName)}
	case len(result) > MaxStepBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("its result is %d bytes, the limit is %d", len(result), MaxStepBytes)}
	}
	b := budgetOf(withStep(rec.Steps, name, result))
	_, wasEarly := rec.Steps[name]
	early := strings.HasPrefix(name, signalStep) && !wasEarly && b.early > budgetOf(rec.Steps).early
	switch {
	case early && b.early > MaxEarlySignals:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job holds %d signals no wait asked for, the limit (ledger.MaxEarlySignals)", MaxEarlySignals)}
	case early && b.eBytes > MaxEarlySignalBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("signals no wait asked for would be %d bytes, the limit is %d (ledger.MaxEarlySignalBytes)", b.eBytes, MaxEarlySignalBytes)}
	case !early && b.steps > MaxSteps:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job would have %d steps (a wait counts the signal it waits for), the limit is %d", b.steps, MaxSteps)}
	case !early && b.bytes > MaxStepsBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job's steps would be %d bytes (a wait reserves %d for its signal), the limit is %d", b.bytes, MaxStepBytes, MaxStepsBytes)}
	case early && len(rec.Args)+max(b.bytes, MaxStepsBytes)+b.eBytes > MaxArgsBytes:
		// Never the room the job's own steps may still take.
		return &StepError{Name: name, Reason: fmt.Sprintf("the record keeps no room for a signal no wait asked for (args %d bytes, and the steps' %d)", len(rec.Args), MaxStepsBytes)}
	case len(rec.Args)+b.bytes+b.eBytes > MaxArgsBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("the record would pass DynamoDB's item limit (args %d bytes, steps %d, early signals %d)", len(rec.Args), b.bytes, b.eBytes)}
	}
	return nil
}

// RecordStep records the result of rec's step name, for the run that
// claimed rec: one UpdateItem, conditional on the record still carrying
// rec's fencing token and being Processing (a run whose lease a newer
// claim took gets ErrFenced, as Finish does, and writes nothing), and on
// its steps being those of rec (their count: a run's steps are only ever
// added to): a signal landed since makes it read the record the failed
// condition returns, check the limits with what it now holds, and write
// again. It returns the steps as recorded after its write, for the run's
// next step. A resend of an applied write (its reply lost) reads as done.
// A step outside the limits is a *StepError, nothing written.
//
// Cost: one request (one more per signal landed since the run's last
// step); its write units are the record's size after the
// write, in KB rounded up (one for a job whose args and steps are under
// about 700 bytes), and every later write of the record (a claim, a
// finish) pays for the steps it carries too.
func (s *Store) RecordStep(ctx context.Context, rec Record, name, result string) (map[string]string, error) {
	for range recordTries {
		if err := CheckStep(rec, name, result); err != nil {
			return rec.Steps, err
		}
		upd := expression.Set(stepPath(name), expression.Value(result))
		cond := isJob(rec.ID).And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
			And(expression.Name(AttrState).Equal(expression.Value(string(Processing)))).
			And(expression.Name(AttrCancelReq).AttributeNotExists())
		if len(rec.Steps) == 0 {
			// The map may not exist yet: a path into a missing map fails.
			upd = expression.Set(expression.Name(AttrSteps), expression.Value(stepsValue(map[string]string{name: result})))
			// No map, or an empty one (a reopen removed its only entries):
			// a condition on its absence alone failed for ever on the
			// latter, and the write went round in a hot loop.
			cond = cond.And(expression.Name(AttrSteps).AttributeNotExists().Or(expression.Size(expression.Name(AttrSteps)).Equal(expression.Value(0))))
		} else {
			// The steps as the limits were checked with: a signal landed
			// since makes the run look again.
			cond = cond.And(expression.Size(expression.Name(AttrSteps)).Equal(expression.Value(len(rec.Steps))))
		}
		_, err := s.updateByID(ctx, rec.ID, cond, upd)
		var nc *NotClaimableError
		switch {
		case err == nil:
			return withStep(rec.Steps, name, result), nil
		case !errors.As(err, &nc):
			return rec.Steps, err
		case nc.Current.Token == rec.Token && nc.Current.CancelReq != "":
			return rec.Steps, fmt.Errorf("%w: %s", ErrCancelRequested, truncate(nc.Current.CancelReq, MaxLastError))
		case nc.Current.Token == rec.Token && nc.Current.State == Processing && nc.Current.Steps[name] == result && added(nc.Current.Steps, withStep(rec.Steps, name, result)):
			return nc.Current.Steps, nil // this very write, applied before (a resend after a lost reply)
		case nc.Current.Token == rec.Token && nc.Current.State == Processing && added(nc.Current.Steps, rec.Steps):
			// Signals landed since the run read its steps (a signal made
			// the map of a run that had none, or added to it): add to the
			// map as it is now, within the limits counted with what it
			// holds. Counted with the run's stale view, two signals had
			// taken the record past the steps' limit and its finish past
			// DynamoDB's item.
			rec.Steps = nc.Current.Steps
		case nc.Current.Token == rec.Token && nc.Current.State == Processing:
			return rec.Steps, fmt.Errorf("nexjob: record step %q of job %s: the record's steps changed under the run", truncate(name, MaxStepName), rec.ID)
		default:
			return rec.Steps, fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
		}
	}
	return rec.Steps, fmt.Errorf("nexjob: record step %q of job %s: the record's steps changed under the run %d times", truncate(name, MaxStepName), rec.ID, recordTries)
}

// recordTries bounds RecordStep's writes: each after a signal landed
// since the last (a job holds at most MaxEarlySignals early signals and
// one per wait), never a loop on a condition that cannot hold.
const recordTries = 2*MaxEarlySignals + MaxSteps

// withStep is steps with name's result added (a new map).
func withStep(steps map[string]string, name, result string) map[string]string {
	out := make(map[string]string, len(steps)+1)
	for k, v := range steps {
		out[k] = v
	}
	out[name] = result
	return out
}

// added reports whether now holds every step of was, as it was: only
// additions since (signals; a run's steps are written once).
func added(now, was map[string]string) bool {
	for k, v := range was {
		if w, ok := now[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// decodeSteps decodes Record.Steps, its keys back to the names they keep
// (stepKey).
func decodeSteps(av types.AttributeValue) (map[string]string, error) {
	m, ok := av.(*types.AttributeValueMemberM)
	if !ok {
		return nil, wrongType(av, "M")
	}
	out := make(map[string]string, len(m.Value))
	for k, v := range m.Value {
		s, err := str(v)
		if err != nil {
			return nil, err
		}
		out[stepName(k)] = s
	}
	return out, nil
}

// StepMap is a job's steps by name (Record.Steps). Stored, each name is
// escaped (stepKey); this type reads and writes them so for
// attributevalue's Marshal and Unmarshal too (a Scan decoded with
// UnmarshalListOfMaps reads the names the run gave).
type StepMap map[string]string

// MarshalDynamoDBAttributeValue writes m as the record keeps it.
func (m StepMap) MarshalDynamoDBAttributeValue() (types.AttributeValue, error) {
	out := make(map[string]types.AttributeValue, len(m))
	for k, v := range m {
		out[stepKey(k)] = &types.AttributeValueMemberS{Value: v}
	}
	return &types.AttributeValueMemberM{Value: out}, nil
}

// UnmarshalDynamoDBAttributeValue reads m as the record keeps it.
func (m *StepMap) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	if _, null := av.(*types.AttributeValueMemberNULL); null {
		*m = nil
		return nil
	}
	steps, err := decodeSteps(av)
	*m = steps
	return err
}

// stepKeys escapes a step's name into the key of the record's steps map
// that keeps it, and stepNames reads it back. The expression builder reads
// "." in a name as a path's separator and "[n]" as a list index, even in
// a single name (expression.NameNoDotSplit parses the brackets all the
// same), so a name such as "user.fetch" or "charge[0]" reached DynamoDB as
// a path into a map that is not there. Those two characters, the brackets
// and "%" itself are kept as %2E, %5B, %5D and %25; every other character
// is kept as it is, so the names of earlier records (none of these four
// characters could be written then, but a job's first step: its whole map
// was set at once) read as they were. The one ambiguity: a name recorded
// before this escaping that holds "%2E", "%5B", "%5D" or "%25" literally
// reads as the character they stand for.
var (
	stepKeys  = strings.NewReplacer("%", "%25", ".", "%2E", "[", "%5B", "]", "%5D")
	stepNames = strings.NewReplacer("%25", "%", "%2E", ".", "%5B", "[", "%5D", "]")
)

// stepKey is the key of name in the record's steps map (stepKeys).
func stepKey(name string) string { return stepKeys.Replace(name) }

// stepName is the name kept under key (stepKeys).
func stepName(key string) string {
	if !strings.Contains(key, "%") {
		return key
	}
	return stepNames.Replace(key)
}

// stepPath is the path of name's entry in the record's steps map: one
// name, never read as a path of its own.
func stepPath(name string) expression.NameBuilder {
	return expression.Name(AttrSteps).AppendName(expression.NameNoDotSplit(stepKey(name)))
}

// stepsValue is steps as the record's map keeps them (stepKey).
func stepsValue(steps map[string]string) map[string]string {
	out := make(map[string]string, len(steps))
	for k, v := range steps {
		out[stepKey(k)] = v
	}
	return out
}

// ForgetSteps drops the recorded steps of job id, which must be ended
// (Succeeded, Failed or Expired): its next run, after a Requeue, calls
// every step's function again. One conditional UpdateItem; a job that is
// not ended gives a *NotClaimableError with its record, and nothing is
// written; a job with no steps is no error.
func (s *Store) ForgetSteps(ctx context.Context, id string) error {
	st := expression.Name(AttrState)
	cond := isJob(id).And(st.Equal(expression.Value(Succeeded)).Or(st.Equal(expression.Value(Failed))).Or(st.Equal(expression.Value(Expired))))
	// The steps table's items of this generation are left to expire.
	gen := expression.Name(AttrStepsGen)
	upd := expression.Remove(expression.Name(AttrSteps)).Set(gen, expression.Plus(expression.IfNotExists(gen, expression.Value(0)), expression.Value(1)))
	_, err := s.updateByID(ctx, id, cond, upd)
	return err
}

// ErrCancelRequested: an operator asked the running job to stop
// (RequestCancel); its step was not recorded.
var ErrCancelRequested = errors.New("nexjob: cancelled by an operator while running")

// RequestCancel asks job id's current run (it must be Processing) to stop
// at its next step: one conditional UpdateItem setting the reason. ok
// false (with the record) when the job is not Processing; nothing is
// written then.
func (s *Store) RequestCancel(ctx context.Context, id, reason string) (Record, bool, error) {
	cond := isJob(id).And(expression.Name(AttrState).Equal(expression.Value(string(Processing))))
	rec, err := s.updateByID(ctx, id, cond, expression.Set(expression.Name(AttrCancelReq), expression.Value(truncate(reason, MaxLastError))))
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return rec, err == nil, err
}

// usersName is the user's name in step name: a signal's, a wait's, a
// token's or a started child's (InvokeStep) name is the user's under the
// package's prefix, and the limit (MaxStepName) is the user's name's.
//
// A compensation's (CompensationStep) too, and a condition's
// (ConditionStep: the user's name, then "#" and the package's own
// suffix, which is cut as well).
func usersName(name string) string {
	for _, p := range []string{signalStep, waitStep, tokenStep, invokeStep, compStep} {
		if b, ok := strings.CutPrefix(name, p); ok {
			return b
		}
	}
	if b, ok := strings.CutPrefix(name, condStep); ok {
		if i := strings.LastIndexByte(b, '#'); i >= 0 {
			return b[:i]
		}
		return b
	}
	return name
}
