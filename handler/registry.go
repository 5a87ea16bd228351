package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Job is one run of a job as its worker sees it.
type Job[T enqueue.JobArgs] struct {
	ID          string // the job id
	Attempt     int    // 1 for the first run
	MaxAttempts int
	KeyHash     string // hashed idempotency key; "" when unkeyed
	Args        T
}

// Worker runs jobs of one kind. Work's error decides what happens next: nil
// succeeds; Permanent(err) fails the job at once; RetryAfter(d, err) retries
// after d; any other error retries with backoff until attempts run out.
type Worker[T enqueue.JobArgs] interface {
	Work(ctx context.Context, job *Job[T]) error
}

// WorkFunc makes a function a Worker.
type WorkFunc[T enqueue.JobArgs] func(ctx context.Context, job *Job[T]) error

// Work calls f.
func (f WorkFunc[T]) Work(ctx context.Context, job *Job[T]) error { return f(ctx, job) }

// ResultWorker runs jobs of one kind and returns each run's result, R as
// JSON, which the write that makes the job Succeeded keeps with its
// record (no extra request): enqueue's Client.Result and Wait read it.
// Work's error decides what happens next as for a Worker; a failed run
// keeps no result. A result whose JSON is over ledger.MaxResultBytes
// fails the job permanently with a *ledger.ResultTooLargeError, one that
// does not encode (or is not UTF-8) with a *ResultError: nothing of it is
// stored, and neither error quotes it. The result is never logged, nor
// put on a span or a metric.
type ResultWorker[T enqueue.JobArgs, R any] interface {
	Work(ctx context.Context, job *Job[T]) (R, error)
}

// ResultFunc makes a function a ResultWorker.
type ResultFunc[T enqueue.JobArgs, R any] func(ctx context.Context, job *Job[T]) (R, error)

// Work calls f.
func (f ResultFunc[T, R]) Work(ctx context.Context, job *Job[T]) (R, error) { return f(ctx, job) }

// KindOptions tune one kind. The zero value takes every default.
type KindOptions struct {
	// Backoff gives the wait before the next attempt after a failed one
	// (attempt counts from 1). Defaults to the handler's Options.Backoff
	// (DefaultBackoff).
	Backoff func(attempt int) time.Duration
	// OnDeadLetter is called once when a job of this kind becomes Failed,
	// with the record and the cause: the worker's last error (a
	// *PermanentError, a *PanicError, …) or, when the worker never
	// reported, an error matching ErrOrphaned. A hook that fails or panics
	// is logged and never blocks the batch. It may release or cancel the
	// job's continuations (enqueue.Client.ReleaseContinuations,
	// CancelContinuations). Defaults to none.
	OnDeadLetter func(ctx context.Context, rec ledger.Record, cause error) error
	// Timeout bounds one run: its context ends then (with a *TimeoutError
	// as its cause) and the run counts as a failed attempt. The claim's
	// lease is sized to it, so a crashed run's job is recovered that much
	// sooner. Under Lambda the invocation's deadline ends a run earlier
	// when it comes first (a cut-off, which gives the attempt back up to
	// Options.MaxCutOffs times). Defaults to none: the lease or the
	// invocation bounds the run.
	Timeout time.Duration
	// Retention of this kind's terminal records, instead of the handler's
	// Options.Retention (a zero field keeps them forever). Defaults to the
	// handler's.
	Retention *Retention
	// Throttle limits how often this kind's jobs start per key (see
	// Throttle). Defaults to none.
	Throttle *Throttle
	// Concurrency limits how many of this kind's jobs run at once per
	// key (see Concurrency). Defaults to none.
	Concurrency *Concurrency
	// Patches are the patches this kind's code knows (Patched): a job
	// records them at its first run and answers Patched from that record
	// for ever. Append a name when a deploy changes what a sleeping job
	// would do; remove it once no open job lacks it. Defaults to none.
	Patches []string
}

type entry struct {
	run  func(ctx context.Context, rec ledger.Record) (result string, err error) // result: the JSON to keep, "" none
	opts KindOptions
}

// Registry maps kinds to workers. Register every kind before handling.
type Registry struct {
	mu    sync.RWMutex
	kinds map[string]*entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{kinds: map[string]*entry{}} }

// AddWorker registers the worker for T's kind. It panics on a nil worker,
// on a kind registered twice and on an args type whose Kind is empty: a
// bad registration is a programming error that must fail at start.
func AddWorker[T enqueue.JobArgs](r *Registry, w Worker[T], opts *KindOptions) {
	if isNil(w) {
		panic("nexjob: AddWorker with a nil worker")
	}
	add(r, func(ctx context.Context, _ ledger.Record, job *Job[T]) (string, error) {
		return "", w.Work(ctx, job)
	}, opts)
}

// AddWorkerResult registers the result worker for T's kind, as AddWorker
// registers a worker (and panics as it does): its runs' results are kept
// (see ResultWorker).
func AddWorkerResult[T enqueue.JobArgs, R any](r *Registry, w ResultWorker[T, R], opts *KindOptions) {
	if isNil(w) {
		panic("nexjob: AddWorkerResult with a nil worker")
	}
	add(r, func(ctx context.Context, rec ledger.Record, job *Job[T]) (string, error) {
		v, err := w.Work(ctx, job)
		if err != nil {
			return "", err
		}
		return encodeResult(ctx, rec, v)
	}, opts)
}

// isNil reports whether a worker is nil, or a nil function in one.
func isNil(w any) bool {
	return w == nil || reflect.ValueOf(w).Kind() == reflect.Func && reflect.ValueOf(w).IsNil()
}

// add registers work for T's kind: the args decoded, then work.
func add[T enqueue.JobArgs](r *Registry, work func(context.Context, ledger.Record, *Job[T]) (string, error), opts *KindOptions) {
	var zero T
	kind := zero.Kind()
	if !kinds.Valid(kind) {
		panic(fmt.Sprintf("nexjob: %T's Kind() %q is not a valid kind: %s", zero, kind, kinds.Rule))
	}
	e := &entry{run: func(ctx context.Context, rec ledger.Record) (string, error) {
		job := &Job[T]{ID: rec.ID, Attempt: rec.Attempt, MaxAttempts: rec.MaxAttempts, KeyHash: rec.KeyHash}
		if err := json.Unmarshal([]byte(rec.Args), &job.Args); err != nil {
			return "", Permanent(&ArgsError{JobID: rec.ID, Type: fmt.Sprintf("%T", zero), Reason: redact.JSON(err)})
		}
		return work(ctx, rec, job)
	}}
	if opts != nil {
		e.opts = *opts
		e.opts.Patches = slices.Clone(opts.Patches)
	}
	if err := checkPatches(e.opts.Patches); err != nil {
		panic(err.Error()) // a bad registration fails at start
	}
	// The args type's own defaults (enqueue.KindDefaults) fill what opts leaves unset.
	if d, ok := any(zero).(enqueue.KindDefaults); ok {
		def := d.JobDefaults()
		if e.opts.Timeout == 0 {
			e.opts.Timeout = def.Timeout
		}
		if e.opts.Retention == nil {
			e.opts.Retention = def.Retention
		}
	}
	if e.opts.Timeout < 0 {
		panic(fmt.Sprintf("nexjob: kind %q has a negative Timeout", kind))
	}
	checkFlow(kind, e.opts)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.kinds[kind]; dup {
		panic(fmt.Sprintf("nexjob: kind %q registered twice", kind))
	}
	r.kinds[kind] = e
}

// encodeResult is a run's result as the record keeps it: its JSON, or
// the permanent error that fails the run when the record cannot keep it
// (over ResultRoom with no blob bucket, over MaxBlobStepBytes with one).
func encodeResult[R any](ctx context.Context, rec ledger.Record, v R) (string, error) {
	room := ledger.ResultRoom(rec)
	if s := stepsOf(ctx); s != nil && s.store.HasBlobs() {
		room = ledger.MaxBlobStepBytes // kept in the blob bucket past the record's room (ledger's Finish)
	}
	b, err := json.Marshal(v)
	switch {
	case err != nil:
		return "", Permanent(&ResultError{JobID: rec.ID, Type: reflect.TypeFor[R]().String(), Reason: redact.JSON(err)})
	case !utf8.Valid(b):
		return "", Permanent(&ResultError{JobID: rec.ID, Type: reflect.TypeFor[R]().String(), Reason: "its JSON is not UTF-8 (a MarshalJSON's raw bytes)"})
	case len(b) > room:
		return "", Permanent(&ledger.ResultTooLargeError{JobID: rec.ID, Size: len(b), Limit: room})
	}
	return string(b), nil
}

func (r *Registry) lookup(kind string) (*entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.kinds[kind]
	return e, ok
}

// Kinds are the registered kinds, sorted.
func (r *Registry) Kinds() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.kinds))
}
