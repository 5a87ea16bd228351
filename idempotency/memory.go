package idempotency

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// MemoryBackend keeps records in this process's memory, for unit tests of
// code that uses a Store: the same promises as the DynamoDB table's
// (Backend; package idemtest runs the behaviour suite on it), with no
// AWS call, no cost and nothing shared between processes. A process's
// records end with it; expired ones are dropped when their key is next
// used. It is safe for concurrent use.
type MemoryBackend struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]ledger.Call
}

// NewMemoryBackend returns an empty MemoryBackend reading now (nil:
// time.Now) to decide holds and expiry: give it the clock the Store's
// Options.Ledger.Now gives, so a test's advanced clock moves both.
func NewMemoryBackend(now func() time.Time) *MemoryBackend {
	if now == nil {
		now = time.Now
	}
	return &MemoryBackend{now: now, m: map[string]ledger.Call{}}
}

// BeginCall is Backend's: it takes keyHash or returns its holder.
func (b *MemoryBackend) BeginCall(_ context.Context, keyHash, payloadHash string, policy ledger.DuplicatePolicy, until time.Time, skew, retention time.Duration) (ledger.Call, bool, error) {
	c, err := ledger.NewCall(keyHash, payloadHash, policy, until, retention)
	if err != nil {
		return ledger.Call{}, false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.live(keyHash)
	switch {
	case ok && old.Held(b.now().Add(-skew)):
		return old, false, nil // held
	case ok && old.State != ledger.Processing && !policy.Allows(old.State):
		return old, false, nil // an outcome the policy protects
	case ok && old.State != ledger.Processing:
		c.Prev = old.Token
	}
	b.m[keyHash] = c
	return c, true, nil
}

// GetCall is Backend's.
func (b *MemoryBackend) GetCall(_ context.Context, keyHash string) (ledger.Call, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.live(keyHash)
	return c, ok, nil
}

// RecordCall is Backend's.
func (b *MemoryBackend) RecordCall(_ context.Context, held ledger.Call, state ledger.State, result []byte, errText string, expiresAt time.Time) (ledger.Call, error) {
	out, err := held.Outcome(state, bytes.Clone(result), errText, expiresAt)
	if err != nil {
		return ledger.Call{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.m[held.KeyHash]; !ok || cur.Token != held.Token {
		return ledger.Call{}, ledger.ErrCallTakenOver
	}
	b.m[held.KeyHash] = out
	return out, nil
}

// ReleaseCall is Backend's.
func (b *MemoryBackend) ReleaseCall(_ context.Context, held ledger.Call) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.m[held.KeyHash]; ok && cur.Token == held.Token {
		delete(b.m, held.KeyHash)
	}
	return nil
}

// live is keyHash's record unless it has expired (dropped then).
func (b *MemoryBackend) live(keyHash string) (ledger.Call, bool) {
	c, ok := b.m[keyHash]
	if ok && !b.now().Before(c.ExpiresAt) {
		delete(b.m, keyHash)
		return ledger.Call{}, false
	}
	c.Result = bytes.Clone(c.Result) // the caller's to keep: never the stored bytes
	return c, ok
}
