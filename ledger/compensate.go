package ledger

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
)

// Compensations (handler.Compensate).
//
// A run that declares a compensation marks its record Compensable (once
// a job: MarkCompensable). A cancel of such a job while it waits
// (Enqueued, Scheduled: asleep, in a wait) is not a withdrawal, which
// would end it with no run and so no compensation: RequestCompensation
// asks it to stop as RequestCancel asks a running job, and makes it due
// now; its next run replays its steps (declaring the compensations of the
// steps that completed again), records nothing new, and runs the
// compensations before it ends Failed, marked Cancelled. Withdraw leaves a
// compensable job alone (its condition), so the two never race.

// MarkCompensable marks rec's job Compensable: one UpdateItem, conditional
// on the run's claim (its fencing token, Processing). A newer claim or
// an end is ErrFenced, nothing written.
func (s *Store) MarkCompensable(ctx context.Context, rec Record) (Record, error) {
	cond := isJob(rec.ID).And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
		And(expression.Name(AttrState).Equal(expression.Value(Processing)))
	out, err := s.updateByID(ctx, rec.ID, cond, expression.Set(expression.Name(AttrCompensable), expression.Value(true)))
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		if nc.Current.Compensable && nc.Current.Token == rec.Token {
			return nc.Current, nil // our own write, its reply lost
		}
		return Record{}, ErrFenced
	}
	return out, err
}

// RequestCompensation asks a compensable job that waits (Enqueued or
// Scheduled) to stop and compensate: one UpdateItem, conditional on both,
// that keeps the reason (Record.CancelReq) and makes a Scheduled job due
// now (never later). asked=false (with the current record) means it is
// not compensable or not waiting: nothing was written. The caller sends
// the job's message. Asking again is no error (the same write).
func (s *Store) RequestCompensation(ctx context.Context, id, reason string) (Record, bool, error) {
	st := expression.Name(AttrState)
	cond := isJob(id).And(expression.Name(AttrCompensable).Equal(expression.Value(true))).
		And(st.Equal(expression.Value(Enqueued)).Or(st.Equal(expression.Value(Scheduled))))
	now := s.now().UnixMilli()
	upd := expression.Set(expression.Name(AttrCancelReq), expression.Value(truncate(reason, MaxLastError))).
		Set(expression.Name(AttrRunAt), expression.Value(now)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(now))
	rec, err := s.updateByID(ctx, id, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return rec, err == nil, err
}
