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
const (
	MaxStepName   = 128
	MaxStepBytes  = 16 << 10
	MaxSteps      = 100
	MaxStepsBytes = 64 << 10
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

// CheckStep says whether a step named name with a result of result's size
// may be added to rec's steps (nil: it may).
func CheckStep(rec Record, name, result string) error {
	total := len(result) + len(name)
	for n, r := range rec.Steps {
		total += len(n) + len(r)
	}
	switch {
	case name == "" || len(name) > MaxStepName || !utf8.ValidString(name):
		return &StepError{Name: truncate(name, MaxStepName), Reason: fmt.Sprintf("a step's name is 1 to %d bytes of UTF-8", MaxStepName)}
	case len(result) > MaxStepBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("its result is %d bytes, the limit is %d", len(result), MaxStepBytes)}
	case len(rec.Steps) >= MaxSteps:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job has %d steps, the limit", MaxSteps)}
	case total > MaxStepsBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job's steps would be %d bytes, the limit is %d", total, MaxStepsBytes)}
	case len(rec.Args)+total > MaxArgsBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("the record would pass DynamoDB's item limit (args %d bytes, steps %d)", len(rec.Args), total)}
	}
	return nil
}

// RecordStep records the result of rec's step name, for the run that
// claimed rec: one UpdateItem, conditional on the record still carrying
// rec's fencing token and being Processing (a run whose lease a newer
// claim took gets ErrFenced, as Finish does, and writes nothing). A
// resend of an applied write (its reply lost) sets the same value again.
// A step outside the limits is a *StepError, nothing written.
//
// Cost: one request; its write units are the record's size after the
// write, in KB rounded up (one for a job whose args and steps are under
// about 700 bytes), and every later write of the record (a claim, a
// finish) pays for the steps it carries too.
func (s *Store) RecordStep(ctx context.Context, rec Record, name, result string) error {
	if err := CheckStep(rec, name, result); err != nil {
		return err
	}
	upd := expression.Set(stepPath(name), expression.Value(result))
	if len(rec.Steps) == 0 {
		// The map may not exist yet: a path into a missing map fails.
		upd = expression.Set(expression.Name(AttrSteps), expression.Value(stepsValue(map[string]string{name: result})))
	}
	cond := isJob(rec.ID).And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
		And(expression.Name(AttrState).Equal(expression.Value(string(Processing)))).
		And(expression.Name(AttrCancelReq).AttributeNotExists())
	if len(rec.Steps) == 0 {
		cond = cond.And(expression.Name(AttrSteps).AttributeNotExists())
	}
	_, err := s.updateByID(ctx, rec.ID, cond, upd)
	var nc *NotClaimableError
	switch {
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.CancelReq != "":
		return fmt.Errorf("%w: %s", ErrCancelRequested, truncate(nc.Current.CancelReq, MaxLastError))
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.State == Processing && nc.Current.Steps[name] == result:
		return nil // this very write, applied before (a resend after a lost reply)
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.State == Processing && len(rec.Steps) == 0 && len(nc.Current.Steps) > 0:
		// The run's first step, and a signal made the steps' map since the
		// claim (the run's record had none): add to the map as it is now,
		// within the limits counted with what it holds. Failing here failed
		// a job signalled before its wait and ran its first step twice.
		now := rec
		now.Steps = nc.Current.Steps
		return s.RecordStep(ctx, now, name, result)
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.State == Processing:
		return fmt.Errorf("nexjob: record step %q of job %s: the record's steps changed under the run", truncate(name, MaxStepName), rec.ID)
	case errors.As(err, &nc):
		return fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return err
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
	_, err := s.updateByID(ctx, id, cond, expression.Remove(expression.Name(AttrSteps)))
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
