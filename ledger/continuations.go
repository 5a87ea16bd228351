package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
)

// Link records child as a continuation of parent: one update adding the
// child's id to the parent's Children set, conditional on the parent not
// having Succeeded. It returns linked=false with the parent when the parent
// already Succeeded: the caller must then release the child itself. The
// child's id is kept in the parent, not found through an index, so that
// the parent's completing write returns its children (strongly consistent,
// no query, no index write).
func (s *Store) Link(ctx context.Context, parentID, childID string) (Record, bool, error) {
	cond := isJob(parentID).And(expression.Name(AttrState).NotEqual(expression.Value(Succeeded)))
	upd := expression.Add(expression.Name(AttrChildren), expression.Value(stringSet(childID)))
	rec, err := s.updateByID(ctx, parentID, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return rec, err == nil, err
}

// Release moves a waiting continuation to Enqueued: one update conditional
// on it still waiting, so a child is released once however many times its
// parent's completion is replayed. released=false means it was not waiting.
func (s *Store) Release(ctx context.Context, childID string) (Record, bool, error) {
	return s.move(ctx, childID, []State{AwaitingContinuation}, Enqueued, "", time.Time{})
}

// Cancel ends a waiting continuation as Failed with the reason.
func (s *Store) Cancel(ctx context.Context, childID, reason string, expiresAt time.Time) (Record, bool, error) {
	return s.move(ctx, childID, []State{AwaitingContinuation}, Failed, reason, expiresAt)
}

// move changes the job's state from one of from to to with one
// conditional update, keeping the reason and the TTL if given. moved=false
// (with the current record) means the job was in none of from.
func (s *Store) move(ctx context.Context, id string, from []State, to State, reason string, expiresAt time.Time) (Record, bool, error) {
	st := expression.Name(AttrState)
	var in expression.ConditionBuilder
	for i, f := range from {
		if i == 0 {
			in = st.Equal(expression.Value(f))
		} else {
			in = in.Or(st.Equal(expression.Value(f)))
		}
	}
	nowMs := s.now().UnixMilli()
	upd := expression.Set(st, expression.Value(to)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(nowMs)).
		Remove(expression.Name(AttrLeaseUntil))
	upd = s.withIndex(upd, to, nowMs)
	if reason != "" {
		upd = upd.Set(expression.Name(AttrLastError), expression.Value(truncate(reason, 4000)))
	}
	if !expiresAt.IsZero() {
		upd = upd.Set(expression.Name(AttrExpiresAt), expression.Value(expiresAt.Unix()))
	}
	rec, err := s.updateByID(ctx, id, isJob(id).And(in), upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return rec, err == nil, err
}

// ErrKeyReused: the job's idempotency key now belongs to a newer job, so
// the old job cannot become active again (two active jobs would share the
// key). Enqueue with the key instead.
var ErrKeyReused = errors.New("nexjob: the job's idempotency key belongs to a newer job")

// Requeue moves a terminal job back to Enqueued with a fresh attempt budget
// (attempt 0, no TTL, last error kept): one update conditional on the job
// still being terminal. A job that is active gives a *NotClaimableError
// with its record; one whose key was re-used, ErrKeyReused.
func (s *Store) Requeue(ctx context.Context, id string) (Record, error) {
	st := expression.Name(AttrState)
	cond := isJob(id).
		And(expression.Or(st.Equal(expression.Value(Succeeded)), st.Equal(expression.Value(Failed)), st.Equal(expression.Value(Expired)))).
		And(expression.AttributeNotExists(expression.Name(AttrKeyHash)).Or(expression.Name(AttrPK).BeginsWith(keyPrefix)))
	upd := expression.Set(st, expression.Value(Enqueued)).
		Set(expression.Name(AttrAttempt), expression.Value(0)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(s.now().UnixMilli())).
		Remove(expression.Name(AttrExpiresAt)).
		Remove(expression.Name(AttrRunAt))
	upd = s.withIndex(upd, Enqueued, s.now().UnixMilli())
	rec, err := s.updateByID(ctx, id, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) && nc.Current.State.Terminal() && nc.Current.KeyHash != "" {
		return Record{}, ErrKeyReused
	}
	return rec, err
}

// DeadLetter ends a job whose message reached the dead-letter queue: one
// update to Failed with the reason, conditional on the job still being
// Enqueued, Scheduled or Processing. dead=false means it had already ended
// (a duplicate in the DLQ): nothing was written.
func (s *Store) DeadLetter(ctx context.Context, id, reason string, expiresAt time.Time) (Record, bool, error) {
	return s.move(ctx, id, []State{Enqueued, Scheduled, Processing}, Failed, reason, expiresAt)
}

// MarkUndispatched records that the job's SQS send failed after it was
// written (the rare path: one update), so that a caller retrying its key
// re-sends it at once. A job already claimed is left alone.
func (s *Store) MarkUndispatched(ctx context.Context, id string) error {
	return s.setUndispatched(ctx, id, true)
}

// ClearUndispatched removes the mark once the job was sent.
func (s *Store) ClearUndispatched(ctx context.Context, id string) error {
	return s.setUndispatched(ctx, id, false)
}

func (s *Store) setUndispatched(ctx context.Context, id string, on bool) error {
	cond := isJob(id).And(expression.Name(AttrAttempt).Equal(expression.Value(0)))
	var upd expression.UpdateBuilder
	if on {
		upd = expression.Set(expression.Name(AttrUndispatched), expression.Value(true))
	} else {
		upd = expression.Remove(expression.Name(AttrUndispatched))
	}
	_, err := s.updateByID(ctx, id, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nil // claimed meanwhile: it was sent after all
	}
	return err
}
