package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Child jobs (handler.Invoke).
//
// A run starts a child with an enqueue whose record names the run's job
// as its Caller. When the child ends, ChildEnded writes its outcome as an
// item of the caller's steps (ChildStep, in the steps table: the caller's
// record carries none of it, so a job may await thousands) and adds one
// to the caller's ChildEnds, in one transaction; then, reading the caller
// again, wakes it if it sleeps in a wait for children (WaitingChildren).
// A run that begins such a wait records its sleep (Finish.AwaitChildren)
// and then reads its record: a ChildEnds above its claim's means a child
// ended between its look at its steps and its sleep, and it wakes itself.
// Each side writes before it reads, so one of them sees the other: no end
// is missed, and at worst both wake the job (one run more).
//
// How it fails. The outcome's write is conditional on the item's absence:
// the first outcome recorded for a child wins, so a resend of an applied
// transaction (its reply lost) is cancelled and reads as the success it
// was, the count not added twice; and a caller whose wait timed out first
// recorded its timeout there (TimedOutOutcome), which the child's end then
// meets and leaves. A caller that is gone is no error: nobody waits.

// Step names of child jobs in a caller's steps table partition: a step
// of the worker's cannot take them (names beginning "nexjob:" are the
// package's own).
const (
	childStep  = reservedStep + "child:"  // a child's outcome (ChildStep)
	invokeStep = reservedStep + "invoke:" // the id of the child a run started under a name (InvokeStep)
	awaitStep  = reservedStep + "await:"  // the end of a wait for children (AwaitStep)
	compStep   = reservedStep + "comp:"   // a compensation that ran (CompensationStep)
	condStep   = reservedStep + "cond:"   // a condition's looks and outcome (ConditionStep)
)

// CompensationStep is the step that records compensation name's run
// (handler.Compensate).
func CompensationStep(name string) string { return compStep + name }

// ConditionStep is the step of condition name's (handler.WaitForCondition)
// outcome, with part "" ; its end ("end") and its looks ("0", "1", ...)
// otherwise, after a "#".
func ConditionStep(name, part string) string {
	if part == "" {
		return condStep + name
	}
	return condStep + name + "#" + part
}

// ChildStep is the step that holds child job childID's outcome in its
// caller's steps (a ChildOutcome as JSON).
func ChildStep(childID string) string { return childStep + childID }

// InvokeStep is the step that holds the id of the child a run started
// under the worker's name (handler.InvokeAsync): a replay finds its child.
func InvokeStep(name string) string { return invokeStep + name }

// AwaitStep is the step that holds the end (unix ms) of a wait for the
// children named by key (the first child's id and their count).
func AwaitStep(key string) string { return awaitStep + key }

// IsInvokeStep reports whether step name holds a started child's id, and
// the worker's name for it.
func IsInvokeStep(name string) (string, bool) {
	if len(name) > len(invokeStep) && name[:len(invokeStep)] == invokeStep {
		return name[len(invokeStep):], true
	}
	return "", false
}

// ChildOutcome is how a child job ended, as its caller reads it.
type ChildOutcome struct {
	State State `json:"state"` // Succeeded, Failed, Expired; TimedOut: the caller's wait ended first
	// Result is the child's result (Succeeded), unless Big.
	Result json.RawMessage `json:"result,omitempty"`
	// Big: the result was over MaxStepValueBytes; the caller reads it
	// from the child's record.
	Big       bool   `json:"big,omitempty"`
	Error     string `json:"error,omitempty"`     // the child's last error (Failed, Expired)
	Cancelled bool   `json:"cancelled,omitempty"` // an operator's cancel, or its caller's, ended it
}

// TimedOutState is ChildOutcome.State for a caller's wait that ended
// before the child: recorded in the child's place, so the caller's runs
// agree for ever.
const TimedOutState State = "TimedOut"

// TimedOutOutcome is the outcome a caller records when its wait ends first.
var TimedOutOutcome = `{"state":"TimedOut"}`

// OutcomeOf is rec's outcome as its caller reads it; rec has ended.
func OutcomeOf(rec Record) string {
	o := ChildOutcome{State: rec.State, Cancelled: rec.Cancelled}
	switch {
	case rec.State == Succeeded && (len(rec.Result)+64 > MaxStepValueBytes || rec.ResultBlob != ""):
		o.Big = true // the caller reads it from the child's record (or its blob)
	case rec.State == Succeeded && rec.Result != "":
		o.Result = json.RawMessage(rec.Result)
	case rec.State != Succeeded:
		o.Error = truncate(rec.LastError, MaxLastError)
	}
	b, _ := json.Marshal(o) // a state, a bool, a string and valid JSON
	return string(b)
}

// ErrNoStepsTable: child jobs keep their outcomes in their caller's steps
// in the steps table (Options.StepsTable), which this store has none of.
var ErrNoStepsTable = errors.New("nexjob: child jobs need the steps table (NEXJOB_STEPS_TABLE, ledger.Options.StepsTable)")

// ChildEnded records ended child's outcome in its caller's steps and
// returns the caller's record as it is after (read strongly consistent),
// for WaitingChildren: one read of the caller, one two-item
// TransactWriteItems (the outcome's item, conditional on its absence, and
// the caller's ChildEnds), and one more read (4 write units, 2 to 3 read
// units). A caller that is gone gives ErrNotFound, nothing written; an
// outcome recorded before (this call's own resend, or the caller's
// timeout) is no error and adds nothing.
func (s *Store) ChildEnded(ctx context.Context, child Record) (Record, error) {
	if child.Caller == "" || !child.State.Terminal() {
		return Record{}, fmt.Errorf("nexjob: job %s is no ended child (caller %q, %s)", child.ID, child.Caller, child.State)
	}
	if s.steps == "" {
		return Record{}, ErrNoStepsTable
	}
	caller, err := s.Get(ctx, child.Caller)
	if err != nil {
		return Record{}, err
	}
	now := s.now()
	item := offKey(caller.ID, caller.StepsGen, ChildStep(child.ID))
	item[AttrStepValue] = &types.AttributeValueMemberS{Value: OutcomeOf(child)}
	item[AttrStepAt] = &types.AttributeValueMemberN{Value: strconv.FormatInt(now.UnixMilli(), 10)}
	item[AttrExpiresAt] = &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(StepLife).Unix(), 10)}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{
			TableName: aws.String(s.steps), Item: item,
			ConditionExpression:      aws.String("attribute_not_exists(#pk)"),
			ExpressionAttributeNames: map[string]string{"#pk": AttrPK},
		}},
		{Update: &types.Update{
			TableName:                 aws.String(s.table),
			Key:                       map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: caller.PK}},
			UpdateExpression:          aws.String("ADD #n :one"),
			ConditionExpression:       aws.String("#id = :id"),
			ExpressionAttributeNames:  map[string]string{"#n": AttrChildEnds, "#id": AttrID},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}, ":id": &types.AttributeValueMemberS{Value: caller.ID}},
		}},
	}})
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		// The outcome was there (ours, its reply lost; or the caller's
		// timeout), or the caller went: nothing to add either way. A
		// conflict with another write of the caller is an error: the
		// caller retries.
		for _, r := range tce.CancellationReasons {
			switch aws.ToString(r.Code) {
			case "", "None", "ConditionalCheckFailed":
			default:
				return Record{}, fmt.Errorf("nexjob: record the end of child %s in job %s: %w", child.ID, caller.ID, err)
			}
		}
		err = nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("nexjob: record the end of child %s in job %s: %w", child.ID, caller.ID, err)
	}
	return s.Get(ctx, caller.ID)
}

// WaitingChildren reports whether rec sleeps in a wait for children: as
// Waiting does for a signal, Scheduled for the wait's end, or made due by
// a wake whose send may have failed.
func (s *Store) WaitingChildren(rec Record) bool {
	return rec.AwaitEnd != 0 && rec.State == Scheduled && (rec.RunAt == rec.AwaitEnd || rec.RunAt <= s.now().UnixMilli())
}
