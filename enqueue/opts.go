package enqueue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Opts are the per-job options of Enqueue. A nil *Opts means all defaults.
type Opts struct {
	// IdempotencyKey deduplicates enqueues of the same logical operation.
	// Empty means no key: every call creates a job. A key of only white
	// space, longer than ledger.MaxKeyLen bytes or not UTF-8 is refused.
	IdempotencyKey string
	// RequestID names this enqueue request, for a caller that may retry it
	// after the job ran (a scheduler delivering at least once, a webhook
	// redelivered): with an IdempotencyKey, a retry that finds the key held
	// by the job this same request created gets that job back as a
	// duplicate, whatever its state and the DuplicatePolicy, instead of a
	// new run. Stored hashed, as keys are; 1 to 512 bytes. Defaults to
	// none. recurring.Fire sets it to the firing.
	RequestID string
	// RequestTime orders the key's requests, for requests that come in
	// order and may be retried late (a recurring schedule's firings, each
	// at its scheduled time): a request not after the one that made the
	// key's record is a late retry and gets that job back (Duplicate),
	// never a new job, even after the record was replaced. Needs
	// RequestID. Defaults to none (zero).
	RequestTime time.Time
	// DuplicatePolicy decides what a key held by a terminal job does.
	// Defaults to AllowAfterFailed.
	DuplicatePolicy DuplicatePolicy
	// ReplaceEnded: when the policy lets the key go, the ended job's
	// record is overwritten by the new one in the same conditional write
	// (1 write unit) instead of being moved aside under its job id (a
	// failed write and a 2-item transaction, 5 units). The ended job can
	// no longer be read by its id. For keys re-used often whose old runs
	// nobody reads back (recurring.Fire sets it). Defaults to false.
	ReplaceEnded bool
	// Delay schedules the job this far ahead. Defaults to 0 (run now).
	Delay time.Duration
	// RunAt schedules the job at this time; exclusive with Delay. A time
	// in the past within ScheduleTolerance means now; further back is
	// refused. Defaults to now.
	RunAt time.Time
	// Deadline: a job not started by then becomes Expired and never runs.
	// A job that started (a step of its run recorded: a durable job that
	// sleeps or waits gives its attempt back) runs on past it.
	// Must be after the run time. Defaults to none.
	Deadline time.Time
	// MaxAttempts is the attempt budget. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// PayloadMismatch: what a key held by an active job with other args
	// does. Defaults to IgnorePayload (a duplicate, as in NexJob).
	PayloadMismatch PayloadPolicy
	// NoKindDefaults takes these Opts as they are: the args type's
	// JobDefaults (KindDefaults) fill none of their zero fields, so a zero
	// field means the package's default (AllowAfterFailed over a kind
	// whose default is RejectAlways, say). Defaults to false.
	NoKindDefaults bool
	// RateLimit refuses the enqueue, with a *RateLimitedError and no job
	// written, when its key already had Limit enqueues in the last
	// Period (see RateLimit). Defaults to none.
	RateLimit *RateLimit
	// Queue sends the job to this named queue (one of
	// ClientOptions.Queues) instead of the job queue, and every later
	// message of it too. A name the client does not know is an
	// *InputError (ErrUnknownQueue), nothing written. Defaults to the
	// kind's Defaults.Queue, else the job queue.
	Queue string
	// Debounce folds a burst of enqueues with one key into one run (see
	// Debounce). Exclusive with IdempotencyKey, Delay and RunAt. Enqueue
	// and EnqueueMany apply it; EnqueueTx, ContinueWith and
	// ContinueWhenAll refuse it (an *InputError). Defaults to none.
	Debounce *Debounce

	keyByArgs bool // the kind's Defaults.KeyByArgs applies: newRecord keys the job by its args
}

// entry is an entry point: its name and whether it applies
// Opts.Debounce. Every entry point applies Opts.RateLimit (admit); one
// that does not debounce refuses Debounce in newRecord, so no option is
// ever validated and then ignored.
type entry struct {
	name     string
	debounce bool
	replace  bool // ReplaceEnded applies: one conditional put overwrites the key's ended record
	blobArgs bool // args over ledger.MaxInlineArgsBytes go to the blob bucket (decide), when there is one
}

var (
	viaEnqueue     = entry{"Enqueue", true, true, true}
	viaEnqueueMany = entry{"EnqueueMany", true, true, true}
	viaEnqueueTx   = entry{"EnqueueTx", false, false, false}      // a transaction commits a new job; a fold is no part of it, and it moves an ended holder aside
	viaContinue    = entry{"a continuation", false, false, false} // it runs when its parents are done, not after a quiet period
	viaChild       = entry{"EnqueueChild", false, false, true}    // a child's key is its caller's and its name's
)

// newRecord validates the input for the entry point via and builds the
// record to insert.
//
// Keys beginning argsKeyPrefix or childKeyPrefix are the package's own.
func (c *Client) newRecord(args JobArgs, o *Opts, via entry) (ledger.Record, error) {
	if args == nil || isNilPointer(args) {
		return ledger.Record{}, invalid("args", "nil")
	}
	kind := args.Kind()
	if !kinds.Valid(kind) {
		return ledger.Record{}, invalid("args", "Kind() must be "+kinds.Rule)
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return ledger.Record{}, &InputError{Field: "args", Reason: "cannot be encoded as JSON: " + redact.JSON(err), Err: err}
	}
	if string(raw) == "null" {
		return ledger.Record{}, invalid("args", "nil")
	}
	if limit := c.argsLimit(o, via); len(raw) > limit {
		return ledger.Record{}, invalid("args", fmt.Sprintf("%d bytes encoded, the limit is %d", len(raw), limit))
	}
	if o.keyByArgs {
		sum := sha256.Sum256([]byte(kind + "\x00" + string(raw)))
		o.IdempotencyKey = argsKeyPrefix + kind + ":" + hex.EncodeToString(sum[:16])
	} else if strings.HasPrefix(o.IdempotencyKey, argsKeyPrefix) {
		// Taken first by other args, a KeyByArgs key would make the job of
		// those args a duplicate of a job it is not.
		return ledger.Record{}, invalid("IdempotencyKey", `keys beginning "`+argsKeyPrefix+`" are the package's own (a kind's KeyByArgs)`)
	}
	if err := checkKey(o.IdempotencyKey); err != nil {
		return ledger.Record{}, err
	}
	if via != viaChild && strings.HasPrefix(o.IdempotencyKey, childKeyPrefix) {
		// Taken first, a child's key would make the caller await a job of
		// someone else's making, which never tells it its end.
		return ledger.Record{}, invalid("IdempotencyKey", `keys beginning "`+childKeyPrefix+`" are the package's own (a child job's)`)
	}
	if o.IdempotencyKey == "" && o.DuplicatePolicy != AllowAfterFailed {
		// A policy decides between jobs of one key: with none it would be
		// ignored, and two Welcome jobs run under RejectAlways.
		return ledger.Record{}, invalid("DuplicatePolicy", o.DuplicatePolicy.String()+" needs an idempotency key (Opts.IdempotencyKey, or the kind's Defaults.IdempotencyKey or KeyByArgs)")
	}
	if len(o.RequestID) > 512 {
		return ledger.Record{}, invalid("RequestID", "longer than 512 bytes")
	}
	if err := o.RateLimit.check(); err != nil {
		return ledger.Record{}, err
	}
	if err := o.Debounce.check(o); err != nil {
		return ledger.Record{}, err
	}
	if o.Debounce != nil && !via.debounce {
		return ledger.Record{}, invalid("Debounce", via.name+" does not debounce (Enqueue and EnqueueMany do)")
	}
	if o.ReplaceEnded && !via.replace {
		return ledger.Record{}, invalid("ReplaceEnded", via.name+" moves the key's ended job aside in its transaction; only Enqueue and EnqueueMany overwrite it")
	}
	if o.RequestID != "" && o.IdempotencyKey == "" {
		return ledger.Record{}, invalid("RequestID", "needs an IdempotencyKey (the request is recognised on the key's record)")
	}
	if _, err := c.QueueURL(o.Queue); err != nil {
		return ledger.Record{}, &InputError{Field: "Queue", Reason: fmt.Sprintf("no queue named %q among ClientOptions.Queues", o.Queue), Err: err}
	}
	if !o.DuplicatePolicy.Valid() {
		return ledger.Record{}, invalid("DuplicatePolicy", fmt.Sprintf("unknown value %d", int(o.DuplicatePolicy)))
	}
	if o.PayloadMismatch != IgnorePayload && o.PayloadMismatch != RejectPayload {
		return ledger.Record{}, invalid("PayloadMismatch", fmt.Sprintf("unknown value %d", int(o.PayloadMismatch)))
	}
	switch {
	case o.MaxAttempts < 0:
		return ledger.Record{}, invalid("MaxAttempts", "negative")
	case o.MaxAttempts == 0:
		o.MaxAttempts = DefaultMaxAttempts
	}
	now := c.store.Now()
	runAt, err := c.runAt(now, o)
	if err != nil {
		return ledger.Record{}, err
	}
	rec := ledger.Record{Kind: kind, Args: string(raw), State: ledger.Enqueued, MaxAttempts: o.MaxAttempts, ArgsHash: ledger.ArgsHash(kind, string(raw)), Queue: o.Queue}
	if !o.RequestTime.IsZero() && o.RequestID == "" {
		return ledger.Record{}, invalid("RequestTime", "needs a RequestID")
	}
	if o.RequestID != "" {
		rec.Request = c.store.HashKey("request\x00" + o.RequestID)
		rec.RequestAt = o.RequestTime.UnixMilli()
	}
	if runAt.After(now) {
		rec.State, rec.RunAt = ledger.Scheduled, runAt.UnixMilli()
	}
	if !o.Deadline.IsZero() {
		if !o.Deadline.After(maxTime(runAt, now)) {
			return ledger.Record{}, invalid("Deadline", "must be after the run time")
		}
		rec.Deadline = o.Deadline.UnixMilli()
	}
	return rec, nil
}

// argsLimit is the most args an entry point takes: with a blob bucket,
// Enqueue, EnqueueMany and EnqueueChild (not debounced: a fold rewrites
// the record's args) take up to ledger.MaxBlobStepBytes, kept in the
// bucket past ledger.MaxInlineArgsBytes; else what a record holds.
func (c *Client) argsLimit(o *Opts, via entry) int {
	if via.blobArgs && o.Debounce == nil && c.store.HasBlobs() {
		return ledger.MaxBlobStepBytes
	}
	return ledger.MaxArgsBytes
}

// offloadArgs moves rec's args over ledger.MaxInlineArgsBytes to the blob
// bucket before the record is written (the record names the object), when
// o and via allow it (argsLimit).
func (c *Client) offloadArgs(ctx context.Context, rec *ledger.Record, o *Opts, via entry) error {
	if len(rec.Args) <= ledger.MaxInlineArgsBytes || c.argsLimit(o, via) == ledger.MaxArgsBytes {
		return nil
	}
	key, err := c.store.PutArgsBlob(ctx, rec.Kind, rec.Args)
	if err != nil {
		return err
	}
	rec.Args, rec.ArgsBlob = "", key
	return nil
}

func (c *Client) runAt(now time.Time, o *Opts) (time.Time, error) {
	switch {
	case o.Delay < 0:
		return time.Time{}, invalid("Delay", "negative")
	case o.Delay > MaxScheduleAhead:
		return time.Time{}, invalid("Delay", fmt.Sprintf("more than %s ahead", MaxScheduleAhead))
	case o.Delay > 0 && !o.RunAt.IsZero():
		return time.Time{}, invalid("RunAt", "set together with Delay")
	case o.Delay > 0:
		return now.Add(o.Delay), nil
	case o.RunAt.IsZero():
		return now, nil
	case o.RunAt.After(now.Add(MaxScheduleAhead)):
		return time.Time{}, invalid("RunAt", fmt.Sprintf("more than %s ahead", MaxScheduleAhead))
	case o.RunAt.Before(now.Add(-c.tolerance)):
		return time.Time{}, invalid("RunAt", fmt.Sprintf("%s is in the past beyond the %s tolerance", o.RunAt.UTC().Format(time.RFC3339), c.tolerance))
	}
	return o.RunAt, nil
}

func checkKey(key string) error {
	switch {
	case key == "":
		return nil
	case strings.TrimSpace(key) == "":
		return invalid("IdempotencyKey", "empty (only white space)")
	case len(key) > ledger.MaxKeyLen:
		return invalid("IdempotencyKey", fmt.Sprintf("%d bytes, the limit is %d", len(key), ledger.MaxKeyLen))
	case !utf8.ValidString(key):
		return invalid("IdempotencyKey", "not valid UTF-8")
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func isNilPointer(v any) bool {
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}
