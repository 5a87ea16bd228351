package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// ArgsHash is the fingerprint Insert stores with every job: the first 16
// bytes of SHA-256 over the kind and the encoded args, base64url (22
// characters). Equal args of the same kind give equal hashes; it reveals
// nothing of the args but their equality.
func ArgsHash(kind, args string) string {
	h := sha256.New()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(args))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// Outcome is what an enqueue with a key would do (Decide).
type Outcome int

// The outcomes.
const (
	WouldCreate    Outcome = iota // the key is free, or its terminal holder may be replaced
	WouldDuplicate                // an active job holds the key: it would be returned
	WouldReject                   // the policy protects the terminal holder: DuplicateJobError
)

func (o Outcome) String() string {
	switch o {
	case WouldCreate:
		return "create"
	case WouldDuplicate:
		return "duplicate"
	}
	return "reject"
}

// Decide reads the key's holder (one strongly consistent read) and says
// what Insert with this policy would do now, writing nothing. holder is
// the record that decides (nil when the key is free). Another writer may
// change the answer the next moment; Insert's conditional write is the
// one that counts.
func (s *Store) Decide(ctx context.Context, key string, policy DuplicatePolicy) (Outcome, *Record, error) {
	if !policy.Valid() {
		return 0, nil, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(policy))
	}
	rec, err := s.GetByKey(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		return WouldCreate, nil, nil
	case err != nil:
		return 0, nil, err
	case rec.State.Active():
		return WouldDuplicate, &rec, nil
	case !policy.Allows(rec.State):
		return WouldReject, &rec, nil
	}
	return WouldCreate, &rec, nil
}

// ErrKeyFree: Release of a key no live job holds.
var ErrKeyFree = errors.New("nexjob: no job holds this key")

// ErrKeyHeldByActiveJob: Release of a key whose job is still active;
// cancel or finish the job first.
var ErrKeyHeldByActiveJob = errors.New("nexjob: the key's job is still active; only a terminal job's key can be released")

// ReleaseKey frees an idempotency key held by a terminal job, keeping
// the job's record (under its job id, so Get, List and Requeue still find
// it; Requeue then makes it active without its key): one transaction
// conditional on the holder being unchanged. The next enqueue with the key
// is new whatever the policy. A key no live job holds gives ErrKeyFree; an
// active holder, ErrKeyHeldByActiveJob; nothing is written then.
//
// A lost reply is safe: the resent transaction fails its conditions, and
// ReleaseKey then finds the key no longer held by the job and the job
// archived under its id, which it reports as done.
func (s *Store) ReleaseKey(ctx context.Context, key string) (Record, error) {
	for range 4 {
		rec, err := s.GetByKey(ctx, key)
		if errors.Is(err, ErrNotFound) {
			return Record{}, ErrKeyFree
		}
		if err != nil {
			return Record{}, err
		}
		if rec.State.Active() {
			return rec, ErrKeyHeldByActiveJob
		}
		err = s.archive(ctx, rec, nil)
		if err == nil {
			rec.PK, rec.KeyHash = jobPrefix+rec.ID, ""
			return rec, nil
		}
		if !errors.Is(err, errLostRace) {
			return Record{}, err
		}
		// Our own transaction applied and resent, or another writer moved
		// first: released if the key no longer holds the job and the job
		// sits under its own id; otherwise decide again.
		if cur, ok, gerr := s.getPK(ctx, rec.PK, true); gerr == nil && (!ok || cur.ID != rec.ID) {
			if moved, ok, gerr := s.getPK(ctx, jobPrefix+rec.ID, true); gerr == nil && ok && moved.ID == rec.ID {
				return moved, nil
			}
		}
	}
	return Record{}, ErrContention
}
