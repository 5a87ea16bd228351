package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
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
	return s.claim(ctx, id, lease, false)
}

// ClaimByCheck is Claim made by the dispatch guard's check message of a
// job that was never sent: it also marks the record (Record.ByCheck), so
// that the check message, the job's only one, is handled as the job's own
// from then on.
func (s *Store) ClaimByCheck(ctx context.Context, id string, lease time.Duration) (Record, error) {
	return s.claim(ctx, id, lease, true)
}

// Unclaim gives back a claim whose outcome the claimer could not learn
// (a *UnknownOutcomeError with the claim's nonce: its reply and the read
// back both failed, or its context ended), so that a claim applied for a
// run that never started spends no attempt: one update, conditional on
// that claim being the record's last write, back to Enqueued with its
// attempt returned and its lease cleared (its token stays taken). ok
// false: the claim was not applied, or something wrote the job since (a
// newer claim, a run's end): nothing is written. A claim still in flight
// that lands after Unclaim spends its attempt, as a killed worker's does.
func (s *Store) Unclaim(ctx context.Context, id, nonce string) (bool, error) {
	if nonce == "" {
		return false, nil
	}
	cond := isJob(id).And(expression.Name(AttrNonce).Equal(expression.Value(nonce))).
		And(expression.Name(AttrState).Equal(expression.Value(Processing)))
	nowMs := s.now().UnixMilli()
	upd := expression.Set(expression.Name(AttrState), expression.Value(Enqueued)).
		Set(expression.Name(AttrAttempt), expression.Name(AttrAttempt).Minus(expression.Value(1))).
		Set(expression.Name(AttrUpdatedAt), expression.Value(nowMs)).
		Remove(expression.Name(AttrLeaseUntil))
	_, err := s.updateByID(ctx, id, cond, s.withIndex(upd, Enqueued, id, nowMs))
	var nc *NotClaimableError
	switch {
	case errors.As(err, &nc) || errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

func (s *Store) claim(ctx context.Context, id string, lease time.Duration, byCheck bool) (Record, error) {
	nonce := NewNonce()
	x := s.claimExprs(id, lease, byCheck, s.now(), nonce)
	defer x.release()
	return s.updateJob(ctx, id, x, nonce)
}

// claimExprs is a claim's update. Its text depends on byCheck alone (the
// index's keys on the store's settings, the same for every claim).
func (s *Store) claimExprs(id string, lease time.Duration, byCheck bool, now time.Time, nonce string) exprs {
	e := s.claims.start(byCheck, 14, 10, 320) // a claim: 13 names, 9 values, about 300 bytes of update
	st, at, nowMs := e.n(AttrState), e.n(AttrAttempt), e.i(":now", now.UnixMilli())
	proc, one := e.state(":proc", Processing), e.c(":one", oneV)
	idv, enq, sch := e.s(":id", id), e.state(":enq", Enqueued), e.state(":sch", Scheduled)
	if e.writing() {
		e.cond = e.n(AttrID) + " = " + idv + " AND " + at + " < " + e.n(AttrMaxAttempts) +
			" AND (" + st + " = " + enq +
			" OR (" + st + " = " + sch + " AND " + e.n(AttrRunAt) + " <= " + nowMs + ")" +
			" OR (" + st + " = " + proc + " AND " + e.n(AttrLeaseUntil) + " <= " + nowMs + "))"
	}
	e.assign(AttrState, proc)
	e.assign(AttrLeaseUntil, e.i(":lease", now.Add(lease).UnixMilli()))
	e.assign(AttrUpdatedAt, nowMs)
	e.assign(AttrAttempt, at, " + ", one)
	e.assign(AttrToken, e.n(AttrToken), " + ", one)
	if byCheck {
		e.values[":byCheck"] = &types.AttributeValueMemberBOOL{Value: true}
		e.assign(AttrByCheck, ":byCheck")
	}
	e.index(s, Processing, id, nowMs)
	e.stamp(nonce)
	return s.claims.end(byCheck, e)
}

// ErrTooManyChildren: the parent already has MaxChildren continuations.
var ErrTooManyChildren = fmt.Errorf("nexjob: a job takes at most %d continuations", MaxChildren)

// updateByID runs a conditional update on the job with this id, wherever
// it lives (its key's record, or its own). The condition must include
// id = :id. A failed condition on the job gives *NotClaimableError with
// the current record; a failed condition that meets this very update
// (applied, its reply lost, resent by the SDK) is a success.
func (s *Store) updateByID(ctx context.Context, id string, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (Record, error) {
	nonce := NewNonce()
	// Built once: an UpdateBuilder shares its operations between copies,
	// so setting the nonce per try would set it twice on the second pk.
	in, err := buildUpdate(cond, stampBuilder(upd, nonce))
	if err != nil {
		return Record{}, err
	}
	return s.updateJob(ctx, id, in, nonce)
}

// updateJob is updateByID with the expressions built; they set the nonce.
func (s *Store) updateJob(ctx context.Context, id string, in exprs, nonce string) (Record, error) {
	pks, err := locate(id)
	if err != nil {
		return Record{}, err
	}
	now := s.now()
	for _, pk := range pks {
		rec, err := s.update(ctx, pk, id, in, nonce)
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
	// Began, with a State that ends the job (Succeeded, Failed), is when
	// the run began: kept as the record's RunAt, so an ended job's RunAt
	// is its last run's start, which the byState index projects (the
	// dashboard's run times read it). Zero, with such a State, removes
	// RunAt: an end no run's start is known of (an orphan out of
	// attempts) keeps none. A cancel (Withdraw, EndActive) keeps a job's
	// due time, which its far schedule is named by; DeadLetter removes it.
	Began     time.Time
	ExpiresAt time.Time // end of the retention (see TTL); zero keeps the record forever
	// CutOff: the invocation's deadline cut the run off. The attempt is
	// given back and the cut-off counted in Record.CutOffs; any other end
	// of a run clears that count.
	CutOff bool
	// Deferred: the run never started (flow control found no free slot:
	// a throttle's, a concurrency key's). With State Scheduled and RunAt,
	// the attempt is given back and nothing is added to the history or
	// the error; the claim is undone but for its token.
	Deferred bool
	// Slot, with Deferred: the throttle slot the attempt took, kept on
	// the record (Record.Slot) for its next claim. Zero keeps none.
	Slot time.Time
	// Ticket, with Deferred: the run's place in its concurrency key's
	// queue (Admission.Ticket), kept on the record (Record.Ticket). Zero
	// keeps none.
	Ticket int64
	// HookPending, with State Failed, marks the record until HookDone:
	// its dead-letter hook is due (Record.HookPending).
	HookPending bool
	// HookLease, with HookPending, is how long the caller holds the hook
	// (Record.HookUntil): no ClaimHook takes it over before then. Zero:
	// any worker that meets the mark may take the hook at once.
	HookLease time.Duration
	// Nonce identifies this logical write across the caller's own
	// retries of it (NewNonce). Empty: Finish picks a fresh one, and a
	// later call cannot recognise an earlier call's applied write.
	Nonce string
	// Cancelled, with State Failed, marks the end an operator's cancel
	// (Record.Cancelled): a running job stopped at its next step.
	Cancelled bool
	// Result, with State Succeeded, is the run's result (its JSON), kept
	// as Record.Result by this same update: at most ResultRoom(rec)
	// bytes, valid UTF-8; with a blob bucket (Options.BlobBucket) up to
	// MaxBlobStepBytes, one over ResultRoom written as an object first
	// and named by Record.ResultBlob. "" keeps none.
	Result string
	// resultBlob is the object Finish wrote for a Result over ResultRoom.
	resultBlob string
	// Ran: the run recorded a step in the steps table (Options.StepsTable),
	// which the record does not show: marked on the record (Record.RanMark)
	// so that Ran reads the job as one that ran.
	Ran bool
	// AwaitChildren, with Deferred and RunAt, is a sleep in a wait for
	// children (handler.Await): RunAt is kept as Record.AwaitEnd, which
	// a child's end reads to wake the job (WaitingChildren). Any other
	// finish removes it.
	AwaitChildren bool
}

// Finish ends the run that claimed rec: one update, conditional on the
// record still carrying rec's fencing token and being Processing. If it
// does not, the error is ErrFenced and nothing is written.
//
// Finish may be called again with the same rec and f after an error (a
// throttle that outlasted the SDK's retries, a timeout): with f.Nonce set
// once for the logical write, a call whose earlier try was applied after
// all reads that write as its own and succeeds. The nonce is the writer's
// own: another worker finishing the same record (two messages of an
// orphan) has its own, so its write never reads as ours.
//
// A Result with another State than Succeeded, or that is not UTF-8, is an
// error, and one over ResultRoom(rec) a *ResultTooLargeError: nothing is
// written then.
func (s *Store) Finish(ctx context.Context, rec Record, f Finish) (Record, error) {
	if !f.State.Valid() || f.State == Processing {
		return Record{}, fmt.Errorf("nexjob: cannot finish a run as %q", f.State)
	}
	if f.State == Succeeded && len(f.Result) > ResultRoom(rec) && s.bucket != "" && len(f.Result) <= MaxBlobStepBytes && utf8.ValidString(f.Result) {
		// Over what the record carries: an object first (content-addressed:
		// a resend writes the same one), then the update naming it.
		key, err := s.putResultBlob(ctx, rec, f.Result)
		if err != nil {
			return Record{}, err
		}
		f.Result, f.resultBlob = "", key
	}
	if err := checkResult(rec, f); err != nil {
		return Record{}, err
	}
	nonce := f.Nonce
	if nonce == "" {
		nonce = NewNonce()
	}
	x := s.finishExprs(rec, f, s.now(), nonce)
	out, err := s.update(ctx, rec.PK, rec.ID, x, nonce)
	x.release()
	var held *heldError
	if errors.As(err, &held) {
		return Record{}, fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return out, err
}

// finishShape is what decides the text of a Finish's update: its state
// and which of its branches it takes (never a value).
type finishShape struct {
	state                                       State
	lastError, deferred, runAt, hook, hookLease bool
	expires, cutOff, dropDefers, slot, dropSlot bool
	ticket, dropTicket, result, cancelled       bool
	dropResult, dropReopen, ran                 bool
	resultBlob, dropResultBlob                  bool
	await, dropAwait, began, dropRunAt          bool
}

// finishExprs is a Finish's update, its nonce given.
func (s *Store) finishExprs(rec Record, f Finish, now time.Time, nonce string) exprs {
	k := finishShape{
		state: f.State, lastError: f.LastError != "", deferred: f.Deferred, runAt: !f.RunAt.IsZero(),
		hook: f.HookPending && f.State == Failed, hookLease: f.HookLease > 0, expires: !f.ExpiresAt.IsZero(),
		cutOff: f.CutOff, dropDefers: !f.Deferred && rec.Defers > 0,
		slot: f.Deferred && !f.Slot.IsZero(), dropSlot: rec.Slot != 0,
		ticket: f.Deferred && f.Ticket != 0, dropTicket: rec.Ticket != 0,
		result: f.State == Succeeded && f.Result != "", cancelled: f.State == Failed && f.Cancelled,
		dropResult: rec.Result != "" && (f.State != Succeeded || f.Result == ""),
		resultBlob: f.State == Succeeded && f.resultBlob != "", dropResultBlob: rec.ResultBlob != "" && (f.State != Succeeded || f.resultBlob == ""),
		dropReopen: rec.ReopenWaits && !f.Deferred, // a deferral ran nothing: the run to come opens the waits
		ran:        f.Ran && !rec.RanMark,
		await:      f.AwaitChildren && f.Deferred && !f.RunAt.IsZero(),
		began:      f.State.Terminal() && f.RunAt.IsZero() && !f.Began.IsZero(),
	}
	// An end with no run's start (an orphan out of attempts) keeps no
	// RunAt: an ended job's RunAt is its last run's start or nothing.
	k.dropRunAt = f.State.Terminal() && f.RunAt.IsZero() && !k.began && rec.RunAt != 0
	k.dropAwait = rec.AwaitEnd != 0 && !k.await
	e := s.finishes.start(k, 21, 15, 544) // a Finish: up to 20 names, 14 values, about 510 bytes of update
	nowMs := e.i(":now", now.UnixMilli())
	st := e.state(":st", f.State)
	e.assign(AttrState, st)
	e.assign(AttrUpdatedAt, nowMs)
	e.drop(AttrLeaseUntil)
	e.index(s, k.state, rec.ID, nowMs)
	switch {
	case k.state == Succeeded:
		e.drop(AttrLastError) // a success shows no retry's error; the history keeps it
		e.drop(AttrListErr)
	case k.lastError:
		e.assign(AttrLastError, e.s(":err", truncate(f.LastError, MaxLastError)))
		e.assign(AttrListErr, e.s(":listErr", truncate(f.LastError, MaxListError)))
	}
	if !k.deferred {
		e.history(Attempt{N: rec.Attempt, At: now.UnixMilli(), State: f.State, Error: truncate(f.LastError, MaxAttemptError)})
	}
	if k.runAt {
		e.assign(AttrRunAt, e.i(":runAt", f.RunAt.UnixMilli()))
	} else if k.began {
		e.assign(AttrRunAt, e.i(":runAt", f.Began.UnixMilli()))
	} else if k.dropRunAt {
		e.drop(AttrRunAt)
	}
	if k.hook {
		e.values[":hookPending"] = &types.AttributeValueMemberBOOL{Value: true}
		e.assign(AttrHookPending, ":hookPending")
		if k.hookLease {
			e.assign(AttrHookUntil, e.i(":hookUntil", now.Add(f.HookLease).UnixMilli()))
		}
	}
	if k.expires {
		e.assign(AttrExpiresAt, e.i(":exp", TTL(f.ExpiresAt)))
	}
	if k.result {
		e.assign(AttrResult, e.s(":result", f.Result))
	} else if k.dropResult {
		e.drop(AttrResult) // a run before a requeue's, which the requeue left (only then: no name in every finish)
	}
	if k.resultBlob {
		e.assign(AttrResultBlob, e.s(":resultBlob", f.resultBlob))
	} else if k.dropResultBlob {
		e.drop(AttrResultBlob)
	}
	if k.dropReopen {
		e.drop(AttrReopenWaits) // the requeue's mark: its first run ends (ReopenTimedOutWaits removed it if it had waits to open)
	}
	if k.cancelled {
		e.values[":cancelled"] = &types.AttributeValueMemberBOOL{Value: true}
		e.assign(AttrCancelled, ":cancelled")
	}
	if k.ran {
		e.values[":ran"] = &types.AttributeValueMemberBOOL{Value: true}
		e.assign(AttrRan, ":ran")
	}
	if k.await {
		e.assign(AttrAwaitEnd, e.i(":awaitEnd", f.RunAt.UnixMilli()))
	} else if k.dropAwait {
		e.drop(AttrAwaitEnd)
	}
	switch {
	case k.deferred: // the cut-offs stand
		at, d, one := e.n(AttrAttempt), e.n(AttrDefers), e.c(":one", oneV)
		e.assign(AttrAttempt, at, " - ", one)
		e.assign(AttrDefers, "if_not_exists(", d, ", ", e.c(":zero", zeroV), ") + ", one)
	case k.cutOff:
		at, co, one := e.n(AttrAttempt), e.n(AttrCutOffs), e.c(":one", oneV)
		e.assign(AttrAttempt, at, " - ", one)
		e.assign(AttrCutOffs, "if_not_exists(", co, ", ", e.c(":zero", zeroV), ") + ", one)
	default:
		e.drop(AttrCutOffs)
	}
	if k.dropDefers {
		e.drop(AttrDefers) // a run ended (rec is the claim's, so this is the current count)
	}
	switch {
	case k.slot:
		e.assign(AttrSlot, e.i(":slot", f.Slot.UnixMilli()))
	case k.dropSlot:
		e.drop(AttrSlot)
	}
	switch {
	case k.ticket:
		e.assign(AttrTicket, e.i(":ticket", f.Ticket))
	case k.dropTicket:
		e.drop(AttrTicket)
	}
	id, token, proc := e.s(":id", rec.ID), e.i(":token", rec.Token), e.state(":proc", Processing)
	if e.writing() {
		e.cond = e.n(AttrID) + " = " + id + " AND " + e.n(AttrToken) + " = " + token + " AND " + e.n(AttrState) + " = " + proc
	}
	e.stamp(nonce)
	return s.finishes.end(k, e)
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
//
// An error that does not tell whether the update was applied (a 500 whose
// resends were throttled past the SDK's retries, a timeout) is followed
// by one consistent read: finding the nonce, the update was ours and
// applied; not finding it, the error stands; a read that fails too gives
// an *UnknownOutcomeError.
func (s *Store) update(ctx context.Context, pk, id string, in exprs, nonce string) (Record, error) {
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: pk}},
		ConditionExpression:                 in.cond,
		UpdateExpression:                    in.update,
		ExpressionAttributeNames:            in.names,
		ExpressionAttributeValues:           in.values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err := s.conditionError("update job", err); err != nil {
		var held *heldError
		if errors.As(err, &held) {
			if held.rec.Wrote(nonce) {
				return held.rec, nil // our own update, applied but its reply lost
			}
			return Record{}, err
		}
		if !unknownOutcome(err) {
			return Record{}, err
		}
		// Applied, its reply lost, then the resends throttled or timed
		// out: the error does not tell. Read back and recognise our own
		// write before anyone decides on a write that happened.
		cur, found, rerr := s.getPK(ctx, pk, true)
		switch {
		case rerr != nil:
			return Record{}, &UnknownOutcomeError{ID: id, Err: errors.Join(err, rerr), Nonce: nonce}
		case found && cur.Wrote(nonce):
			return cur, nil
		}
		return Record{}, err
	}
	rec, err := decodeRecord(out.Attributes)
	if err != nil {
		return Record{}, fmt.Errorf("nexjob: decode job record: %w", err)
	}
	return rec, nil
}

// isJob is the condition that the item is this job (a key's record may
// hold another job by now).
func isJob(id string) expression.ConditionBuilder {
	return expression.Name(AttrID).Equal(expression.Value(id))
}

// HookDone clears rec's HookPending (and its lease) once its dead-letter
// hook has run: one update. A record already cleared (a second worker's
// call, an earlier try applied) is no error; a missing one is ErrNotFound.
func (s *Store) HookDone(ctx context.Context, rec Record) error {
	cond := isJob(rec.ID).And(expression.AttributeExists(expression.Name(AttrHookPending)))
	upd := expression.Remove(expression.Name(AttrHookPending)).Remove(expression.Name(AttrHookUntil)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(s.now().UnixMilli()))
	_, err := s.updateByID(ctx, rec.ID, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nil
	}
	return err
}

// ExtendHook moves the lease on the job's due hook to until (unix ms),
// conditional on the lease being one the caller holds (held: the values
// it wrote, the last one's reply perhaps lost). ok=false: the hook is no
// longer the caller's (done, or taken over after its lease ran out).
// The holder of a hook that runs long calls it well before each lease
// ends, so a duplicate delivery never takes a running hook over.
func (s *Store) ExtendHook(ctx context.Context, id string, held []int64, until int64) (bool, error) {
	if len(held) == 0 {
		return false, nil
	}
	vals := make([]expression.OperandBuilder, 0, len(held)+1)
	for _, h := range held {
		vals = append(vals, expression.Value(h))
	}
	vals = append(vals, expression.Value(until)) // our own write, applied with its reply lost
	cond := isJob(id).And(expression.AttributeExists(expression.Name(AttrHookPending))).
		And(expression.Name(AttrHookUntil).In(vals[0], vals[1:]...))
	// UpdatedAt moves too: a write conditional on the record as read (the
	// next recurring firing moving it aside) must not copy a lease the
	// holder has since extended (its copy's stale lease ended while the
	// hook ran, and the hook ran twice).
	upd := expression.Set(expression.Name(AttrHookUntil), expression.Value(until)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(s.now().UnixMilli()))
	_, err := s.updateByID(ctx, id, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return false, nil
	}
	return err == nil, err
}

// ClaimHook takes over the due dead-letter hook of the job rec for lease:
// one update, conditional on the hook still being due and no one's lease
// on it running (the worker that made the job Failed holds it first, see
// Finish.HookLease). ok reports that the caller holds it now and must run
// it, then call HookDone; a reply lost after the update applied still
// reads as ok. Not ok, cur is the record as found: cur.HookPending with
// cur.HookUntil ahead means another worker is running the hook (look
// again after HookUntil); no HookPending means it ran. A job that is
// gone is ErrNotFound.
//
// Two workers that meet the mark at once (a duplicate delivery, the DLQ
// consumer) so run the hook once between them; it runs twice only when
// its holder dies between the hook and HookDone.
func (s *Store) ClaimHook(ctx context.Context, rec Record, lease time.Duration) (cur Record, ok bool, err error) {
	now := s.now().UnixMilli()
	until := expression.Name(AttrHookUntil)
	cond := isJob(rec.ID).And(expression.AttributeExists(expression.Name(AttrHookPending))).
		And(expression.Or(expression.AttributeNotExists(until), until.LessThanEqual(expression.Value(now))))
	upd := expression.Set(until, expression.Value(now+lease.Milliseconds())).Set(expression.Name(AttrUpdatedAt), expression.Value(now))
	cur, err = s.updateByID(ctx, rec.ID, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return cur, err == nil, err
}
