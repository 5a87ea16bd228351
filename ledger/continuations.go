package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
)

// Release moves a waiting continuation to Enqueued: one update conditional
// on it still waiting, so a child is released once however many times its
// parent's completion is replayed. released=false means it was not waiting.
// A fan-in child (Record.Parents) is not released by this: see ReleaseFrom.
func (s *Store) Release(ctx context.Context, childID string) (Record, bool, error) {
	st := expression.Name(AttrState)
	cond := isJob(childID).And(st.Equal(expression.Value(AwaitingContinuation))).And(expression.AttributeNotExists(expression.Name(AttrParents)))
	return s.transition(ctx, childID, cond, expression.Set(st, expression.Value(Enqueued)), Enqueued, "", time.Time{})
}

// ReleaseFrom counts parentID's success for the waiting continuation
// childID: a single-parent child is released (Release); a fan-in child
// has parentID added to its Released set (one update; a set, so counting
// a parent again, a replay or a resend whose reply was lost, changes
// nothing), and is released by a second update once the set holds every
// parent. released=false means it is not released by this call: still
// waiting for other parents, or not waiting (the current record says).
func (s *Store) ReleaseFrom(ctx context.Context, childID, parentID string) (Record, bool, error) {
	rec, released, err := s.Release(ctx, childID)
	if err != nil || released || rec.State != AwaitingContinuation || len(rec.Parents) == 0 {
		return rec, released, err
	}
	st := expression.Name(AttrState)
	cond := isJob(childID).And(st.Equal(expression.Value(AwaitingContinuation))).
		And(expression.Contains(expression.Name(AttrParents), parentID))
	rec, err = s.updateByID(ctx, childID, cond, expression.Add(expression.Name(AttrReleased), expression.Value(stringSet(parentID))))
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil // released meanwhile, ended, or not a parent of it
	}
	if err != nil {
		return Record{}, false, err
	}
	for _, p := range rec.Parents {
		if !slices.Contains(rec.Released, p) {
			return rec, false, nil // waiting for p
		}
	}
	cond = isJob(childID).And(st.Equal(expression.Value(AwaitingContinuation))).
		And(expression.Size(expression.Name(AttrReleased)).Equal(expression.Value(len(rec.Parents))))
	return s.transition(ctx, childID, cond, expression.Set(st, expression.Value(Enqueued)), Enqueued, "", time.Time{})
}

// Cancel ends a waiting continuation as its parent ended (Failed or
// Expired) with the reason. cancelled=false means it was not waiting.
func (s *Store) Cancel(ctx context.Context, childID string, as State, reason string, expiresAt time.Time) (Record, bool, error) {
	if as != Failed && as != Expired {
		return Record{}, false, fmt.Errorf("nexjob: a continuation is cancelled as Failed or Expired, not %q", as)
	}
	return s.move(ctx, childID, []State{AwaitingContinuation}, as, reason, expiresAt)
}

// Rewait puts back to waiting a continuation that its parent's end ended
// without a run (Failed or Expired, attempt 0, ParentID parentID): one
// conditional update to AwaitingContinuation, its TTL and cancelled mark
// removed. Requeueing the parent does it for every such child, so they
// run once the parent Succeeds; the child's id stayed in the parent's
// Children, so no link is written. rewaited=false (with the current
// record) means the child was not such: it ran, is waiting already, or
// is a fan-in child (see WaitAgain).
func (s *Store) Rewait(ctx context.Context, childID, parentID string) (Record, bool, error) {
	st := expression.Name(AttrState)
	cond := isJob(childID).
		And(st.Equal(expression.Value(Failed)).Or(st.Equal(expression.Value(Expired)))).
		And(expression.Name(AttrParentID).Equal(expression.Value(parentID))).
		And(expression.Name(AttrAttempt).Equal(expression.Value(0)))
	upd := expression.Set(st, expression.Value(AwaitingContinuation)).
		Remove(expression.Name(AttrExpiresAt)).Remove(expression.Name(AttrCancelled))
	return s.transition(ctx, childID, cond, upd, AwaitingContinuation, "waiting again: its parent "+parentID+" was requeued", time.Time{})
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
	upd := expression.Set(st, expression.Value(to))
	if to.Terminal() {
		upd = upd.Remove(expression.Name(AttrRunAt)) // an end no run wrote: no run's start (Finish.Began)
	}
	return s.transition(ctx, id, isJob(id).And(in), upd, to, reason, expiresAt)
}

// transition applies upd, plus what every move to state to writes (the
// time, the index, no lease, the reason and the TTL if given), to the job
// if cond holds. moved=false (with the current record) means it did not.
func (s *Store) transition(ctx context.Context, id string, cond expression.ConditionBuilder, upd expression.UpdateBuilder, to State, reason string, expiresAt time.Time) (Record, bool, error) {
	nowMs := s.now().UnixMilli()
	upd = upd.Set(expression.Name(AttrUpdatedAt), expression.Value(nowMs))
	if to != Processing {
		// A Processing job keeps its (run-out) lease: the claim that takes
		// it over compares it with now, and a missing one compares false.
		upd = upd.Remove(expression.Name(AttrLeaseUntil))
	}
	upd = s.withIndex(upd, to, id, nowMs)
	if reason != "" {
		upd = upd.Set(expression.Name(AttrLastError), expression.Value(truncate(reason, MaxLastError))).
			Set(expression.Name(AttrListErr), expression.Value(truncate(reason, MaxListError)))
	}
	if !expiresAt.IsZero() {
		upd = upd.Set(expression.Name(AttrExpiresAt), expression.Value(TTL(expiresAt)))
	}
	rec, err := s.updateByID(ctx, id, cond, upd)
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
// (attempt 0, no TTL, no deadline, last error kept): one update
// conditional on the job still being terminal. A job that is active gives a
// *NotClaimableError with its record; one whose key was re-used,
// ErrKeyReused; a DeadLetterKind record (a message that was not a job),
// ErrDeadLetterRecord. Nothing is written in those cases.
//
// The deadline is cleared: it bounded the job's first start, and a job
// requeued by hand is started again on purpose. The result of the run
// before is not written (an operator's update may not name it, see
// infra.OperatorAttributes): it stays in the item, and no reader takes it
// (a record's result counts only while it is Succeeded); the next run's
// Finish replaces or removes it.
func (s *Store) Requeue(ctx context.Context, id string) (Record, error) {
	return s.RequeueFrom(ctx, id, Succeeded, Failed, Expired)
}

// RequeueFrom is Requeue of a job still in one of the states from (all
// terminal): a bulk requeue of the jobs listed as Failed must not requeue
// one that another operator requeued meanwhile and that has since
// Succeeded. A job in another state gives a *NotClaimableError with its
// record, and nothing is written.
//
// A continuation (a record with a ParentID, or a fan-in child's Parents)
// is not requeued here: the error is a *NotClaimableError whose Current
// names them, for the caller to look at the parents first
// (RequeueContinuation, WaitAgain).
func (s *Store) RequeueFrom(ctx context.Context, id string, from ...State) (Record, error) {
	return s.requeue(ctx, id, false, from)
}

// RequeueContinuation is RequeueFrom of a continuation, for a caller that
// saw every parent of it Succeeded (or gone).
func (s *Store) RequeueContinuation(ctx context.Context, id string, from ...State) (Record, error) {
	return s.requeue(ctx, id, true, from)
}

func (s *Store) requeue(ctx context.Context, id string, continuation bool, from []State) (Record, error) {
	if len(from) == 0 {
		return Record{}, fmt.Errorf("nexjob: RequeueFrom needs a state")
	}
	st := expression.Name(AttrState)
	for _, f := range from {
		if !f.Terminal() {
			return Record{}, fmt.Errorf("nexjob: only terminal jobs can be requeued, not %s ones", f)
		}
	}
	inFrom := st.Equal(expression.Value(from[0]))
	for _, f := range from[1:] {
		inFrom = inFrom.Or(st.Equal(expression.Value(f)))
	}
	if !continuation {
		inFrom = inFrom.And(expression.AttributeNotExists(expression.Name(AttrParentID))).
			And(expression.AttributeNotExists(expression.Name(AttrParents)))
	}
	cond := isJob(id).
		And(inFrom).
		And(expression.AttributeNotExists(expression.Name(AttrNonJob))).
		And(expression.AttributeNotExists(expression.Name(AttrKeyHash)).Or(expression.Name(AttrPK).BeginsWith(keyPrefix)))
	nowMs := s.now().UnixMilli()
	upd := expression.Set(st, expression.Value(Enqueued)).
		Set(expression.Name(AttrAttempt), expression.Value(0)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(nowMs)).
		// Its next run opens the waits that timed out (ReopenTimedOutWaits:
		// the worker's write; an operator may not write steps).
		Set(expression.Name(AttrReopenWaits), expression.Value(true))
	for _, a := range []string{AttrExpiresAt, AttrRunAt, AttrDeadline, AttrCutOffs, AttrReturns, AttrReturnOf, AttrReturnAt, AttrUndispatched, AttrCancelled, AttrCancelReq} {
		upd = upd.Remove(expression.Name(a))
	}
	upd = s.withIndex(upd, Enqueued, id, nowMs)
	rec, err := s.updateByID(ctx, id, cond, upd)
	var nc *NotClaimableError
	switch {
	case errors.As(err, &nc) && nc.Current.NonJob:
		return Record{}, ErrDeadLetterRecord
	case errors.As(err, &nc) && nc.Current.Continues() && !continuation:
		return Record{}, err // a continuation: the caller looks at its parents
	case errors.As(err, &nc) && nc.Current.State.Terminal() && nc.Current.KeyHash != "" && slices.Contains(from, nc.Current.State):
		return Record{}, ErrKeyReused
	}
	return rec, err
}

// Withdraw cancels a job that has not started: one update from Enqueued or
// Scheduled to Failed, keeping the reason, marking the record Cancelled
// and setting the TTL if given. withdrawn=false (with the current record)
// means the job was in neither state (a run claimed it, or it ended):
// nothing was written. Its SQS message, when delivered, is acknowledged
// without a run (the claim fails). Requeue undoes it.
//
// A cancelled job is Failed for every rule that reads the state, the
// DuplicatePolicy matrix included: RejectIfFailed and RejectAll refuse its
// key until the record is deleted or its retention ends.
func (s *Store) Withdraw(ctx context.Context, id, reason string, expiresAt time.Time) (Record, bool, error) {
	st := expression.Name(AttrState)
	cond := isJob(id).And(st.Equal(expression.Value(Enqueued)).Or(st.Equal(expression.Value(Scheduled)))).
		And(expression.Name(AttrCompensable).AttributeNotExists()) // its cancel is a run that compensates (RequestCompensation)
	upd := expression.Set(st, expression.Value(Failed)).Set(expression.Name(AttrCancelled), expression.Value(true))
	return s.transition(ctx, id, cond, upd, Failed, reason, expiresAt)
}

// EndActive ends an active job (Enqueued, Scheduled, Processing or
// AwaitingContinuation) before its record is deleted: one update to
// Failed, marked Cancelled, keeping the reason and setting the TTL if
// given. Ended, it takes no continuation any more (Link refuses an ended
// parent) and a run of it is fenced off (its Finish finds it no longer
// Processing). ended=false (with the current record) means the job was
// not active: nothing was written.
func (s *Store) EndActive(ctx context.Context, id, reason string, expiresAt time.Time) (Record, bool, error) {
	st := expression.Name(AttrState)
	cond := isJob(id).And(st.In(expression.Value(Enqueued), expression.Value(Scheduled), expression.Value(Processing), expression.Value(AwaitingContinuation)))
	upd := expression.Set(st, expression.Value(Failed)).Set(expression.Name(AttrCancelled), expression.Value(true))
	return s.transition(ctx, id, cond, upd, Failed, reason, expiresAt)
}

// ErrDeadLetterRecord: the record keeps a message that was not a job
// (DeadLetterKind); there is nothing to run, so it cannot be requeued.
var ErrDeadLetterRecord = errors.New("nexjob: a dead-letter record keeps a message that was not a job; it cannot be requeued")

// DeadLetter ends a job whose message reached the dead-letter queue: one
// update to Failed with the reason, conditional on the job still being as
// seen (same state and fencing token), which must be Enqueued, Scheduled
// or Processing. dead=false (with the current record) means it moved on
// meanwhile (a run claimed or ended it): nothing was written.
//
// hookLease > 0 (the kind has a dead-letter hook) marks the hook due on
// the same write (HookPending) and held by the caller for hookLease, as
// Finish does: a consumer killed inside the hook leaves the mark, and the
// dead letter's next delivery takes the hook over once the lease ends.
func (s *Store) DeadLetter(ctx context.Context, seen Record, reason string, expiresAt time.Time, hookLease time.Duration) (Record, bool, error) {
	if !seen.State.Active() || seen.State == AwaitingContinuation {
		return seen, false, nil
	}
	// An end no run of its own wrote: its RunAt is no run's start
	// (Finish.Began), so none is kept.
	upd := expression.Set(expression.Name(AttrState), expression.Value(Failed)).Remove(expression.Name(AttrRunAt))
	if hookLease > 0 {
		upd = upd.Set(expression.Name(AttrHookPending), expression.Value(true)).
			Set(expression.Name(AttrHookUntil), expression.Value(s.now().Add(hookLease).UnixMilli()))
	}
	return s.moveSeen(ctx, seen, upd, Failed, reason, expiresAt)
}

// Return sends back a job whose message reached the dead-letter queue
// before it could run: a job no run of it started (Enqueued, Scheduled),
// or one whose last claim's lease ran out with attempts left (Processing:
// the next claim takes it over). One update, conditional on the job still
// being as seen, that counts the return in Record.Returns, keeps the
// reason, and names the dead letter counted (msgID, its SQS message id)
// in Record.ReturnOf, and the time in Record.ReturnAt. The caller then
// dispatches it.
//
// A dead letter is counted once: seen.ReturnOf == msgID (a redelivery of
// the dead letter, whose handling failed after its count was written: the
// send throttled, the consumer killed) writes nothing and returns seen,
// to be dispatched again. Without it, one dead letter delivered four
// times failed a job as never started (10k soak, seed
// 1796502170212235855). returned=false (with the current record) means
// it moved on meanwhile.
func (s *Store) Return(ctx context.Context, seen Record, msgID, reason string) (Record, bool, error) {
	if seen.State != Enqueued && seen.State != Scheduled && seen.State != Processing {
		return seen, false, nil
	}
	if msgID != "" && seen.ReturnOf == msgID {
		return seen, true, nil
	}
	// The state and token stay as they were, so the condition also names
	// the count: a resend of an applied Return then fails it and finds its
	// own nonce, instead of counting twice.
	upd := expression.Set(expression.Name(AttrReturns), expression.Value(seen.Returns+1))
	upd = upd.Set(expression.Name(AttrReturnAt), expression.Value(s.now().UnixMilli()))
	if msgID != "" {
		upd = upd.Set(expression.Name(AttrReturnOf), expression.Value(msgID))
	}
	same := expression.Name(AttrReturns).Equal(expression.Value(seen.Returns))
	if seen.Returns == 0 {
		same = expression.AttributeNotExists(expression.Name(AttrReturns))
	}
	return s.transition(ctx, seen.ID, seenCond(seen).And(same), upd, seen.State, reason, time.Time{})
}

// seenCond holds while the job is still in seen's state with seen's
// fencing token.
func seenCond(seen Record) expression.ConditionBuilder {
	return isJob(seen.ID).
		And(expression.Name(AttrState).Equal(expression.Value(seen.State))).
		And(expression.Name(AttrToken).Equal(expression.Value(seen.Token)))
}

// moveSeen applies upd (which moves the job to state to) if the job is
// still in seen's state with seen's fencing token.
func (s *Store) moveSeen(ctx context.Context, seen Record, upd expression.UpdateBuilder, to State, reason string, expiresAt time.Time) (Record, bool, error) {
	return s.transition(ctx, seen.ID, seenCond(seen), upd, to, reason, expiresAt)
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
