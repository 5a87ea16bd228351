package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// Result is a call's outcome.
type Result[T any] struct {
	// Value is the function's result as recorded: its JSON decoded into
	// T, on the first call as on every repeat (Replayed), so the first
	// caller sees what repeats see. A number held in an any is a
	// json.Number, exact however large (a float64 rounded an id of 20
	// digits on the repeats only). When the result is not recorded (an
	// error says why), the first call's Value is the function's own.
	Value T
	// Replayed: the key's first call recorded this result; the function
	// did not run now.
	Replayed bool
	// KeyHash is the key as stored and logged (never the key itself).
	KeyHash string
}

// CallOptions tune one call. nil takes every default.
type CallOptions struct {
	// Payload is what a repeat must match: the hash of its JSON is
	// recorded with the first call, and a repeat of the key with a
	// different one gets a *PayloadMismatchError. The JSON is taken with
	// its objects' keys sorted (raw JSON's too, as Powertools sorts them)
	// and its integers exact: the same fields in another order are the
	// same payload. Defaults to none (not validated).
	Payload any
}

// Do runs fn once per key: the first call runs it and records its result;
// a repeat returns the recorded result (Replayed) without running it. See
// the package doc for in-progress repeats, errors, policies and failures.
// opts may be nil.
func Do[T any](ctx context.Context, s *Store, key string, fn func(context.Context) (T, error), opts *CallOptions) (Result[T], error) {
	if s.disabled {
		v, err := fn(ctx)
		return Result[T]{Value: v}, err
	}
	if key == "" {
		return Result[T]{}, ErrNoKey
	}
	return call(ctx, s, s.KeyHash(key), fn, opts)
}

// call is Do for a key already hashed (kh).
func call[T any](ctx context.Context, s *Store, kh string, fn func(context.Context) (T, error), opts *CallOptions) (Result[T], error) {
	res := Result[T]{KeyHash: kh}
	var ph string
	if opts != nil && opts.Payload != nil {
		b, err := canonicalJSON(opts.Payload)
		if err != nil {
			return res, fmt.Errorf("nexjob: idempotency payload of key %s: %w", kh, err)
		}
		if ph, err = s.payloadHash(b); err != nil {
			return res, fmt.Errorf("nexjob: idempotency payload of key %s: %w", kh, err)
		}
	}
	if c, ok := s.cached(kh); ok {
		return replay(s, res, c, ph)
	}
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		c, began, err := s.ledger.BeginCall(ctx, kh, ph, s.policy, s.until(ctx), s.skew, s.retention)
		if err != nil {
			return res, fmt.Errorf("nexjob: idempotency key %s: %w", kh, err)
		}
		if began {
			return run(ctx, s, res, c, fn)
		}
		if c.State != ledger.Processing {
			return replay(s, res, c, ph)
		}
		if mismatched(c, ph) {
			return res, mismatch(s, kh)
		}
		// In progress: refuse, or wait for its outcome or its hold's end.
		if !s.wait {
			s.count(metrics.CallInProgress, kh)
			s.log.LogAttrs(ctx, slog.LevelInfo, "nexjob: idempotent call in progress", slog.String("function", s.function), slog.String("key_hash", kh))
			return res, &InProgressError{KeyHash: kh, Until: c.Until}
		}
		for c.Held(s.now().Add(-s.skew)) {
			select {
			case <-ctx.Done():
				s.count(metrics.CallInProgress, kh)
				return res, errors.Join(&InProgressError{KeyHash: kh, Until: c.Until}, ctx.Err())
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
			cur, ok, err := s.ledger.GetCall(ctx, kh)
			if err != nil {
				return res, fmt.Errorf("nexjob: idempotency key %s: %w", kh, err)
			}
			if !ok {
				break // released: take it
			}
			c = cur
		}
		// Its outcome is recorded, or its hold is over: decide again (the
		// policy may let this call take the key).
	}
}

// mismatched reports whether a repeat's payload differs from the first
// call's (either one validated: both must be, and equal).
func mismatched(c ledger.Call, ph string) bool { return c.PayloadHash != ph }

func mismatch(s *Store, kh string) error {
	s.count(metrics.CallMismatch, kh)
	s.log.LogAttrs(context.Background(), slog.LevelWarn, "nexjob: idempotency key re-used with a different payload", slog.String("function", s.function), slog.String("key_hash", kh))
	return &PayloadMismatchError{KeyHash: kh}
}

// replay answers a repeat from the first call's recorded outcome.
func replay[T any](s *Store, res Result[T], c ledger.Call, ph string) (Result[T], error) {
	if mismatched(c, ph) {
		return res, mismatch(s, res.KeyHash)
	}
	s.count(metrics.CallReplayed, res.KeyHash)
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "nexjob: idempotent call replayed", slog.String("function", s.function), slog.String("key_hash", res.KeyHash), slog.String("state", string(c.State)))
	res.Replayed = true
	switch {
	case c.State == ledger.Failed:
		return res, &DuplicateError{KeyHash: res.KeyHash, State: c.State, Policy: s.policy, Message: c.Error}
	case c.Error == tooLargeMark:
		return res, &ResultTooLargeError{KeyHash: res.KeyHash, Limit: s.maxResult, Replayed: true}
	case c.Error == unencodableMark:
		return res, &UnencodableResultError{KeyHash: res.KeyHash, Replayed: true}
	}
	if len(c.Result) > 0 {
		v, err := decodeResult[T](c.Result)
		if err != nil {
			return Result[T]{KeyHash: res.KeyHash}, fmt.Errorf("nexjob: idempotency key %s: decode the recorded result as %T: %w", res.KeyHash, res.Value, err)
		}
		res.Value = v
	}
	s.keep(c)
	return res, nil
}

// run runs the first call of a key the caller now holds, and records or
// releases the key after it.
func run[T any](ctx context.Context, s *Store, res Result[T], held ledger.Call, fn func(context.Context) (T, error)) (out Result[T], err error) {
	s.count(metrics.CallRun, res.KeyHash)
	// One record per outcome, this one too (a doc attack found the run
	// the only outcome with none).
	s.log.LogAttrs(ctx, slog.LevelInfo, "nexjob: idempotent call runs", slog.String("function", s.function), slog.String("key_hash", res.KeyHash))
	panicked := true
	defer func() {
		if panicked { // fn panicked: free the key, and panic on
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
			defer cancel()
			_ = s.ledger.ReleaseCall(rctx, held)
		}
	}()
	v, ferr := fn(ctx)
	panicked = false
	res.Value = v
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	expires := s.now().Add(s.retention)
	if ferr != nil {
		if !s.recordErr {
			if rerr := s.ledger.ReleaseCall(rctx, held); rerr != nil {
				return res, errors.Join(ferr, fmt.Errorf("nexjob: idempotency key %s stays held until %s: %w", res.KeyHash, held.Until.UTC().Format(time.RFC3339), rerr))
			}
			return res, ferr
		}
		msg := ferr.Error()
		if len(msg) > s.maxResult {
			msg = msg[:s.maxResult]
		}
		if _, _, rerr := s.record(rctx, held, ledger.Failed, nil, msg, expires); rerr != nil {
			return res, errors.Join(ferr, &NotRecordedError{KeyHash: res.KeyHash, Err: rerr})
		}
		return res, ferr
	}
	// A result that cannot be kept (not JSON, too large) is recorded as
	// used without it: the function ran, and a repeat must not run it.
	var tooLarge error
	mark := ""
	b, merr := encodeResult(v)
	var recorded T
	if merr == nil {
		// What every repeat will get, and so what this call gets.
		recorded, merr = decodeResult[T](b)
	}
	switch {
	case merr != nil:
		tooLarge = &UnencodableResultError{KeyHash: res.KeyHash, Err: merr}
		b, mark = nil, unencodableMark
	case len(b) > s.maxResult:
		tooLarge = &ResultTooLargeError{KeyHash: res.KeyHash, Bytes: len(b), Limit: s.maxResult}
		b, mark = nil, tooLargeMark
	}
	c, ours, rerr := s.record(rctx, held, ledger.Succeeded, b, mark, expires)
	if rerr != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "nexjob: idempotent call's result not recorded", slog.String("function", s.function), slog.String("key_hash", res.KeyHash), slog.String("error", rerr.Error()))
		return res, errors.Join(tooLarge, &NotRecordedError{KeyHash: res.KeyHash, Err: rerr})
	}
	if tooLarge != nil {
		return res, tooLarge
	}
	res.Value = recorded
	if ours {
		s.keep(c)
	}
	return res, nil
}

// record writes a held call's outcome. ours=false: the write met a
// record that is no longer the call's hold while the hold had not ended
// by this process's clock, and the policy lets a later call replace the
// outcome written. No other call takes a key before its hold's end (plus
// MaxClockSkew by the taker's clock, which is within that of ours), so
// only this call's own write changed the hold: it was applied, its reply
// lost, and before the SDK's resend later calls the policy let in
// replaced or released the outcome (a record removed by hand reads so
// too). The outcome was recorded: no error. Where the policy protects the
// outcome (RejectAlways; RejectIfFailed for a Failed one) no later call
// can have replaced it, so the meeting is a taker whose clock is further
// from ours than MaxClockSkew: ledger.ErrCallTakenOver, not recorded. Past
// the hold's end the meeting stays ledger.ErrCallTakenOver, which can then
// mean either (see NotRecordedError).
func (s *Store) record(ctx context.Context, held ledger.Call, state ledger.State, result []byte, errText string, expires time.Time) (c ledger.Call, ours bool, err error) {
	c, err = s.ledger.RecordCall(ctx, held, state, result, errText, expires)
	if errors.Is(err, ledger.ErrCallTakenOver) && s.now().Before(held.Until) && s.policy.Allows(state) {
		s.log.LogAttrs(ctx, slog.LevelInfo, "nexjob: idempotent call's outcome recorded, since replaced or released by later calls", slog.String("function", s.function), slog.String("key_hash", held.KeyHash))
		return ledger.Call{}, false, nil
	}
	return c, err == nil, err
}
