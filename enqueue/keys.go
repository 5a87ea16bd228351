package enqueue

import (
	"context"
	"fmt"

	"github.com/nexjob/nexjob-aws/ledger"
)

// PayloadPolicy says what an enqueue does when its key is held by an
// active job whose args differ (by their fingerprint, ledger.ArgsHash).
type PayloadPolicy int

const (
	// IgnorePayload (the default) returns the active job as a duplicate,
	// whatever its args: NexJob's behaviour.
	IgnorePayload PayloadPolicy = iota
	// RejectPayload gives a *PayloadMismatchError instead: the key is being
	// re-used for another operation, which is a bug to surface.
	RejectPayload
)

// PayloadMismatchError: with RejectPayload, the key is held by an active
// job of the same kind whose args differ. Nothing was written.
type PayloadMismatchError struct {
	ExistingJobID string
	Kind          string
	KeyHash       string
}

func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("nexjob: idempotency key (hash %s) re-used with other args: active %s job %s holds it", e.KeyHash, e.Kind, e.ExistingJobID)
}

// KeyKindError: the key is held by an active job of another kind. Keys
// name one operation, and one kind runs it, so this is reported rather
// than returned as a duplicate. Nothing was written.
type KeyKindError struct {
	ExistingJobID string
	ExistingKind  string // the holder's kind
	Kind          string // the kind enqueued
	KeyHash       string
}

func (e *KeyKindError) Error() string {
	return fmt.Sprintf("nexjob: idempotency key (hash %s) is held by active job %s of kind %q, not %q", e.KeyHash, e.ExistingJobID, e.ExistingKind, e.Kind)
}

// checkHolder reports an active holder that is not a true duplicate.
func checkHolder(rec, held ledger.Record, o *Opts) error {
	switch {
	case held.Kind != rec.Kind:
		return &KeyKindError{ExistingJobID: held.ID, ExistingKind: held.Kind, Kind: rec.Kind, KeyHash: held.KeyHash}
	case o.PayloadMismatch == RejectPayload && held.ArgsHash != "" && held.ArgsHash != rec.ArgsHash:
		return &PayloadMismatchError{ExistingJobID: held.ID, Kind: held.Kind, KeyHash: held.KeyHash}
	}
	return nil
}

// Holder returns the job that holds the idempotency key, in whatever state
// (one strongly consistent read; the key is looked up by its hash and not
// logged). A free key gives ledger.ErrNotFound.
func (c *Client) Holder(ctx context.Context, key string) (ledger.Record, error) {
	if err := checkKey(key); err != nil || key == "" {
		if err == nil {
			err = invalid("IdempotencyKey", "empty")
		}
		return ledger.Record{}, err
	}
	rec, err := c.store.GetByKey(ctx, key)
	if err != nil {
		return ledger.Record{}, c.missing(err)
	}
	return rec, nil
}

// ReleaseKey frees a key held by a terminal job, keeping the job's record
// (under its id, no longer naming the key): the next enqueue with the key
// is new whatever the policy. An active holder gives
// ledger.ErrKeyHeldByActiveJob (Cancel it first); a free key,
// ledger.ErrKeyFree. See ledger.Store.ReleaseKey.
func (c *Client) ReleaseKey(ctx context.Context, key string) (ledger.Record, error) {
	if err := checkKey(key); err != nil || key == "" {
		if err == nil {
			err = invalid("IdempotencyKey", "empty")
		}
		return ledger.Record{}, err
	}
	rec, err := c.store.ReleaseKey(ctx, key)
	if err != nil {
		return rec, c.missing(err)
	}
	c.log.InfoContext(ctx, "nexjob: key released", "job_id", rec.ID, "kind", rec.Kind)
	return rec, nil
}

// Decision is what WouldAccept found.
type Decision struct {
	// Outcome: ledger.WouldCreate, WouldDuplicate or WouldReject.
	Outcome ledger.Outcome
	// Holder is the job holding the key, if any.
	Holder *ledger.Record
}

// WouldAccept says, without writing, what an enqueue with this key and
// policy would do now: create a job, return the active holder as a
// duplicate, or be rejected (one read). It is advice: Enqueue's one
// conditional write decides, and may decide otherwise if the key changes
// hands in between.
func (c *Client) WouldAccept(ctx context.Context, key string, policy DuplicatePolicy) (Decision, error) {
	if err := checkKey(key); err != nil || key == "" {
		if err == nil {
			err = invalid("IdempotencyKey", "empty")
		}
		return Decision{}, err
	}
	if !policy.Valid() {
		return Decision{}, invalid("DuplicatePolicy", fmt.Sprintf("unknown value %d", int(policy)))
	}
	out, holder, err := c.store.Decide(ctx, key, policy)
	if err != nil {
		return Decision{}, c.missing(err)
	}
	return Decision{Outcome: out, Holder: holder}, nil
}
