package ledger

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Record is one job as the ledger keeps it. Times are Unix milliseconds
// (ExpiresAt, the TTL attribute, is Unix seconds as DynamoDB requires); zero
// means unset.
type Record struct {
	PK          string   `dynamodbav:"pk"`
	ID          string   `dynamodbav:"id"`
	Kind        string   `dynamodbav:"kind"`
	Args        string   `dynamodbav:"args"`
	State       State    `dynamodbav:"state"`
	Attempt     int      `dynamodbav:"attempt"`
	MaxAttempts int      `dynamodbav:"maxAttempts"`
	KeyHash     string   `dynamodbav:"keyHash,omitempty"`
	Policy      string   `dynamodbav:"policy,omitempty"`
	CreatedAt   int64    `dynamodbav:"createdAt"`
	UpdatedAt   int64    `dynamodbav:"updatedAt"`
	RunAt       int64    `dynamodbav:"runAt,omitempty"`
	Deadline    int64    `dynamodbav:"deadline,omitempty"`
	LeaseUntil  int64    `dynamodbav:"leaseUntil,omitempty"`
	Token       int64    `dynamodbav:"token"`
	LastError   string   `dynamodbav:"lastError,omitempty"`
	Result      string   `dynamodbav:"result,omitempty"` // a Succeeded run's JSON result (handler.AddWorkerResult), at most ResultRoom bytes; read it through SucceededResult (or Store.ResultOf: one over ResultRoom is in the blob bucket, ResultBlob)
	ExpiresAt   int64    `dynamodbav:"expiresAt,omitempty"`
	ParentID    string   `dynamodbav:"parentId,omitempty"`
	Children    []string `dynamodbav:"children,stringset,omitempty"` // continuations waiting on this job
	ListState   string   `dynamodbav:"listState,omitempty"`          // the byState index's key, "State#shard"; set only for indexed states
	ListErr     string   `dynamodbav:"listErr,omitempty"`            // LastError cut to MaxListError: what the index projects
	ListAt      int64    `dynamodbav:"listAt,omitempty"`             // the byState index's sort key (Unix ms)
	// Undispatched marks a job whose SQS send failed after it was written;
	// a caller retrying its key sends it again at once.
	Undispatched bool `dynamodbav:"undispatched,omitempty"`
	// Nonce is set by every conditional update, a fresh random one per
	// logical write: when DynamoDB applied an update but its reply was
	// lost, the SDK's resend (or a read after an error) finds it, so the
	// write knows it was its own. Nonce1 and Nonce2 are the two before it,
	// shifted down by each update, so a write is still recognised after
	// two others (a continuation's link, a guard's mark) landed between
	// it and its resend.
	Nonce  string `dynamodbav:"nonce,omitempty"`
	Nonce1 string `dynamodbav:"nonce1,omitempty"`
	Nonce2 string `dynamodbav:"nonce2,omitempty"`
	// Hist0 to Hist2 are the last three runs' ends, newest first, each
	// written by the Finish that ended it (no extra request): see
	// Attempts.
	Hist0 *Attempt `dynamodbav:"hist0,omitempty"`
	Hist1 *Attempt `dynamodbav:"hist1,omitempty"`
	Hist2 *Attempt `dynamodbav:"hist2,omitempty"`
	// Request is the hash of the enqueue request that created the job
	// (enqueue.Opts.RequestID), if it named one: a retry of that request
	// that meets this job on the key gets it back, in any state.
	Request string `dynamodbav:"request,omitempty"`
	// RequestAt (unix ms) orders the key's requests (a recurring firing's
	// scheduled time): a request at or before it, made by another request,
	// is a late retry and gets this job back instead of a new one. 0: none.
	RequestAt int64 `dynamodbav:"reqAt,omitempty"`
	// CutOffs counts the runs of the current attempt that the invocation
	// deadline cut off (refunded); the handler spends the attempt at a bound.
	CutOffs int `dynamodbav:"cutOffs,omitempty"`
	// Returns counts how often the DLQ consumer sent the job back because
	// its message reached the DLQ before any run of it started.
	Returns int `dynamodbav:"dlqReturns,omitempty"`
	// ReturnOf is the SQS message id of the dead letter last counted in
	// Returns: a redelivery of that dead letter (its handling failed
	// after the count was written) is not counted again.
	ReturnOf string `dynamodbav:"dlqMsg,omitempty"`
	// ReturnAt (unix ms) is when the DLQ consumer last sent the job back.
	ReturnAt int64 `dynamodbav:"dlqAt,omitempty"`
	// ArgsHash fingerprints Kind and Args (see ArgsHash), so a key re-used
	// with other args can be told from a true retry. Empty on records
	// written before it existed.
	ArgsHash string `dynamodbav:"argsHash,omitempty"`
	// Cancelled marks a Failed job that an operator withdrew before it
	// started (Withdraw).
	Cancelled bool `dynamodbav:"cancelled,omitempty"`
	// HookPending marks a Failed job whose dead-letter hook has not been
	// seen to run: the Finish that made it Failed set it, HookDone clears
	// it once the hook returned. A worker that meets it (a crash between
	// the two) runs the hook then.
	HookPending bool `dynamodbav:"hookPending,omitempty"`
	// HookUntil (unix ms) is the end of the lease on a due hook: the
	// worker that made the job Failed, or that took the hook over with
	// ClaimHook, runs it until then, and no other worker does.
	HookUntil int64 `dynamodbav:"hookUntil,omitempty"`
	// Defers counts the claims in a row that flow control deferred (no
	// throttle or concurrency slot free); any run's end clears it. The
	// handler backs off on it.
	Defers int `dynamodbav:"defers,omitempty"`
	// Slot (unix ms) is the throttle slot the current attempt took before
	// it was deferred (Finish.Slot): its next claim starts on it instead
	// of taking another. Any run's end clears it.
	Slot int64 `dynamodbav:"slot,omitempty"`
	// Ticket is the place in its concurrency key's queue of waiters that
	// the current attempt was given when it found no slot (Finish.Ticket):
	// its next claim takes the slot reserved for it. Any run's end clears it.
	Ticket int64 `dynamodbav:"ticket,omitempty"`
	// Steps are the job's completed steps, by name, each its result's
	// JSON (RecordStep): every run of the job reads them from its claim.
	// They stay across retries and requeues.
	Steps StepMap `dynamodbav:"steps,omitempty"`
	// CancelReq is an operator's reason for stopping the running job
	// (Store.RequestCancel): its next step's record is refused with
	// ErrCancelRequested, and the run fails for good.
	CancelReq string `dynamodbav:"cancelReq,omitempty"`
	// ReopenWaits: a requeue of a job whose waits timed out asks its next
	// run to open them again (ReopenTimedOutWaits, the worker's write: an
	// operator may not write a job's steps).
	ReopenWaits bool `dynamodbav:"reopenWaits,omitempty"`
	// StepsGen is the generation of the job's steps in the steps table
	// (Options.StepsTable): ForgetSteps moves it on, and the items of an
	// earlier one are no longer read.
	StepsGen int `dynamodbav:"stepsGen,omitempty"`
	// RanMark: a run recorded a step in the steps table (Finish.Ran).
	RanMark bool `dynamodbav:"ran,omitempty"`
	// Caller is the job whose run started this one as its child
	// (handler.Invoke): its end is recorded in the caller's steps
	// (ChildEnded) and wakes it.
	Caller string `dynamodbav:"caller,omitempty"`
	// ChildEnds counts the ends of this job's children recorded in its
	// steps (ChildEnded): a run that begins a wait for children compares
	// it with its claim's, so no end is missed between the two.
	ChildEnds int `dynamodbav:"childEnds,omitempty"`
	// AwaitEnd is the end (unix ms) of the wait for children the job
	// sleeps in (Finish.AwaitChildren); 0 when it sleeps in none.
	AwaitEnd int64 `dynamodbav:"awaitEnd,omitempty"`
	// Compensable: a run of the job declared a compensation
	// (handler.Compensate): a cancel of it while it waits is a run that
	// compensates (RequestCompensation), not a withdrawal.
	Compensable bool `dynamodbav:"comp,omitempty"`
	// ResultBlob is the blob bucket's object holding a Succeeded run's
	// result over ResultRoom (Options.BlobBucket), Result then empty:
	// Store.ResultOf reads either.
	ResultBlob string `dynamodbav:"resultBlob,omitempty"`
	// ArgsBlob is the blob bucket's object holding the job's args when
	// they are over MaxInlineArgsBytes (Options.BlobBucket), Args then
	// empty: Store.ArgsOf reads either.
	ArgsBlob string `dynamodbav:"argsBlob,omitempty"`
	// Parents are a fan-in continuation's parents (enqueue's
	// ContinueWhenAll), Released those whose success has counted: it is
	// released when Released holds every parent. A set, so a parent's
	// release counted twice (a replay, a lost reply) counts once.
	Parents  []string `dynamodbav:"parents,stringset,omitempty"`
	Released []string `dynamodbav:"released,stringset,omitempty"`
	// ByCheck marks a job the dispatch guard's check message claimed (it
	// had never been sent): that message is the job's only one, and is
	// handled as its own from then on (ClaimByCheck).
	ByCheck bool `dynamodbav:"byCheck,omitempty"`
	// NonJob marks a record that keeps a message that was not a job
	// (handler.DeadLetterKind): it is never requeued. A requeue's
	// condition reads this, not the kind, so that no operator write names
	// a record's kind (GrantOperate denies those).
	NonJob bool `dynamodbav:"nonJob,omitempty"`
	// Queue is the named queue the job's messages go to (enqueue's
	// Opts.Queue); "" is the default job queue. Every send of the job (the
	// first, a retry, a carried-forward schedule, a requeue, the guard's
	// check) goes to it.
	Queue string `dynamodbav:"queue,omitempty"`
}

// Continues reports whether the job is a continuation: of one parent
// (ParentID) or of several (a fan-in child's Parents).
// Ran reports whether a run of r began before the one its claim starts
// now, as far as its record tells while its attempt count says none did
// (attempt 0 at rest, 1 once claimed): a step of its own is recorded (a
// sleep and a wait are steps; a signal sent to it is not), or a run was
// cut off. A run that sleeps or waits gives its attempt back, so the
// attempt count alone read a job asleep after its charge as never
// started: its Deadline expired it, and a debounced enqueue folded into
// it.
func (r Record) Ran() bool {
	if r.CutOffs > 0 || r.RanMark {
		return true
	}
	for name := range r.Steps {
		if !strings.HasPrefix(name, signalStep) {
			return true
		}
	}
	return false
}

func (r Record) Continues() bool { return r.ParentID != "" || len(r.Parents) > 0 }

// ParentIDs are the job's parents: ParentID, or a fan-in child's Parents.
func (r Record) ParentIDs() []string {
	if r.ParentID != "" {
		return []string{r.ParentID}
	}
	return r.Parents
}

// ExpiredAt reports whether the record is past its retention at now: such a
// record counts as gone in every read and condition, although DynamoDB
// deletes it later (up to days) and emulators never do.
func (r *Record) ExpiredAt(now time.Time) bool {
	return r.ExpiresAt != 0 && r.ExpiresAt <= now.Unix()
}

// TTL converts the end of a retention to the TTL attribute's Unix seconds,
// rounded up: a record counts as held until the whole retention has passed
// (ExpiredAt is true from that second on), never up to a second less.
func TTL(t time.Time) int64 {
	s := t.Unix()
	if t.After(time.Unix(s, 0)) {
		s++
	}
	return s
}

// Millis converts a record time to a time.Time; zero stays zero.
func Millis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// MaxKeyLen bounds idempotency keys before hashing. Keys are hashed, so the
// stored size does not depend on it; the bound catches keys that are
// clearly not keys (a whole payload passed by mistake).
const MaxKeyLen = 1024

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// hashKey returns the 128-bit hash of an idempotency key, base32 encoded
// (26 characters). With a secret it is an HMAC, so that low-entropy keys
// such as "welcome-<user id>" cannot be confirmed by hashing guesses.
// HashKeyWith is the ledger's hash of key under secret (Store.HashKey's,
// for a store of records kept elsewhere): HMAC-SHA-256 with the secret,
// SHA-256 without one, its first 16 bytes in lower-case base32.
func HashKeyWith(secret []byte, key string) string { return hashKey(secret, key) }

func hashKey(secret []byte, key string) string {
	var sum []byte
	if len(secret) > 0 {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(key))
		sum = m.Sum(nil)
	} else {
		s := sha256.Sum256([]byte(key))
		sum = s[:]
	}
	return b32.EncodeToString(sum[:16])
}

const (
	keyPrefix = "k#"
	jobPrefix = "j#"
	idSep     = "."
)

// newID returns a fresh job id. A keyed job's id carries its key hash so
// that the job can be found from its id alone, without an index: the
// record that *is* the key lives under "k#<hash>".
func newID(keyHash string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("ledger: crypto/rand failed: %v", err))
	}
	id := b32.EncodeToString(b[:])
	if keyHash != "" {
		id += idSep + keyHash
	}
	return id
}

// locate returns the partition keys where the job with this id may live,
// in the order to look: the key's record first for keyed jobs, then the
// job's own record (where an unkeyed job lives and where a keyed one is
// archived when its key is re-used).
func locate(id string) ([]string, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %q", ErrBadID, truncate(id, 80))
	}
	if i := strings.Index(id, idSep); i >= 0 {
		return []string{keyPrefix + id[i+1:], jobPrefix + id}, nil
	}
	return []string{jobPrefix + id}, nil
}

func validID(id string) bool {
	first, second, two := strings.Cut(id, idSep)
	return validPart(first) && (!two || validPart(second))
}

// validPart is one part of an id: 26 characters of base32.
func validPart(p string) bool {
	if len(p) != 26 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// truncate cuts s to at most n bytes (plus an ellipsis), on a rune
// boundary: DynamoDB refuses strings that are not UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// MaxLastError bounds the kept last error, in bytes.
const MaxLastError = 4000

// MaxListError bounds the last error the byState index projects (ListErr),
// in bytes: with it an index entry stays under 1 KB, one write unit,
// whatever the job's args and error.
const MaxListError = 200

// Attempt is how one run ended: kept for people (nexjob get, the
// dashboard), three at most per record.
type Attempt struct {
	N     int    `dynamodbav:"n"`             // the attempt's number
	At    int64  `dynamodbav:"at"`            // when it ended, Unix ms
	State State  `dynamodbav:"st"`            // what Finish made the job: Scheduled (a retry), Succeeded, …
	Error string `dynamodbav:"err,omitempty"` // its error, cut to MaxAttemptError bytes
}

// MaxAttemptError bounds an Attempt's error, in bytes: three of them add
// under a kilobyte to the record (and so to each write's units).
const MaxAttemptError = 240

// HistoryLen is how many run ends a record keeps.
const HistoryLen = 3

// Attempts returns the last runs' ends, newest first (at most
// HistoryLen). Requeue keeps them: a requeued job shows what happened
// before.
func (r Record) Attempts() []Attempt {
	var out []Attempt
	for _, a := range []*Attempt{r.Hist0, r.Hist1, r.Hist2} {
		if a != nil && a.N > 0 {
			out = append(out, *a)
		}
	}
	return out
}

// Wrote reports whether the record carries the write with this nonce
// among its last three updates.
func (r Record) Wrote(nonce string) bool {
	return nonce != "" && (r.Nonce == nonce || r.Nonce1 == nonce || r.Nonce2 == nonce)
}

// noNonce fills an empty slot of the shift register.
const noNonce = "-"

// NewNonce returns a fresh write nonce: one per logical write, kept for
// that write's own retries (Finish.Nonce).
func NewNonce() string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("ledger: crypto/rand failed: %v", err))
	}
	return b32.EncodeToString(b[:])
}

// stringSet is a one-element DynamoDB string set for ADD.
func stringSet(v string) *types.AttributeValueMemberSS {
	return &types.AttributeValueMemberSS{Value: []string{v}}
}

// Retention is how long terminal records are kept, per terminal state (the
// TTL written on the terminal write). A zero field keeps such records
// forever.
type Retention struct {
	Succeeded, Failed, Expired time.Duration
}

// DefaultRetention is NexJob's: 7 days, 30 days, 7 days.
var DefaultRetention = Retention{Succeeded: 7 * 24 * time.Hour, Failed: 30 * 24 * time.Hour, Expired: 7 * 24 * time.Hour}

// For is the retention of a record ending in st (zero: kept for ever).
func (r Retention) For(st State) time.Duration {
	switch st {
	case Succeeded:
		return r.Succeeded
	case Failed:
		return r.Failed
	case Expired:
		return r.Expired
	}
	return 0
}

// SucceededResult is the job's result while it is Succeeded, else "": a
// requeued job's item keeps the result of its run before until its next
// run ends (a requeue, an operator's write, may not name the result: see
// infra.OperatorAttributes), and that result is no longer the job's.
func (r Record) SucceededResult() string {
	if r.State != Succeeded {
		return ""
	}
	return r.Result
}
