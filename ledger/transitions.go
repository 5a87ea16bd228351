package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// NotClaimableError is returned by Claim when the job exists but may not
// be run now. Current is the record as DynamoDB had it when the condition
// failed (returned by the same request: no extra read).
type NotClaimableError struct {
	Current Record
}

func (e *NotClaimableError) Error() string {
	return fmt.Sprintf("nexjob: job %s is %s, not claimable", e.Current.ID, e.Current.State)
}

// ErrFenced: the write was refused because the record moved on (another
// run claimed the job after this run's lease ran out, or it was finished).
// The record keeps the newer run's result.
var ErrFenced = errors.New("nexjob: lease lost; a newer run owns the job")

// Claim moves a job to Processing with one conditional update: from
// Enqueued, from Scheduled once due, or from Processing whose lease has run
// out (an orphan: its attempt is spent). It increments the attempt and the
// fencing token and sets the lease; the update returns the new record, so a
// claim costs one write and no read.
//
// A job that exists but may not run now gives a *NotClaimableError with the
// current record; a missing job or one past its retention, ErrNotFound.
func (s *Store) Claim(ctx context.Context, id string, lease time.Duration) (Record, error) {
	now := s.now()
	nowMs := now.UnixMilli()
	st := expression.Name(AttrState)
	cond := isJob(id).
		And(expression.Name(AttrAttempt).LessThan(expression.Name(AttrMaxAttempts))).
		And(expression.Or(
			st.Equal(expression.Value(Enqueued)),
			st.Equal(expression.Value(Scheduled)).And(expression.Name(AttrRunAt).LessThanEqual(expression.Value(nowMs))),
			st.Equal(expression.Value(Processing)).And(expression.Name(AttrLeaseUntil).LessThanEqual(expression.Value(nowMs))),
		))
	upd := expression.Set(st, expression.Value(Processing)).
		Set(expression.Name(AttrLeaseUntil), expression.Value(now.Add(lease).UnixMilli())).
		Set(expression.Name(AttrUpdatedAt), expression.Value(nowMs)).
		Set(expression.Name(AttrAttempt), expression.Name(AttrAttempt).Plus(expression.Value(1))).
		Set(expression.Name(AttrToken), expression.Name(AttrToken).Plus(expression.Value(1)))
	upd = s.withIndex(upd, Processing, nowMs)
	return s.updateByID(ctx, id, cond, upd)
}

// ErrTooManyChildren: the parent already has MaxChildren continuations.
var ErrTooManyChildren = fmt.Errorf("nexjob: a job takes at most %d continuations", MaxChildren)

// updateByID runs a conditional update on the job with this id, wherever
// it lives (its key's record, or its own). The condition must include
// id = :id. A failed condition on the job gives *NotClaimableError with
// the current record; a failed condition that meets this very update
// (applied, its reply lost, resent by the SDK) is a success.
func (s *Store) updateByID(ctx context.Context, id string, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (Record, error) {
	pks, err := locate(id)
	if err != nil {
		return Record{}, err
	}
	now := s.now()
	nonce := newNonce()
	// Built once: an UpdateBuilder shares its operations between copies,
	// so setting the nonce per try would set it twice on the second pk.
	upd = upd.Set(expression.Name(AttrNonce), expression.Value(nonce))
	for _, pk := range pks {
		rec, err := s.update(ctx, pk, cond, upd, nonce)
		var held *heldError
		if !errors.As(err, &held) {
			return rec, err
		}
		if held.rec.ID == id {
			if held.rec.ExpiredAt(now) {
				return Record{}, ErrNotFound
			}
			return Record{}, &NotClaimableError{Current: held.rec}
		}
		// The key now belongs to another job (or nothing): look at the
		// job's own record.
	}
	return Record{}, ErrNotFound
}

// Finish describes the write that ends a run. Zero fields are left alone.
type Finish struct {
	State     State     // the new state; required
	LastError string    // kept for people; "" clears nothing
	RunAt     time.Time // for Scheduled (a retry)
	ExpiresAt time.Time // end of the retention (see TTL); zero keeps the record forever
	// CutOff: the invocation's deadline cut the run off. The attempt is
	// given back and the cut-off counted in Record.CutOffs; any other end
	// of a run clears that count.
	CutOff bool
}

// Finish ends the run that claimed rec: one update, conditional on the
// record still carrying rec's fencing token and being Processing. If it
// does not, the error is ErrFenced and nothing is written.
//
// Finish may be called again with the same rec and f after an error (a
// throttle that outlasted the SDK's retries, a timeout): its nonce derives
// from the run's claim, so a call whose earlier try was applied after all
// reads that write as its own and succeeds.
func (s *Store) Finish(ctx context.Context, rec Record, f Finish) (Record, error) {
	if !f.State.Valid() || f.State == Processing {
		return Record{}, fmt.Errorf("nexjob: cannot finish a run as %q", f.State)
	}
	now := s.now()
	upd := expression.Set(expression.Name(AttrState), expression.Value(f.State)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(now.UnixMilli())).
		Remove(expression.Name(AttrLeaseUntil))
	upd = s.withIndex(upd, f.State, now.UnixMilli())
	if f.LastError != "" {
		upd = upd.Set(expression.Name(AttrLastError), expression.Value(truncate(f.LastError, MaxLastError)))
	}
	if !f.RunAt.IsZero() {
		upd = upd.Set(expression.Name(AttrRunAt), expression.Value(f.RunAt.UnixMilli()))
	}
	if !f.ExpiresAt.IsZero() {
		upd = upd.Set(expression.Name(AttrExpiresAt), expression.Value(TTL(f.ExpiresAt)))
	}
	if f.CutOff {
		upd = upd.Set(expression.Name(AttrAttempt), expression.Name(AttrAttempt).Minus(expression.Value(1))).
			Set(expression.Name(AttrCutOffs), counterPlusOne(AttrCutOffs))
	} else {
		upd = upd.Remove(expression.Name(AttrCutOffs))
	}
	cond := expression.Name(AttrID).Equal(expression.Value(rec.ID)).
		And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
		And(expression.Name(AttrState).Equal(expression.Value(Processing)))
	nonce := rec.Nonce + ".end"
	out, err := s.update(ctx, rec.PK, cond, upd.Set(expression.Name(AttrNonce), expression.Value(nonce)), nonce)
	var held *heldError
	if errors.As(err, &held) {
		return Record{}, fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return out, err
}

// update runs one conditional UpdateItem returning the new record; a failed
// condition is a *heldError with the current record.
//
// PutItem and UpdateItem carry no idempotency token: DynamoDB may apply an
// update and still answer 500, the SDK then resends it, and the resend
// fails its condition against the update's own result. So every update
// writes a nonce, and a failed condition that finds it is the success it
// is.
// upd must set the nonce: a failed condition that finds it is this very
// update, applied but its reply lost.
func (s *Store) update(ctx context.Context, pk string, cond expression.ConditionBuilder, upd expression.UpdateBuilder, nonce string) (Record, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return Record{}, fmt.Errorf("nexjob: build update: %w", err)
	}
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: pk}},
		ConditionExpression:                 expr.Condition(),
		UpdateExpression:                    expr.Update(),
		ExpressionAttributeNames:            expr.Names(),
		ExpressionAttributeValues:           expr.Values(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err := s.conditionError("update job", err); err != nil {
		var held *heldError
		if errors.As(err, &held) && held.rec.Nonce == nonce {
			return held.rec, nil // our own update, applied but its reply lost
		}
		return Record{}, err
	}
	var rec Record
	if err := attributevalue.UnmarshalMap(out.Attributes, &rec); err != nil {
		return Record{}, fmt.Errorf("nexjob: decode job record: %w", err)
	}
	return rec, nil
}

// counterPlusOne is "name + 1", starting from 0 when absent.
func counterPlusOne(name string) expression.SetValueBuilder {
	return expression.Plus(expression.IfNotExists(expression.Name(name), expression.Value(0)), expression.Value(1))
}

// isJob is the condition that the item is this job (a key's record may
// hold another job by now).
func isJob(id string) expression.ConditionBuilder {
	return expression.Name(AttrID).Equal(expression.Value(id))
}
