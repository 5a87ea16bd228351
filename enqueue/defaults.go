package enqueue

import (
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// KindDefaults is an optional method of an args type: its kind's defaults,
// as River's InsertOpts. Enqueue takes MaxAttempts, DuplicatePolicy,
// PayloadMismatch, Queue and the key (IdempotencyKey, KeyByArgs) from it
// where the Opts leave them at their zero value;
// the worker (handler.AddWorker) takes Timeout and Retention where the
// KindOptions leave them unset.
//
//	func (Payment) JobDefaults() enqueue.Defaults {
//		return enqueue.Defaults{MaxAttempts: 10, DuplicatePolicy: enqueue.RejectIfFailed, Timeout: 30 * time.Second}
//	}
//
// The zero value of an Opts field is "not set": naming AllowAfterFailed
// (DuplicatePolicy's zero) over a kind whose default is RejectAlways still
// gives RejectAlways. Opts.NoKindDefaults takes the Opts as they are.
type KindDefaults interface {
	JobDefaults() Defaults
}

// Defaults are a kind's defaults; zero fields take the package's.
type Defaults struct {
	MaxAttempts     int
	DuplicatePolicy DuplicatePolicy
	PayloadMismatch PayloadPolicy
	// Timeout bounds one run (handler.KindOptions.Timeout).
	Timeout time.Duration
	// Retention of the kind's terminal records (handler.KindOptions.Retention).
	Retention *ledger.Retention
	// Queue is the kind's named queue (Opts.Queue).
	Queue string
	// IdempotencyKey is the job's key when Opts names none: JobDefaults
	// is a method of the args, so the key comes from them (River's
	// UniqueOpts{ByArgs}):
	//
	//	func (w Welcome) JobDefaults() enqueue.Defaults {
	//		return enqueue.Defaults{IdempotencyKey: "welcome/" + w.UserID, DuplicatePolicy: enqueue.RejectAlways}
	//	}
	IdempotencyKey string
	// KeyByArgs, with no key from Opts or IdempotencyKey, keys the job by
	// its kind and its whole args (their JSON, hashed as every key is):
	// the same args are the same job.
	KeyByArgs bool
}

// effective is the Opts an enqueue of args runs with, for Enqueue,
// EnqueueMany and EnqueueTx alike: opts (nil: zero) with the args type's
// defaults filling its zero fields, unless opts.NoKindDefaults.
func effective(args JobArgs, opts *Opts) Opts {
	var o Opts
	if opts != nil {
		o = *opts
	}
	if args != nil && !isNilPointer(args) && !o.NoKindDefaults {
		applyDefaults(args, &o)
	}
	return o
}

// applyDefaults fills o's zero fields from the args type's defaults.
func applyDefaults(args JobArgs, o *Opts) {
	d, ok := args.(KindDefaults)
	if !ok {
		return
	}
	def := d.JobDefaults()
	if o.MaxAttempts == 0 {
		o.MaxAttempts = def.MaxAttempts
	}
	if o.DuplicatePolicy == AllowAfterFailed {
		o.DuplicatePolicy = def.DuplicatePolicy
	}
	if o.PayloadMismatch == IgnorePayload {
		o.PayloadMismatch = def.PayloadMismatch
	}
	if o.Queue == "" {
		o.Queue = def.Queue
	}
	if o.IdempotencyKey == "" && o.Debounce == nil { // a debounce has its own key
		o.IdempotencyKey = def.IdempotencyKey
		o.keyByArgs = o.IdempotencyKey == "" && def.KeyByArgs
	}
}
