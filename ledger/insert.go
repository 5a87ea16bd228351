// The insert path: a new job under its key's policy (Insert), for a
// caller's transaction (Prepare), and the rare re-use of an ended key.

package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// InsertOptions are Insert's choices; nil is the zero value of each.
type InsertOptions struct {
	// ReplaceEnded overwrites the key's record when it has ended in a
	// state the policy lets the key be taken from, holds no continuations
	// and was not made by the same request: in the one conditional put
	// that writes the new job (1 write unit), where moving the ended one
	// aside under its job id takes the failed put and a 2-item transaction
	// (5). The ended job's record is gone then: Get of its id finds
	// nothing, listing no longer shows it. Recurring firings use it, so
	// that every firing costs what the first does.
	ReplaceEnded bool
	// ID, for an unkeyed job, is its id (from NewJobID) instead of a
	// fresh one: a caller that names the job elsewhere first (a debounce
	// key's pointer) writes it under that name.
	ID string
}

// Insert writes a new job unless the idempotency key says otherwise. rec
// gives the job's kind, args, state and times; Insert sets its PK, ID,
// KeyHash, Policy, CreatedAt and UpdatedAt. With an empty key the job is
// always new.
//
// With a key, one conditional PutItem on the key's record decides: it
// succeeds when the key is free (no record, or one past its retention). When
// it fails, DynamoDB returns the holder in the same response: an active
// holder is returned with created=false; a terminal holder that the policy
// protects gives a *DuplicateJobError; a terminal holder that the policy
// lets go is archived under its job id and replaced in one transaction (the
// rare path, and the only one that costs more than one write), unless
// opts.ReplaceEnded. opts may be nil.
func (s *Store) Insert(ctx context.Context, rec Record, key string, policy DuplicatePolicy, opts *InsertOptions) (Record, bool, error) {
	if !policy.Valid() {
		return Record{}, false, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(policy))
	}
	if len(rec.Args) > MaxArgsBytes {
		return Record{}, false, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(rec.Args), MaxArgsBytes)
	}
	now := s.now()
	rec = s.stamp(rec, key, policy, now)
	if key == "" && opts != nil && opts.ID != "" {
		rec.ID, rec.PK = opts.ID, jobPrefix+opts.ID
	}
	if key == "" {
		err := s.put(ctx, rec, absent())
		var held *heldError
		if errors.As(err, &held) && held.rec.ID == rec.ID {
			return held.rec, true, nil // our own put, applied but its reply lost
		}
		if err != nil {
			return Record{}, false, uncertain(rec.ID, err)
		}
		return rec, true, nil
	}
	cond := keyFree(now)
	if opts != nil && opts.ReplaceEnded {
		cond = replaceable(now, policy.ReusableStates(), rec.Request, rec.RequestAt)
	}
	const tries = 8
	for range tries {
		err := s.put(ctx, rec, cond)
		var held *heldError
		if !errors.As(err, &held) {
			if err != nil {
				return Record{}, false, uncertain(rec.ID, err)
			}
			return rec, true, nil
		}
		old := held.rec
		switch {
		case old.ID == rec.ID:
			// Our own put (or re-use), applied but its reply lost: the SDK
			// resent it and met it. Ids are random per call, so this is
			// the job this call created.
			return old, true, nil
		case old.State.Active() || sameRequest(old, rec) || lateRequest(old, rec):
			return old, false, nil
		case !policy.Allows(old.State):
			return Record{}, false, &DuplicateJobError{
				ExistingJobID: old.ID, ExistingKind: old.Kind, Policy: policy, ExistingState: old.State, Key: key, KeyHash: rec.KeyHash,
			}
		}
		err = s.replace(ctx, old, rec)
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, errLostRace) {
			return Record{}, false, uncertain(rec.ID, err)
		}
		// Someone else changed the key's record first: decide again.
	}
	return Record{}, false, ErrContention
}

// stamp sets what Insert sets on a new record: times, policy, nonce, args
// hash, index keys, and the id and partition key (the key's, if any).
func (s *Store) stamp(rec Record, key string, policy DuplicatePolicy, now time.Time) Record {
	rec.CreatedAt, rec.UpdatedAt = now.UnixMilli(), now.UnixMilli()
	rec.Policy = policy.String()
	rec.Nonce = NewNonce()
	if rec.ArgsHash == "" { // enqueue hashes the args once, to compare with a holder's
		rec.ArgsHash = ArgsHash(rec.Kind, rec.Args)
	}
	if rec.LastError != "" {
		rec.ListErr = truncate(rec.LastError, MaxListError)
	}
	rec.KeyHash = ""
	if key != "" {
		rec.KeyHash = s.HashKey(key)
	}
	rec.ID = newID(rec.KeyHash)
	if s.Indexed(rec.State) {
		rec.ListState, rec.ListAt = s.listKey(rec.State, rec.ID), rec.UpdatedAt
	}
	rec.PK = jobPrefix + rec.ID
	if key != "" {
		rec.PK = keyPrefix + rec.KeyHash
	}
	return rec
}

// Prepared is a job insert for a caller's own DynamoDB transaction.
type Prepared struct {
	// Record is the job the transaction creates, or, for a Duplicate, the
	// active job holding the key.
	Record Record
	// Duplicate: an active job holds the key; Items is empty.
	Duplicate bool
	// Items go into the caller's TransactWriteItems (one Put, or two when
	// a terminal holder is archived to free its key).
	Items []types.TransactWriteItem
}

// Prepare is Insert for a caller's own transaction: it reads the key's
// holder (one strongly consistent read) and decides with the same policy
// matrix, returning the items that create the job, each conditional on the
// key still being as read (free, or held by the same terminal job). When
// the key changes hands before the commit, the transaction is cancelled,
// the caller's writes with it; prepare again. A protected terminal holder
// gives a *DuplicateJobError; bad input as Insert.
func (s *Store) Prepare(ctx context.Context, rec Record, key string, policy DuplicatePolicy) (Prepared, error) {
	if !policy.Valid() {
		return Prepared{}, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(policy))
	}
	if len(rec.Args) > MaxArgsBytes {
		return Prepared{}, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(rec.Args), MaxArgsBytes)
	}
	now := s.now()
	rec = s.stamp(rec, key, policy, now)
	if key == "" {
		return Prepared{Record: rec, Items: []types.TransactWriteItem{s.putItem(rec, absent())}}, nil
	}
	old, held, err := s.getPK(ctx, rec.PK, true)
	if err != nil {
		return Prepared{}, err
	}
	switch {
	case !held || old.ExpiredAt(now):
		return Prepared{Record: rec, Items: []types.TransactWriteItem{s.putItem(rec, keyFree(now))}}, nil
	case old.State.Active() || sameRequest(old, rec) || lateRequest(old, rec):
		return Prepared{Record: old, Duplicate: true}, nil
	case !policy.Allows(old.State):
		return Prepared{}, &DuplicateJobError{ExistingJobID: old.ID, ExistingKind: old.Kind, Policy: policy, ExistingState: old.State, Key: key, KeyHash: rec.KeyHash}
	}
	items, err := s.archiveItems(old, &rec)
	return Prepared{Record: rec, Items: items}, err
}

// PrepareAs is Prepare of a job without a key under id (from NewJobID):
// its Put, conditional on no record of that id. Bad input as Insert.
func (s *Store) PrepareAs(rec Record, id string, policy DuplicatePolicy) (Prepared, error) {
	if !policy.Valid() {
		return Prepared{}, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(policy))
	}
	if len(rec.Args) > MaxArgsBytes {
		return Prepared{}, fmt.Errorf("%w: args are %d bytes, the limit is %d", ErrItemTooLarge, len(rec.Args), MaxArgsBytes)
	}
	if !validID(id) || strings.Contains(id, idSep) {
		return Prepared{}, fmt.Errorf("%w: %q is not an id of NewJobID", ErrBadID, truncate(id, 80))
	}
	rec = s.stamp(rec, "", policy, s.now())
	rec.ID, rec.PK = id, jobPrefix+id
	if s.Indexed(rec.State) {
		rec.ListState = s.listKey(rec.State, rec.ID)
	}
	return Prepared{Record: rec, Items: []types.TransactWriteItem{s.putItem(rec, absent())}}, nil
}

// Commit writes prepared items (Prepare, PrepareAs) in one
// TransactWriteItems, as they are: for a caller that has no DynamoDB
// client of its own (a flow). Its error is the transaction's, wrapped.
func (s *Store) Commit(ctx context.Context, items []types.TransactWriteItem) error {
	if _, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}); err != nil {
		return fmt.Errorf("nexjob: transaction in %s: %w", s.table, err)
	}
	return nil
}

// sameRequest: the key's holder was created by the request rec retries
// (Record.Request): it is rec's job, whatever its state, never replaced.
func sameRequest(old, rec Record) bool { return rec.Request != "" && old.Request == rec.Request }

// lateRequest: rec's request comes at or before the one that made old in
// the key's order (Record.RequestAt): a late retry of a request that was
// enqueued already (a recurring firing that ran and was replaced by the
// next since). It gets old back, never a new job: one firing, one run.
func lateRequest(old, rec Record) bool {
	return rec.Request != "" && rec.RequestAt > 0 && old.RequestAt >= rec.RequestAt
}

// uncertain wraps the error of a write whose outcome it does not tell.
// A failed condition tells (it is handled before), as does a refusal
// DynamoDB answered on a single attempt (a client fault that the SDK did
// not retry: validation, a missing table).
func uncertain(id string, err error) error {
	if !unknownOutcome(err) {
		return err
	}
	return &UnknownOutcomeError{ID: id, Err: err}
}

// unknownOutcome reports whether a write's error leaves open that
// DynamoDB applied it: anything but a client fault answered on a single
// attempt (a failed condition is handled before this is asked).
// OutcomeUnknown reports whether a failed DynamoDB write may have been
// applied (its reply lost: a timeout, a 5xx, retries run out), so that a
// read must settle it; a client error (a 4xx, a failed condition) was not
// applied.
func OutcomeUnknown(err error) bool { return unknownOutcome(err) }

func unknownOutcome(err error) bool {
	var api smithy.APIError
	var mae *retry.MaxAttemptsError
	return !errors.As(err, &api) || api.ErrorFault() != smithy.FaultClient || errors.As(err, &mae)
}

// heldError carries the record that made a conditional write fail.
type heldError struct {
	rec Record
	err error
}

func (e *heldError) Error() string { return e.err.Error() }
func (e *heldError) Unwrap() error { return e.err }

var errLostRace = errors.New("nexjob: lost a conditional write race")

// put writes rec under the condition cond.
func (s *Store) put(ctx context.Context, rec Record, x exprs) error {
	item := encodeRecord(&rec)
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                item,
		ConditionExpression:                 x.cond,
		ExpressionAttributeNames:            x.names,
		ExpressionAttributeValues:           x.values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.conditionError("put job", err)
}

// conditionError turns a failed condition into a *heldError carrying the
// item DynamoDB returned, and wraps any other error.
func (s *Store) conditionError(op string, err error) error {
	if err == nil {
		return nil
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		if len(ccf.Item) == 0 {
			return &heldError{err: fmt.Errorf("nexjob: %s in %s: %w", op, s.table, err)}
		}
		old, derr := decodeRecord(ccf.Item)
		if derr != nil {
			return fmt.Errorf("nexjob: decode job record: %w", derr)
		}
		return &heldError{rec: old, err: fmt.Errorf("nexjob: %s in %s: %w", op, s.table, err)}
	}
	return fmt.Errorf("nexjob: %s in %s: %w", op, s.table, err)
}

// replace archives old under its own job id and puts rec in its place, in
// one transaction conditional on old still being what we saw.
func (s *Store) replace(ctx context.Context, old, rec Record) error {
	return s.archive(ctx, old, &rec)
}

// archive moves old from its key's record to one under its own job id
// (freeing the key), putting rec in its place if given (else the archived
// copy no longer names the key: released), in one transaction
// conditional on old still being what we saw.
func (s *Store) archive(ctx context.Context, old Record, rec *Record) error {
	items, err := s.archiveItems(old, rec)
	if err != nil {
		return err
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		for _, r := range tce.CancellationReasons {
			switch aws.ToString(r.Code) {
			case "", "None", "ConditionalCheckFailed", "TransactionConflict":
				// Another writer got there first, or is writing the key's
				// record now: decide again from what it holds.
			default:
				return fmt.Errorf("nexjob: re-use key in %s: %w", s.table, err)
			}
		}
		return errLostRace
	}
	if err != nil {
		return fmt.Errorf("nexjob: re-use key in %s: %w", s.table, err)
	}
	return nil
}

// archiveItems are archive's two transaction items.
func (s *Store) archiveItems(old Record, rec *Record) ([]types.TransactWriteItem, error) {
	archived := old
	archived.PK = jobPrefix + old.ID
	if rec == nil {
		archived.KeyHash = "" // released: the job no longer owns the key
	}
	arch := s.putItem(archived, absent())
	sameCond, err := expression.NewBuilder().WithCondition(
		expression.Name(AttrID).Equal(expression.Value(old.ID)).
			And(expression.Name(AttrState).Equal(expression.Value(old.State))).
			And(expression.Name(AttrUpdatedAt).Equal(expression.Value(old.UpdatedAt))),
	).Build()
	if err != nil {
		return nil, fmt.Errorf("nexjob: build condition: %w", err)
	}
	second := types.TransactWriteItem{Delete: &types.Delete{
		TableName:                 aws.String(s.table),
		Key:                       map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: old.PK}},
		ConditionExpression:       sameCond.Condition(),
		ExpressionAttributeNames:  sameCond.Names(),
		ExpressionAttributeValues: sameCond.Values(),
	}}
	if rec != nil {
		item := encodeRecord(rec)
		second = types.TransactWriteItem{Put: &types.Put{
			TableName: aws.String(s.table), Item: item,
			ConditionExpression:       sameCond.Condition(),
			ExpressionAttributeNames:  sameCond.Names(),
			ExpressionAttributeValues: sameCond.Values(),
		}}
	}
	return []types.TransactWriteItem{arch, second}, nil
}

// putItem is a transaction's Put of rec under cond.
func (s *Store) putItem(rec Record, x exprs) types.TransactWriteItem {
	item := encodeRecord(&rec)
	return types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(s.table), Item: item,
		ConditionExpression:       x.cond,
		ExpressionAttributeNames:  x.names,
		ExpressionAttributeValues: x.values,
	}}
}
