// Idempotent calls: the records of package idempotency, on the same table
// and under the same DuplicatePolicy as jobs.

package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// A call's record (pk "i#<function>#<hash>") holds an idempotency key of
// a function call (not a job): in progress while the first call runs, then its
// recorded outcome. Its attributes are named apart from a job's (no
// "state"), so no stream consumer of jobs (the dispatch guard, completion
// events) and no listing ever sees one.
const (
	AttrCallState   = "cstate"   // Processing while held, then Succeeded or Failed
	AttrCallUntil   = "cuntil"   // unix ms: the hold ends (the holder's deadline)
	AttrCallPayload = "cpayload" // the first call's payload hash, "" when none
	AttrCallResult  = "cresult"  // the recorded result (bytes)
	AttrCallError   = "cerror"   // the recorded error's text
	AttrCallPolicy  = "cpolicy"  // the DuplicatePolicy the record was made under
	AttrCallPrev    = "cprev"    // the token of the recorded outcome this hold replaced
)

// CallKeyPrefix begins every call record's partition key: a function
// granted only items under it (IAM's dynamodb:LeadingKeys) can neither
// read nor write a job.
const CallKeyPrefix = callPrefix

const callPrefix = "i#"

// CallKey is the key hash a call record of function is kept under (the
// keyHash of BeginCall, GetCall and Call): "<function>#<hash>", its
// partition key "i#<function>#<hash>", under FunctionCallPrefix(function).
// function must not hold "#" (package idempotency's names follow the
// kinds rule); hash is the key's hash (Store.HashKey).
func CallKey(function, hash string) string { return function + "#" + hash }

// FunctionCallPrefix begins the partition key of every call record of
// function: a grant limited to it (IAM's dynamodb:LeadingKeys
// "i#<function>#*") reaches that function's records and no other's, nor
// any job.
func FunctionCallPrefix(function string) string { return callPrefix + function + "#" }

// MaxCallResultBytes bounds a call's recorded result and error together,
// leaving the rest of the 400 KB item for its fixed fields.
const MaxCallResultBytes = 350_000

// Call is an idempotent call's record.
type Call struct {
	KeyHash string
	// State is Processing while the first call holds the key, then
	// Succeeded or Failed once its outcome is recorded.
	State State
	// Until ends a Processing hold: past it, the next call takes the key.
	Until time.Time
	// PayloadHash fingerprints the first call's payload ("" when none).
	PayloadHash string
	Result      []byte
	Error       string
	Policy      DuplicatePolicy
	// Token is the holder's: Record and Release are conditional on it.
	Token string
	// Prev is the token of the recorded outcome this call's hold replaced
	// (a policy let it take the key): that outcome's writer, its reply
	// lost, knows its write applied by it.
	Prev string
	// ExpiresAt is whole seconds, as the TTL attribute keeps it.
	ExpiresAt time.Time
}

// Held reports whether c, read at now, still holds its key for its first
// call (Processing with its hold not over: Until not before now). A
// caller allowing for clock skew passes its clock less the skew.
func (c Call) Held(now time.Time) bool {
	return c.State == Processing && !c.Until.Before(now)
}

// NewCall is the hold a BeginCall writes (any store's): Processing until
// until under a fresh token, expiring at until+retention in whole
// seconds. It refuses a policy not known and a key hash that names no
// function (ErrCallKeyUnscoped).
func NewCall(keyHash, payloadHash string, policy DuplicatePolicy, until time.Time, retention time.Duration) (Call, error) {
	if !policy.Valid() {
		return Call{}, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(policy))
	}
	if fn, h, ok := strings.Cut(keyHash, "#"); !ok || fn == "" || h == "" {
		return Call{}, fmt.Errorf("%w: %q", ErrCallKeyUnscoped, keyHash)
	}
	until = CeilMillis(until) // kept in whole ms: rounded up, a hold never ends early
	return Call{KeyHash: keyHash, State: Processing, Until: until, PayloadHash: payloadHash, Policy: policy, Token: NewNonce(), ExpiresAt: time.Unix(until.Add(retention).Unix(), 0)}, nil
}

// CeilMillis is t rounded up to a whole millisecond.
func CeilMillis(t time.Time) time.Time {
	if r := t.Truncate(time.Millisecond); r.Before(t) {
		return r.Add(time.Millisecond)
	}
	return t
}

// Outcome is the record a RecordCall of c writes (any store's): state
// (Succeeded or Failed, else an error), result and errText (together at
// most MaxCallResultBytes, else ErrItemTooLarge), a fresh token, no hold.
func (c Call) Outcome(state State, result []byte, errText string, expiresAt time.Time) (Call, error) {
	if state != Succeeded && state != Failed {
		return Call{}, fmt.Errorf("nexjob: a call's outcome is Succeeded or Failed, not %s", state)
	}
	if n := len(result) + len(errText); n > MaxCallResultBytes {
		return Call{}, fmt.Errorf("%w: a call's result and error are %d bytes, the limit is %d", ErrItemTooLarge, n, MaxCallResultBytes)
	}
	c.State, c.Result, c.Error, c.Token, c.ExpiresAt, c.Until = state, result, errText, NewNonce(), time.Unix(expiresAt.Unix(), 0), time.Time{}
	return c, nil
}

// ErrCallKeyUnscoped: BeginCall of a key hash that names no function
// (not made by CallKey): its record would be under no function's prefix.
var ErrCallKeyUnscoped = errors.New("nexjob: a call's key hash must name its function (ledger.CallKey)")

// ErrCallTakenOver: Record of a call whose key is no longer its: its hold
// ran out and another call took the key, or the record expired, or (a
// resend of its own applied write, its reply lost) later calls replaced or
// released the outcome it recorded before the resend came.
var ErrCallTakenOver = errors.New("nexjob: the call's key is no longer the call's (taken over, expired, or its recorded outcome since replaced)")

// BeginCall takes an idempotency key for a call. The key is free when it
// has no record, an expired one, or a hold whose until is more than skew
// behind the caller's clock (its holder's deadline passed, allowing for
// the two clocks' difference; in whole ms, until rounded up and the clock
// down: never early, at most 2 ms late): one conditional PutItem then. A recorded
// outcome the policy lets a new call replace (as at enqueue) is replaced
// by a second PutItem conditional on that record's token, which keeps it
// (Prev) so that its writer can still recognise its write: the re-use
// path, 2 writes. The new record is Processing until until, under a fresh
// token. began=false returns the record that holds the key instead
// (nothing was written then): in progress, or an outcome the policy
// protects.
//
// A resend of our own put (its reply lost) fails its condition against
// our record, and reads as the success it is (the token). A put whose
// error leaves its outcome open is followed by one consistent read; when
// that fails too, the error is an *UnknownOutcomeError and the key may be
// held until until.
func (s *Store) BeginCall(ctx context.Context, keyHash, payloadHash string, policy DuplicatePolicy, until time.Time, skew, retention time.Duration) (Call, bool, error) {
	c, err := NewCall(keyHash, payloadHash, policy, until, retention)
	if err != nil {
		return Call{}, false, err
	}
	now := s.now()
	st := expression.Name(AttrCallState)
	free := expression.AttributeNotExists(expression.Name(AttrPK)).
		Or(expression.Name(AttrExpiresAt).LessThanEqual(expression.Value(now.Unix()))).
		Or(st.Equal(expression.Value(string(Processing))).And(expression.Name(AttrCallUntil).LessThan(expression.Value(now.Add(-skew).UnixMilli()))))
	for range 4 {
		old, began, err := s.putCall(ctx, c, free)
		if err != nil || began {
			return c, began, err
		}
		if old.State == Processing || !policy.Allows(old.State) {
			return old, false, nil
		}
		// A recorded outcome the policy lets go: replace exactly it.
		c.Prev = old.Token
		old, began, err = s.putCall(ctx, c, expression.Name(AttrNonce).Equal(expression.Value(old.Token)))
		if err != nil || began {
			return c, began, err
		}
		c.Prev = ""
		if old.State == Processing || !policy.Allows(old.State) {
			return old, false, nil
		}
	}
	return Call{}, false, ErrContention
}

// putCall puts c under cond: began, or the record that failed cond.
func (s *Store) putCall(ctx context.Context, c Call, cond expression.ConditionBuilder) (Call, bool, error) {
	item := map[string]types.AttributeValue{
		AttrPK:         &types.AttributeValueMemberS{Value: callPrefix + c.KeyHash},
		AttrCallState:  &types.AttributeValueMemberS{Value: string(Processing)},
		AttrCallUntil:  millis(c.Until),
		AttrCallPolicy: &types.AttributeValueMemberS{Value: c.Policy.String()},
		AttrNonce:      &types.AttributeValueMemberS{Value: c.Token},
		AttrExpiresAt:  &types.AttributeValueMemberN{Value: strconv.FormatInt(c.ExpiresAt.Unix(), 10)},
	}
	if c.PayloadHash != "" {
		item[AttrCallPayload] = &types.AttributeValueMemberS{Value: c.PayloadHash}
	}
	if c.Prev != "" {
		item[AttrCallPrev] = &types.AttributeValueMemberS{Value: c.Prev}
	}
	x, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return Call{}, false, fmt.Errorf("nexjob: build call condition: %w", err)
	}
	_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                item,
		ConditionExpression:                 x.Condition(),
		ExpressionAttributeNames:            x.Names(),
		ExpressionAttributeValues:           x.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return Call{}, true, nil
	case errors.As(err, &ccf):
		old, derr := decodeCall(ccf.Item)
		if derr != nil {
			return Call{}, false, derr
		}
		return old, old.Token == c.Token, nil // our own put, applied, its reply lost
	case !unknownOutcome(err):
		return Call{}, false, fmt.Errorf("nexjob: begin call in %s: %w", s.table, err)
	}
	cur, ok, rerr := s.GetCall(ctx, c.KeyHash)
	if rerr == nil && ok {
		return cur, cur.Token == c.Token, nil
	}
	return Call{}, false, &UnknownOutcomeError{ID: callPrefix + c.KeyHash, Err: fmt.Errorf("nexjob: begin call in %s: %w", s.table, err), Nonce: c.Token}
}

// RecordCall writes a held call's outcome (Succeeded with its result, or
// Failed with its error's text), conditional on the hold still being the
// caller's (held.Token); the record then lives until expiresAt. A resend
// of our own update (its reply lost) reads as done; a hold another call
// took over gives ErrCallTakenOver, and nothing is written. One UpdateItem.
func (s *Store) RecordCall(ctx context.Context, held Call, state State, result []byte, errText string, expiresAt time.Time) (Call, error) {
	out, err := held.Outcome(state, result, errText, expiresAt)
	if err != nil {
		return Call{}, err
	}
	done := out.Token
	upd := expression.Set(expression.Name(AttrCallState), expression.Value(string(state))).
		Set(expression.Name(AttrNonce), expression.Value(done)).
		Set(expression.Name(AttrExpiresAt), expression.Value(expiresAt.Unix())).
		Remove(expression.Name(AttrCallUntil))
	if len(result) > 0 {
		upd = upd.Set(expression.Name(AttrCallResult), expression.Value(result))
	}
	if errText != "" {
		upd = upd.Set(expression.Name(AttrCallError), expression.Value(errText))
	}
	cond := expression.Name(AttrNonce).Equal(expression.Value(held.Token))
	x, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return Call{}, fmt.Errorf("nexjob: build call record: %w", err)
	}
	_, err = s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 callKey(held.KeyHash),
		ConditionExpression:                 x.Condition(),
		UpdateExpression:                    x.Update(),
		ExpressionAttributeNames:            x.Names(),
		ExpressionAttributeValues:           x.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &ccf):
		tok, _ := str(ccf.Item[AttrNonce])
		prev, _ := str(ccf.Item[AttrCallPrev])
		if tok == done || prev == done {
			return out, nil // our own update, applied, its reply lost (and the outcome since replaced as the policy allows)
		}
		return Call{}, ErrCallTakenOver
	case !unknownOutcome(err):
		return Call{}, fmt.Errorf("nexjob: record call in %s: %w", s.table, err)
	}
	if cur, ok, rerr := s.GetCall(ctx, held.KeyHash); rerr == nil {
		switch {
		case ok && (cur.Token == done || cur.Prev == done):
			return out, nil
		case !ok || cur.Token != held.Token:
			return Call{}, ErrCallTakenOver
		}
	}
	return Call{}, &UnknownOutcomeError{ID: callPrefix + held.KeyHash, Err: fmt.Errorf("nexjob: record call in %s: %w", s.table, err), Nonce: done}
}

// ReleaseCall frees a held call's key (its first call failed and the
// failure is not to be recorded): one DeleteItem conditional on the hold
// being the caller's. A key no longer the caller's (released by our own
// resend whose reply was lost, or taken over) is done too: nil.
func (s *Store) ReleaseCall(ctx context.Context, held Call) error {
	x, err := expression.NewBuilder().WithCondition(expression.Name(AttrNonce).Equal(expression.Value(held.Token))).Build()
	if err != nil {
		return fmt.Errorf("nexjob: build call release: %w", err)
	}
	_, err = s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(s.table),
		Key:                       callKey(held.KeyHash),
		ConditionExpression:       x.Condition(),
		ExpressionAttributeNames:  x.Names(),
		ExpressionAttributeValues: x.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	if err == nil || errors.As(err, &ccf) {
		return nil
	}
	err = fmt.Errorf("nexjob: release call in %s: %w", s.table, err)
	if !unknownOutcome(err) {
		return err
	}
	// Applied with its reply lost, then the resends failed: read.
	if cur, ok, rerr := s.GetCall(ctx, held.KeyHash); rerr == nil && (!ok || cur.Token != held.Token) {
		return nil
	}
	return err
}

// GetCall reads a call's record (one consistent read); ok=false when there
// is none or it is past its retention.
func (s *Store) GetCall(ctx context.Context, keyHash string) (Call, bool, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            callKey(keyHash),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return Call{}, false, fmt.Errorf("nexjob: read call in %s: %w", s.table, err)
	}
	if len(out.Item) == 0 {
		return Call{}, false, nil
	}
	c, err := decodeCall(out.Item)
	if err != nil {
		return Call{}, false, err
	}
	if !c.ExpiresAt.IsZero() && !s.now().Before(c.ExpiresAt) {
		return Call{}, false, nil
	}
	return c, true, nil
}

func decodeCall(item map[string]types.AttributeValue) (Call, error) {
	var c Call
	pk, _ := str(item[AttrPK])
	if len(pk) <= len(callPrefix) || pk[:len(callPrefix)] != callPrefix {
		return Call{}, fmt.Errorf("nexjob: item %q is not a call's record", pk)
	}
	c.KeyHash = pk[len(callPrefix):]
	st, _ := str(item[AttrCallState])
	c.State = State(st)
	if ms, err := num(item[AttrCallUntil]); err == nil {
		c.Until = Millis(ms)
	}
	c.PayloadHash, _ = str(item[AttrCallPayload])
	if b, ok := item[AttrCallResult].(*types.AttributeValueMemberB); ok {
		c.Result = b.Value
	}
	c.Error, _ = str(item[AttrCallError])
	c.Token, _ = str(item[AttrNonce])
	c.Prev, _ = str(item[AttrCallPrev])
	if p, _ := str(item[AttrCallPolicy]); p != "" {
		pol, err := ParsePolicy(p)
		if err != nil {
			return Call{}, err
		}
		c.Policy = pol
	}
	if sec, err := num(item[AttrExpiresAt]); err == nil {
		c.ExpiresAt = time.Unix(sec, 0)
	}
	return c, nil
}

// callKey is a call record's key.
func callKey(keyHash string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: callPrefix + keyHash}}
}

// millis is t as a unix-ms number attribute.
func millis(t time.Time) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(t.UnixMilli(), 10)}
}
