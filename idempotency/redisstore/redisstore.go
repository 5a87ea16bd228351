// Package redisstore keeps idempotent calls' records in Redis or Valkey:
// an idempotency.Backend for teams whose functions already reach a Redis
// (ElastiCache, MemoryDB, Valkey), at a round trip under a millisecond and
// no DynamoDB write units.
//
//	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
//	s, err := idempotency.New(cfg, "", &idempotency.Options{Backend: redisstore.New(rdb, nil)})
//
// It keeps the promises the DynamoDB table's records keep (the behaviour
// suite, package idemtest, runs on it against a real server): a key's
// record is one hash, "<Prefix><function>#<key hash>", and each write is
// one Lua script that reads and writes it atomically under the caller's
// token, so of racing calls one holds the key; a hold, an expiry and a
// DuplicatePolicy are decided by the caller's clock as on DynamoDB
// (Options.Now; the server only removes the record when its retention,
// counted from the write by the caller's clock, is over: PEXPIRE).
//
// How it fails: a command whose reply is lost (a timeout, a dropped
// connection) may have been applied. Each write is then followed by one
// read: our own token there reads as the success it is. When the read
// fails too, the error is a *ledger.UnknownOutcomeError, and a Begin's key
// may stay held until the hold's end, as on DynamoDB. A server that loses
// writes (a failover to a replica that had not received them, no AOF)
// loses records: a repeat then runs again. Use a store with durable,
// synchronous replication (MemoryDB, or WAIT) where a lost record costs
// more than a rerun.
//
// Scoping: a function's records are under "<Prefix><function>#"; a Redis
// ACL user per function limited to that key pattern (ACL SETUSER charge
// on >… ~nexjob:idempotency:charge#* +@read +@write +@scripting) keeps
// one function from another's records, as the construct's
// GrantIdempotency does on DynamoDB. Keys are hashed before they reach
// Redis: no user string is ever a key, a pattern or a script.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Options tune a Backend. nil takes every default.
type Options struct {
	// Prefix begins every record's Redis key. Defaults to DefaultPrefix.
	Prefix string
	// Now is the clock holds and expiry are decided by: give it the
	// Store's (idempotency.Options.Ledger.Now) in tests. Defaults to
	// time.Now.
	Now func() time.Time
}

// DefaultPrefix begins every record's key unless Options.Prefix is set.
const DefaultPrefix = "nexjob:idempotency:"

// Backend is an idempotency.Backend on a Redis or Valkey server. It is
// safe for concurrent use.
type Backend struct {
	rdb    redis.UniversalClient
	prefix string
	now    func() time.Time
}

// New returns a Backend on rdb (a *redis.Client, a cluster or a ring).
// opts may be nil.
func New(rdb redis.UniversalClient, opts *Options) *Backend {
	b := &Backend{rdb: rdb, prefix: DefaultPrefix, now: time.Now}
	if opts != nil && opts.Prefix != "" {
		b.prefix = opts.Prefix
	}
	if opts != nil && opts.Now != nil {
		b.now = opts.Now
	}
	return b
}

// Key is the Redis key of a call's record.
func (b *Backend) Key(keyHash string) string { return b.prefix + keyHash }

// The record's fields.
const (
	fState   = "state"
	fUntil   = "until" // unix ms
	fToken   = "token"
	fExpires = "expires" // unix s
	fPayload = "payload"
	fResult  = "result"
	fError   = "error"
	fPolicy  = "policy"
	fPrev    = "prev"
)

// begin takes the key (1) or returns its holder's fields (0, …): free when
// absent, expired by the caller's clock, or a hold whose until is at or
// before now less the skew; a recorded outcome the policy lets go is
// replaced, its token kept as prev. Our own token there is a resend of our
// applied write.
var begin = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'until', 'token', 'expires', 'payload', 'result', 'error', 'policy', 'prev')
local state, untl, tok, exp = r[1], r[2], r[3], r[4]
if tok == ARGV[1] then return {1} end
local free = (not state) or (exp and tonumber(exp) <= tonumber(ARGV[6])) or (state == 'Processing' and untl and tonumber(untl) < tonumber(ARGV[7]))
local prev = false
if not free then
  if state ~= 'Processing' and ((state == 'Succeeded' and ARGV[8] == '1') or (state == 'Failed' and ARGV[9] == '1')) then
    prev = tok
  else
    return {0, state or '', untl or '', tok or '', exp or '', r[5] or '', r[6] or '', r[7] or '', r[8] or '', r[9] or ''}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'Processing', 'until', ARGV[4], 'token', ARGV[1], 'expires', ARGV[5], 'policy', ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'payload', ARGV[2]) end
if prev then redis.call('HSET', KEYS[1], 'prev', prev) end
redis.call('PEXPIRE', KEYS[1], ARGV[10])
return {1}
`)

// record writes a held call's outcome under its token (1); a resend of
// our own (its done token there, as token or prev) is 1 too; else 0.
var record = redis.NewScript(`
local tok = redis.call('HGET', KEYS[1], 'token')
if tok == ARGV[1] then
  redis.call('HSET', KEYS[1], 'state', ARGV[3], 'token', ARGV[2], 'expires', ARGV[6])
  redis.call('HDEL', KEYS[1], 'until')
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[4]) end
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[5]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  return 1
end
if tok and (tok == ARGV[2] or redis.call('HGET', KEYS[1], 'prev') == ARGV[2]) then return 1 end
return 0
`)

// release deletes the record while it is the caller's hold.
var release = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`)

// BeginCall is idempotency.Backend's: one script (EVALSHA).
func (b *Backend) BeginCall(ctx context.Context, keyHash, payloadHash string, policy ledger.DuplicatePolicy, until time.Time, skew, retention time.Duration) (ledger.Call, bool, error) {
	c, err := ledger.NewCall(keyHash, payloadHash, policy, until, retention)
	if err != nil {
		return ledger.Call{}, false, err
	}
	now := b.now()
	got, err := begin.Run(ctx, b.rdb, []string{b.Key(keyHash)},
		c.Token, payloadHash, policy.String(), c.Until.UnixMilli(), c.ExpiresAt.Unix(),
		now.Unix(), now.Add(-skew).UnixMilli(), flag(policy.Allows(ledger.Succeeded)), flag(policy.Allows(ledger.Failed)), ttl(c.ExpiresAt, now)).Slice()
	if err != nil {
		// Applied with its reply lost? Our token there says so.
		cur, ok, rerr := b.GetCall(ctx, keyHash)
		if rerr == nil && ok {
			return cur, cur.Token == c.Token, nil
		}
		return ledger.Call{}, false, &ledger.UnknownOutcomeError{ID: b.Key(keyHash), Err: fmt.Errorf("nexjob: begin call in redis: %w", err), Nonce: c.Token}
	}
	if n, _ := got[0].(int64); n == 1 {
		return c, true, nil
	}
	f := map[string]string{}
	for i, name := range []string{fState, fUntil, fToken, fExpires, fPayload, fResult, fError, fPolicy, fPrev} {
		if i+1 < len(got) {
			f[name], _ = got[i+1].(string)
		}
	}
	old, err := decode(keyHash, f)
	return old, false, err
}

// GetCall is idempotency.Backend's: one HGETALL.
func (b *Backend) GetCall(ctx context.Context, keyHash string) (ledger.Call, bool, error) {
	f, err := b.rdb.HGetAll(ctx, b.Key(keyHash)).Result()
	if err != nil {
		return ledger.Call{}, false, fmt.Errorf("nexjob: read call in redis: %w", err)
	}
	if len(f) == 0 {
		return ledger.Call{}, false, nil
	}
	c, err := decode(keyHash, f)
	if err != nil {
		return ledger.Call{}, false, err
	}
	if !c.ExpiresAt.IsZero() && !b.now().Before(c.ExpiresAt) {
		return ledger.Call{}, false, nil
	}
	return c, true, nil
}

// RecordCall is idempotency.Backend's: one script.
func (b *Backend) RecordCall(ctx context.Context, held ledger.Call, state ledger.State, result []byte, errText string, expiresAt time.Time) (ledger.Call, error) {
	out, err := held.Outcome(state, result, errText, expiresAt)
	if err != nil {
		return ledger.Call{}, err
	}
	done := out.Token
	n, err := record.Run(ctx, b.rdb, []string{b.Key(held.KeyHash)}, held.Token, done, string(state), result, errText, out.ExpiresAt.Unix(), ttl(out.ExpiresAt, b.now())).Int64()
	switch {
	case err == nil && n == 1:
		return out, nil
	case err == nil:
		return ledger.Call{}, ledger.ErrCallTakenOver
	}
	if cur, ok, rerr := b.GetCall(ctx, held.KeyHash); rerr == nil {
		switch {
		case ok && (cur.Token == done || cur.Prev == done):
			return out, nil
		case !ok || cur.Token != held.Token:
			return ledger.Call{}, ledger.ErrCallTakenOver
		}
	}
	return ledger.Call{}, &ledger.UnknownOutcomeError{ID: b.Key(held.KeyHash), Err: fmt.Errorf("nexjob: record call in redis: %w", err), Nonce: done}
}

// ReleaseCall is idempotency.Backend's: one script.
func (b *Backend) ReleaseCall(ctx context.Context, held ledger.Call) error {
	err := release.Run(ctx, b.rdb, []string{b.Key(held.KeyHash)}, held.Token).Err()
	if err == nil {
		return nil
	}
	if cur, ok, rerr := b.GetCall(ctx, held.KeyHash); rerr == nil && (!ok || cur.Token != held.Token) {
		return nil // applied, its reply lost (or the key no longer ours)
	}
	return fmt.Errorf("nexjob: release call in redis: %w", err)
}

// decode reads a record's fields.
func decode(keyHash string, f map[string]string) (ledger.Call, error) {
	c := ledger.Call{KeyHash: keyHash, State: ledger.State(f[fState]), PayloadHash: f[fPayload], Error: f[fError], Token: f[fToken], Prev: f[fPrev]}
	if r := f[fResult]; r != "" {
		c.Result = []byte(r)
	}
	if ms, err := strconv.ParseInt(f[fUntil], 10, 64); err == nil {
		c.Until = ledger.Millis(ms)
	}
	if s, err := strconv.ParseInt(f[fExpires], 10, 64); err == nil {
		c.ExpiresAt = time.Unix(s, 0)
	}
	if p := f[fPolicy]; p != "" {
		pol, err := ledger.ParsePolicy(p)
		if err != nil {
			return ledger.Call{}, errors.Join(fmt.Errorf("nexjob: call record %s", keyHash), err)
		}
		c.Policy = pol
	}
	return c, nil
}

// ttl is how long the server keeps a record expiring at exp by the
// caller's clock, now: a duration (PEXPIRE), so that the server's clock,
// or a test's fixed one, never removes a record early. At least 1 ms.
func ttl(exp, now time.Time) int64 { return max(exp.Sub(now).Milliseconds(), 1) }

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
