package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// A continuation and its links to its parents are written in one
// TransactWriteItems (InsertContinuation, Rewait): a parent counts a
// child (its Children set, which its completing write returns) exactly
// when the child waits for it. Written one after the other, a producer
// killed in between left a child that no parent counts, waiting for ever
// (or, links first, a parent that completed before the child existed and
// released nothing). A transaction costs two write units per item where
// the separate writes cost one each; continuations are not the hot path.

// LinkRefusedError: a transaction that links a continuation to ParentID
// was cancelled by the parent's condition: it ended, holds MaxChildren
// continuations, or is no longer where it was read (gone, or its key
// re-used). Nothing was written; read the parent to decide.
type LinkRefusedError struct{ ParentID string }

func (e *LinkRefusedError) Error() string {
	return fmt.Sprintf("nexjob: job %s refused the continuation's link (it ended, is full or is gone)", e.ParentID)
}

// linkCond: the item is parentID, it has not ended, and it has room for
// childID (or holds it already, so a resent link passes). The child's id
// kept in the parent, not found through an index, is what the parent's
// completing write returns: its children, strongly consistent, no query.
func linkCond(parentID, childID string) expression.ConditionBuilder {
	st := expression.Name(AttrState)
	children := expression.Name(AttrChildren)
	return isJob(parentID).
		And(st.NotEqual(expression.Value(Succeeded)), st.NotEqual(expression.Value(Failed)), st.NotEqual(expression.Value(Expired))).
		And(expression.Or(
			expression.AttributeNotExists(children),
			expression.Size(children).LessThan(expression.Value(MaxChildren)),
			expression.Contains(children, childID),
		))
}

// linkItems are the transaction's updates adding childID to the Children
// of each parent (as read: its partition key), under linkCond, each with
// nonce.
func (s *Store) linkItems(parents []Record, childID, nonce string) ([]types.TransactWriteItem, error) {
	items := make([]types.TransactWriteItem, 0, len(parents))
	for _, p := range parents {
		upd := stampBuilder(expression.Add(expression.Name(AttrChildren), expression.Value(stringSet(childID))), nonce)
		in, err := buildUpdate(linkCond(p.ID, childID), upd)
		if err != nil {
			return nil, err
		}
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName:                 aws.String(s.table),
			Key:                       map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: p.PK}},
			ConditionExpression:       in.cond,
			UpdateExpression:          in.update,
			ExpressionAttributeNames:  in.names,
			ExpressionAttributeValues: in.values,
		}})
	}
	return items, nil
}

// InsertContinuation is Insert of a continuation with its links: one
// TransactWriteItems writes the child rec (its ParentID or Parents, its
// state, set by the caller) under the key's rules as Insert applies them,
// and adds its id to the Children of each of link (the parents as read,
// still to count it) under Link's condition. All of it is written, or
// none. With no link it is Insert.
//
// It returns the child as written (created); or the key's active holder
// (created=false: nothing written; so is the job of the same request); a
// *DuplicateJobError when the policy protects a terminal holder; a
// *LinkRefusedError naming a parent whose condition failed (nothing
// written). An error that leaves the outcome open is an
// *UnknownOutcomeError with the child's id: read it to tell. A resend of
// the applied transaction (its reply lost) meets its own child and reads
// as created.
func (s *Store) InsertContinuation(ctx context.Context, rec Record, key string, policy DuplicatePolicy, link []Record) (Record, bool, error) {
	if len(link) == 0 {
		return s.Insert(ctx, rec, key, policy, nil)
	}
	if !policy.Valid() {
		return Record{}, false, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(policy))
	}
	if len(rec.Args) > MaxArgsBytes {
		return Record{}, false, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(rec.Args), MaxArgsBytes)
	}
	now := s.now()
	rec = s.stamp(rec, key, policy, now)
	links, err := s.linkItems(link, rec.ID, NewNonce())
	if err != nil {
		return Record{}, false, err
	}
	cond := absent()
	if key != "" {
		cond = keyFree(now)
	}
	put := s.putItem(rec, cond)
	put.Put.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	head := []types.TransactWriteItem{put}
	const tries = 8
	for range tries {
		_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: append(head[:len(head):len(head)], links...)})
		if err == nil {
			return rec, true, nil
		}
		var tce *types.TransactionCanceledException
		if !errors.As(err, &tce) {
			return Record{}, false, uncertain(rec.ID, fmt.Errorf("nexjob: add continuation in %s: %w", s.table, err))
		}
		reasons := tce.CancellationReasons
		code := func(i int) string {
			if i >= len(reasons) {
				return ""
			}
			return aws.ToString(reasons[i].Code)
		}
		if len(head) == 1 && code(0) == "ConditionalCheckFailed" {
			var old Record
			if len(reasons[0].Item) > 0 {
				if old, err = decodeRecord(reasons[0].Item); err != nil {
					return Record{}, false, fmt.Errorf("nexjob: decode job record: %w", err)
				}
			}
			switch {
			case old.ID == rec.ID:
				return old, true, nil // our own transaction, applied, its reply lost
			case key == "" || old.ID == "":
				return Record{}, false, fmt.Errorf("nexjob: add continuation in %s: %w", s.table, err)
			case old.State.Active() || sameRequest(old, rec):
				return old, false, nil
			case !policy.Allows(old.State):
				return Record{}, false, &DuplicateJobError{
					ExistingJobID: old.ID, ExistingKind: old.Kind, Policy: policy, ExistingState: old.State, Key: key, KeyHash: rec.KeyHash,
				}
			}
			// A terminal holder the policy lets go: moved aside under its
			// job id in the same transaction (Insert's re-use).
			if head, err = s.archiveItems(old, &rec); err != nil {
				return Record{}, false, err
			}
			continue
		}
		n := len(head)
		for i := range links {
			if code(n+i) == "ConditionalCheckFailed" {
				return Record{}, false, &LinkRefusedError{ParentID: link[i].ID}
			}
		}
		for i := range reasons {
			switch code(i) {
			case "", "None", "ConditionalCheckFailed", "TransactionConflict":
			default:
				return Record{}, false, fmt.Errorf("nexjob: add continuation in %s: %w", s.table, err)
			}
		}
		for i := range n {
			if c := code(i); c != "" && c != "None" {
				head = []types.TransactWriteItem{put} // the key changed hands meanwhile: decide again
			}
		}
		// A conflict with another writer, or the key's holder changed:
		// try again.
	}
	return Record{}, false, ErrContention
}

// WaitAgain puts the ended continuation cur (as read: its partition key
// is used) back to waiting for the parents in waitFor, in one
// TransactWriteItems: the child becomes AwaitingContinuation with a fresh
// attempt budget as Requeue gives one (attempt 0; no TTL, deadline, run
// time, cut-offs, returns, unsent or cancelled mark; its history kept,
// reason as its last error), its Released set becomes released (the
// parents that count already; none removes it), and each of waitFor
// links it under Link's condition. The child's part is conditional on it
// being in one of from (all terminal), at attempt 0 if unrun, and still
// holding its key (not moved aside by a newer job's).
//
// A parent's refusal is a *LinkRefusedError, a child not as required a
// *NotClaimableError with its record (ErrNotFound when it is gone):
// nothing was written in either case. A resend of the applied transaction
// (its reply lost), or a read after an error of open outcome, finds the
// child's nonce: applied.
func (s *Store) WaitAgain(ctx context.Context, cur Record, from []State, unrun bool, released []string, waitFor []Record, reason string) error {
	if len(from) == 0 || len(waitFor) == 0 {
		return errors.New("nexjob: WaitAgain needs a state and a parent to wait for")
	}
	st := expression.Name(AttrState)
	inFrom := st.Equal(expression.Value(from[0]))
	for _, f := range from[1:] {
		inFrom = inFrom.Or(st.Equal(expression.Value(f)))
	}
	cond := isJob(cur.ID).And(inFrom).
		And(expression.AttributeNotExists(expression.Name(AttrKeyHash)).Or(expression.Name(AttrPK).BeginsWith(keyPrefix)))
	if unrun {
		cond = cond.And(expression.Name(AttrAttempt).Equal(expression.Value(0)))
	}
	nowMs := s.now().UnixMilli()
	upd := expression.Set(st, expression.Value(AwaitingContinuation)).
		Set(expression.Name(AttrAttempt), expression.Value(0)).
		Set(expression.Name(AttrUpdatedAt), expression.Value(nowMs))
	for _, a := range []string{AttrExpiresAt, AttrRunAt, AttrDeadline, AttrCutOffs, AttrReturns, AttrReturnOf, AttrReturnAt, AttrUndispatched, AttrCancelled, AttrLeaseUntil} {
		upd = upd.Remove(expression.Name(a))
	}
	if len(released) > 0 {
		upd = upd.Set(expression.Name(AttrReleased), expression.Value(&types.AttributeValueMemberSS{Value: released}))
	} else {
		upd = upd.Remove(expression.Name(AttrReleased))
	}
	if reason != "" {
		upd = upd.Set(expression.Name(AttrLastError), expression.Value(truncate(reason, MaxLastError))).
			Set(expression.Name(AttrListErr), expression.Value(truncate(reason, MaxListError)))
	}
	nonce := NewNonce()
	in, err := buildUpdate(cond, stampBuilder(s.withIndex(upd, AwaitingContinuation, cur.ID, nowMs), nonce))
	if err != nil {
		return err
	}
	links, err := s.linkItems(waitFor, cur.ID, NewNonce())
	if err != nil {
		return err
	}
	items := append([]types.TransactWriteItem{{Update: &types.Update{
		TableName:                           aws.String(s.table),
		Key:                                 map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: cur.PK}},
		ConditionExpression:                 in.cond,
		UpdateExpression:                    in.update,
		ExpressionAttributeNames:            in.names,
		ExpressionAttributeValues:           in.values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}}, links...)
	const tries = 4
	for range tries {
		_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if err == nil {
			return nil
		}
		var tce *types.TransactionCanceledException
		if !errors.As(err, &tce) {
			err = fmt.Errorf("nexjob: put continuation %s back to waiting in %s: %w", cur.ID, s.table, err)
			if !unknownOutcome(err) {
				return err
			}
			// Applied, its reply lost, then the resends throttled: look.
			now, found, rerr := s.getPK(ctx, cur.PK, true)
			switch {
			case rerr != nil:
				return &UnknownOutcomeError{ID: cur.ID, Err: errors.Join(err, rerr)}
			case found && now.Wrote(nonce):
				return nil
			}
			return err
		}
		reasons := tce.CancellationReasons
		if len(reasons) > 0 && aws.ToString(reasons[0].Code) == "ConditionalCheckFailed" {
			if len(reasons[0].Item) == 0 {
				return ErrNotFound
			}
			now, derr := decodeRecord(reasons[0].Item)
			switch {
			case derr != nil:
				return fmt.Errorf("nexjob: decode job record: %w", derr)
			case now.Wrote(nonce):
				return nil // our own transaction, applied, its reply lost
			case now.ExpiredAt(s.now()):
				return ErrNotFound
			}
			return &NotClaimableError{Current: now}
		}
		for i := range links {
			if 1+i < len(reasons) && aws.ToString(reasons[1+i].Code) == "ConditionalCheckFailed" {
				return &LinkRefusedError{ParentID: waitFor[i].ID}
			}
		}
		for _, r := range reasons {
			switch aws.ToString(r.Code) {
			case "", "None", "TransactionConflict":
			default:
				return fmt.Errorf("nexjob: put continuation %s back to waiting in %s: %w", cur.ID, s.table, err)
			}
		}
		// A conflict with another writer's transaction: try again.
	}
	return fmt.Errorf("nexjob: put continuation %s back to waiting in %s: %w", cur.ID, s.table, err)
}
