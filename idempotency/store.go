package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/internal/ssmparam"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// Options tune a Store. The zero value (or nil) takes every default.
type Options struct {
	// Function scopes the keys: one key used by two functions is two
	// records, each function's under its own partition key prefix
	// "i#<function>#", which the construct's GrantIdempotency(fn, name)
	// limits the function's grant to (IAM's dynamodb:LeadingKeys): no
	// function reads or writes another's records. It is the metrics'
	// Function dimension. Defaults to the name the deployment gives the
	// function (NEXJOB_IDEMPOTENCY_FUNCTION, set by GrantIdempotency),
	// else AWS_LAMBDA_FUNCTION_NAME, else "default" outside Lambda. When
	// the deployment names the function, any other name is refused (a
	// *FunctionError): its records would be another function's. Must be
	// kinds' rule (letters, digits, . _ - : /).
	Function string
	// Policy decides what a repeat does once the first call's outcome is
	// recorded (see the package doc). Defaults to RejectAlways: a recorded
	// result is replayed for the record's retention.
	Policy *ledger.DuplicatePolicy
	// Retention keeps a recorded outcome (its TTL): repeats within it are
	// answered from it. Defaults to DefaultRetention.
	Retention time.Duration
	// RecordErrors records a function's error as the key's outcome
	// (Failed) instead of releasing the key. Defaults to false.
	RecordErrors bool
	// Hold is how long a first call holds its key when its context has
	// no deadline (a Lambda invocation's context has one: the hold ends
	// with it). Defaults to DefaultHold.
	Hold time.Duration
	// MaxClockSkew is how far apart the clocks of two processes using one
	// key may be: a hold is taken over only this long after its deadline
	// by the taker's clock, so a process whose clock is ahead by less
	// never takes a key still held. Clocks further apart break the hold
	// (both calls run). Lambda's clocks are NTP-synchronised to within
	// milliseconds. Defaults to DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// Wait makes a repeat that meets the first call in progress wait for
	// its outcome (reading the record every 50 ms, backing off to 1 s; one
	// read unit each), until its own context ends, instead of returning an
	// *InProgressError at once. Defaults to false.
	Wait bool
	// MaxResultBytes bounds a recorded result's JSON. Defaults to
	// DefaultMaxResultBytes; at most ledger.MaxCallResultBytes.
	MaxResultBytes int
	// CacheSize keeps up to this many recorded results in this process
	// (an LRU): a repeat found there costs no request. Defaults to 0 (no
	// cache). Another process's release or a record's removal by hand is
	// not seen by a cache; its entries end with the record's retention.
	CacheSize int
	// Disabled turns the utility off: every call runs its function and
	// nothing is read or written. NEXJOB_IDEMPOTENCY_DISABLED=true does
	// the same. For unit tests of the function itself.
	Disabled bool
	// Ledger passes options to the ledger: the key secret, a clock for
	// tests. Its KeySecret defaults to the deployment's, read as every
	// role of it reads it (package settings): the SSM SecureString
	// parameter NEXJOB_KEY_SECRET_PARAMETER names (the construct's
	// Settings(settings.Idempotent) sets it; New makes one GetParameter),
	// or NEXJOB_KEY_SECRET itself; neither set: none, and keys are hashed
	// with plain SHA-256. Not read when the Store is disabled.
	Ledger ledger.Options
	// DynamoDB is the client. Defaults to one from the config.
	DynamoDB ledger.DynamoDB
	// Backend keeps the records. Defaults to the DynamoDB table New is
	// given (the ledger's call records, *ledger.Store); MemoryBackend
	// keeps them in this process (unit tests), and package redisstore in
	// a Redis or Valkey server. With a Backend, New's table and DynamoDB
	// are not used (table may be ""); the key secret still is.
	Backend Backend
	// Logger receives one record per outcome (the key's hash, never the
	// key). Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics records CallRun, CallReplayed, CallInProgress, CallMismatch
	// and CallWithoutKey by Function. Defaults to none.
	Metrics *metrics.Recorder
}

// Defaults.
const (
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultHold           = time.Minute
	DefaultMaxClockSkew   = time.Second
	DefaultMaxResultBytes = 64 << 10
	// EnvDisabled turns every Store off when "true".
	EnvDisabled = "NEXJOB_IDEMPOTENCY_DISABLED"
	// EnvFunction is the function's name as its deployment gives it (the
	// construct's GrantIdempotency sets it with the grant): Options.Function
	// defaults to it and may not differ from it. (settings'
	// EnvIdempotencyFunction: the same name.)
	EnvFunction = "NEXJOB_IDEMPOTENCY_FUNCTION"
)

// recordTimeout bounds the writes after the function ran (its result, a
// release): they run on a context detached from the caller's, so a caller
// whose deadline came as the function returned still gets them written.
const recordTimeout = 5 * time.Second

// Backend keeps idempotent calls' records: a key's hold, then its
// recorded outcome, each write conditional on the caller's token. The
// DynamoDB table's (*ledger.Store) is the default; MemoryBackend and
// package redisstore's keep the same promises, checked by one behaviour
// suite (package idemtest) that any Backend can run:
//
//   - BeginCall takes keyHash when it has no record, an expired one
//     (ExpiresAt not after the Backend's clock), or a Processing hold
//     whose Until is more than skew behind that clock (in whole
//     milliseconds, Until rounded up by ledger.NewCall and the clock
//     down: never early, at most 2 ms late); or replaces a
//     recorded outcome policy.Allows (keeping its token as Prev). The new
//     record is Processing until until under a fresh token, expiring at
//     until+retention. Otherwise it returns the record that holds the key
//     and began=false, writing nothing.
//   - RecordCall writes held's outcome only while the record's token is
//     held.Token; a resend of its own applied write reads as done (the
//     outcome's token, kept as Token or Prev); anything else is
//     ledger.ErrCallTakenOver and writes nothing.
//   - ReleaseCall deletes the record only while its token is held.Token;
//     a key no longer held's is done too (nil).
//   - GetCall reads the record; ok=false when there is none or it has
//     expired.
//
// An error whose outcome a Backend cannot settle by reading is returned
// (ledger.UnknownOutcomeError, or the client's): the Store then reports
// the call unrecorded and never runs a function whose hold it did not
// see written.
type Backend interface {
	BeginCall(ctx context.Context, keyHash, payloadHash string, policy ledger.DuplicatePolicy, until time.Time, skew, retention time.Duration) (c ledger.Call, began bool, err error)
	GetCall(ctx context.Context, keyHash string) (c ledger.Call, ok bool, err error)
	RecordCall(ctx context.Context, held ledger.Call, state ledger.State, result []byte, errText string, expiresAt time.Time) (ledger.Call, error)
	ReleaseCall(ctx context.Context, held ledger.Call) error
}

var _ Backend = (*ledger.Store)(nil)

// Layout is a Backend whose records are named and hashed its own way, to
// be shared with another library's (package powertools: Powertools'
// DynamoDB layout, shared with Python and TypeScript functions). The
// Store then takes its key hashes and payload hashes from the Layout, in
// place of its own (HMAC under the deployment's key secret, scoped to
// Options.Function), and New refuses options the layout cannot keep.
type Layout interface {
	// CallKey is the record key (a Backend's keyHash) for a key's JSON:
	// Do's key as a JSON string, an event's KeyPath value as its JSON.
	CallKey(keyJSON []byte) (string, error)
	// PayloadHash is the validation hash of a payload's JSON.
	PayloadHash(payloadJSON []byte) (string, error)
	// Supports says why a policy or RecordErrors cannot be kept (nil:
	// they can).
	Supports(policy ledger.DuplicatePolicy, recordErrors bool) error
}

// Store keeps idempotent calls' records in the nexjob table (or its
// Options.Backend). It is safe for concurrent use.
type Store struct {
	ledger    Backend
	layout    Layout // nil: the Store's own hashes
	secret    []byte
	function  string
	policy    ledger.DuplicatePolicy
	retention time.Duration
	recordErr bool
	hold      time.Duration
	skew      time.Duration
	wait      bool
	maxResult int
	cache     *lru.Cache[string, ledger.Call]
	disabled  bool
	now       func() time.Time
	log       *slog.Logger
	metrics   *metrics.Recorder
}

// The deployment's variables New reads (package settings' names).
const (
	envTable              = "NEXJOB_TABLE"
	envKeySecretParameter = "NEXJOB_KEY_SECRET_PARAMETER"
	envKeySecret          = "NEXJOB_KEY_SECRET"
)

// keySecretTimeout bounds New's read of the key secret's parameter.
const keySecretTimeout = 10 * time.Second

// New returns a Store on the table (the deployment's nexjob table; ""
// reads NEXJOB_TABLE, as settings.Load does). opts may be nil: the
// defaults read the deployment's key secret (Options.Ledger). It fails
// with no table, both key secret variables set, or the parameter not
// read (the SSM error wrapped, naming the variable, never the value).
func New(cfg aws.Config, table string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if table == "" && o.Backend == nil {
		if table = os.Getenv(envTable); table == "" {
			return nil, fmt.Errorf("nexjob: idempotency needs the table: give it, or set %s", envTable)
		}
	}
	disabled, _ := strconv.ParseBool(os.Getenv(EnvDisabled))
	disabled = disabled || o.Disabled
	if o.Ledger.KeySecret == nil && !disabled {
		secret, err := keySecret(cfg)
		if err != nil {
			return nil, err
		}
		o.Ledger.KeySecret = secret
	}
	deployed := os.Getenv(EnvFunction)
	switch {
	case deployed != "" && !kinds.Valid(deployed):
		return nil, &FunctionError{Function: deployed, Reason: "(" + EnvFunction + ") must be " + kinds.Rule}
	case deployed != "" && o.Function != "" && o.Function != deployed:
		return nil, &FunctionError{Function: o.Function, Deployed: deployed, Reason: "is not the name its deployment gives this function (" + EnvFunction + "=" + deployed + "): its records would be another function's"}
	case o.Function == "":
		o.Function = deployed
	}
	if o.Function == "" {
		o.Function = os.Getenv("AWS_LAMBDA_FUNCTION_NAME")
	}
	if o.Function == "" {
		o.Function = "default"
	}
	if !kinds.Valid(o.Function) {
		return nil, &FunctionError{Function: o.Function, Reason: "must be " + kinds.Rule}
	}
	policy := ledger.RejectAlways
	if o.Policy != nil {
		if !o.Policy.Valid() {
			return nil, fmt.Errorf("nexjob: unknown DuplicatePolicy %d", int(*o.Policy))
		}
		policy = *o.Policy
	}
	if o.Retention < 0 || o.Hold < 0 || o.MaxResultBytes < 0 || o.CacheSize < 0 || o.MaxClockSkew < 0 {
		return nil, errors.New("nexjob: idempotency options must not be negative")
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.Hold == 0 {
		o.Hold = DefaultHold
	}
	if o.MaxClockSkew == 0 {
		o.MaxClockSkew = DefaultMaxClockSkew
	}
	if o.MaxResultBytes == 0 {
		o.MaxResultBytes = DefaultMaxResultBytes
	}
	if o.MaxResultBytes > ledger.MaxCallResultBytes {
		return nil, fmt.Errorf("nexjob: MaxResultBytes %d is over the item's room, %d", o.MaxResultBytes, ledger.MaxCallResultBytes)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Backend == nil {
		if o.DynamoDB == nil {
			o.DynamoDB = dynamodb.NewFromConfig(cfg)
		}
		st, err := ledger.New(o.DynamoDB, table, &o.Ledger)
		if err != nil {
			return nil, err
		}
		o.Backend = st
	}
	s := &Store{
		ledger: o.Backend, secret: append([]byte(nil), o.Ledger.KeySecret...), function: o.Function, policy: policy, retention: o.Retention, recordErr: o.RecordErrors,
		hold: o.Hold, skew: o.MaxClockSkew, wait: o.Wait, maxResult: o.MaxResultBytes, log: o.Logger, metrics: o.Metrics, now: time.Now,
	}
	if o.Ledger.Now != nil {
		s.now = o.Ledger.Now
	}
	s.disabled = disabled
	if l, ok := o.Backend.(Layout); ok {
		if err := l.Supports(policy, o.RecordErrors); err != nil {
			return nil, &LayoutError{Err: err}
		}
		s.layout = l
	}
	if o.CacheSize > 0 {
		var err error
		if s.cache, err = lru.New[string, ledger.Call](o.CacheSize); err != nil {
			return nil, fmt.Errorf("nexjob: idempotency cache: %w", err)
		}
	}
	return s, nil
}

// keySecret is the deployment's key secret, as settings.Load reads it
// for the idempotent role (nil: none).
func keySecret(cfg aws.Config) ([]byte, error) {
	switch p, raw := os.Getenv(envKeySecretParameter), os.Getenv(envKeySecret); {
	case p != "" && raw != "":
		return nil, fmt.Errorf("nexjob: %s is invalid: set it or %s, not both", envKeySecret, envKeySecretParameter)
	case p != "":
		ctx, cancel := context.WithTimeout(context.Background(), keySecretTimeout)
		defer cancel()
		v, err := ssmparam.Get(ctx, cfg, p)
		if err != nil {
			return nil, fmt.Errorf("nexjob: read the key secret from SSM parameter %s (%s): %w", p, envKeySecretParameter, err)
		}
		return []byte(v), nil
	case raw != "":
		return []byte(raw), nil
	}
	return nil, nil
}

// KeyHash is what the Store writes and logs for key: the Store's function
// and the ledger's hash of the key scoped to it, "<function>#<hash>"
// (ledger.CallKey; the record's partition key is "i#" and it).
//
// With a Layout (Options.Backend), it is the Layout's key for the key as a
// JSON string.
func (s *Store) KeyHash(key string) string {
	if s.layout != nil {
		b, _ := json.Marshal(key) // a string: no error
		kh, _ := s.layout.CallKey(b)
		return kh
	}
	return s.callKey(ledger.HashKeyWith(s.secret, s.function+"\x00"+key))
}

// callKey scopes a hash to the Store's function (ledger.CallKey).
func (s *Store) callKey(hash string) string { return ledger.CallKey(s.function, hash) }

// payloadHash fingerprints a payload's JSON under the same hash (or the
// Layout's).
func (s *Store) payloadHash(payload []byte) (string, error) {
	if s.layout != nil {
		return s.layout.PayloadHash(payload)
	}
	return ledger.HashKeyWith(s.secret, "payload\x00"+string(payload)), nil
}

// until is the end of a hold taken now under ctx.
func (s *Store) until(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return s.now().Add(s.hold)
}

// cached returns a recorded result kept in this process.
func (s *Store) cached(keyHash string) (ledger.Call, bool) {
	if s.cache == nil {
		return ledger.Call{}, false
	}
	c, ok := s.cache.Get(keyHash)
	if !ok {
		return ledger.Call{}, false
	}
	if !s.now().Before(c.ExpiresAt) {
		s.cache.Remove(keyHash)
		return ledger.Call{}, false
	}
	return c, true
}

// keep caches a recorded success that the policy replays.
func (s *Store) keep(c ledger.Call) {
	if s.cache != nil && c.State == ledger.Succeeded && !s.policy.Allows(ledger.Succeeded) {
		s.cache.Add(c.KeyHash, c)
	}
}

func (s *Store) count(metric, keyHash string) { s.metrics.Call(metric, s.function, keyHash) }
