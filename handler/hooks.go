package handler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// hookOf is the dead-letter hook of kind: its own, else Options'.
func (h *Handler) hookOf(kind string) func(context.Context, ledger.Record, error) error {
	if e, ok := h.reg.lookup(kind); ok && e.opts.OnDeadLetter != nil {
		return e.opts.OnDeadLetter
	}
	return h.o.OnDeadLetter
}

// takeOverHook runs the due hook of the Failed job rec that another
// worker left (ClaimHook), shown rec. Not ok: the hook is not this
// worker's to run now; heldUntil (unix ms) is when to look again, 0 when
// it ran already or the claim failed (a throttle: the message's next
// delivery tries again).
func (h *Handler) takeOverHook(ctx context.Context, rec ledger.Record) (heldUntil int64, ok bool) {
	lease, _, _ := h.lease(ctx, h.store.Now(), 0)
	cur, ok, err := h.store.ClaimHook(ctx, rec, lease)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return 0, true // gone: no hook is due any more
	case err != nil:
		h.log.ErrorContext(ctx, "nexjob: taking over the dead-letter hook failed", "job_id", rec.ID, "err", err)
		return 0, false
	case !ok && cur.HookPending:
		return cur.HookUntil, false
	case !ok:
		return 0, true // it ran
	}
	h.log.WarnContext(ctx, "nexjob: dead-letter hook still due; running it", "job_id", rec.ID, "kind", rec.Kind)
	rec.HookPending, rec.HookUntil = true, cur.HookUntil
	if !h.runHook(ctx, rec, nil) {
		return 0, false // its mark stays: the message comes back to clear it
	}
	return 0, true
}

// runHook calls rec's dead-letter hook and then, if the record marks it
// due, clears the mark. A crash between the two runs the hook again on the
// next delivery: at least once, once unless a crash comes in between. It
// reports whether the mark is cleared (or there was none): when not, the
// caller keeps the message that brought the job here, whose next delivery
// takes the hook over once this worker's hold ends, runs it again and
// clears the mark. The message used to be deleted, and the mark stayed
// with nothing to retry it (the soak, seed 20261206: jobs Failed with
// their hook pending at the end).
func (h *Handler) runHook(ctx context.Context, rec ledger.Record, cause error) bool {
	if !rec.HookPending {
		h.deadLetter(ctx, rec, cause)
		return true
	}
	stop := h.holdHook(ctx, rec)
	h.deadLetter(ctx, rec, cause)
	until := stop() // the end of the lease as last extended
	// Retried while this worker holds the hook (10k soak, seed
	// 1796415236576371073: one throttled clear, and the next delivery ran
	// the hook again): to the lease as extended, not the first one (a
	// hook that outlasted its first lease had one try, and a throttle ran
	// it twice). HookDone of a cleared mark is no error.
	if until == 0 {
		until = h.store.Now().Add(5 * time.Second).UnixMilli()
	}
	if err := h.retrying(ctx, until, "clearing the dead-letter hook's mark", rec.ID, func() error { return h.store.HookDone(ctx, rec) }); err != nil {
		// The hook ran; the mark stays, and the message's next delivery
		// runs it again (at least once) and clears it.
		h.log.WarnContext(ctx, "nexjob: clearing the dead-letter hook's mark failed", "job_id", rec.ID, "err", err)
		return false
	}
	return true
}

// deadLetter calls the kind's hook (or the handler's) once; its failure or
// panic is logged.
func (h *Handler) deadLetter(ctx context.Context, rec ledger.Record, cause error) {
	hook := h.hookOf(rec.Kind)
	if hook == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			h.log.ErrorContext(ctx, "nexjob: dead-letter hook panicked", "job_id", rec.ID, "panic", fmt.Sprint(v))
		}
	}()
	if cause == nil {
		cause = errors.New(rec.LastError)
	}
	if err := hook(ctx, rec, cause); err != nil {
		h.log.ErrorContext(ctx, "nexjob: dead-letter hook failed", "job_id", rec.ID, "err", err)
	}
}

// holdHook keeps this worker's lease on rec's due dead-letter hook alive
// while the hook runs: every third of the lease it moves the lease's end
// a whole lease ahead (ledger.Store.ExtendHook), so a hook slower than
// its lease is never taken over by a duplicate delivery and run twice
// beside itself. A holder that dies stops extending, and the lease runs
// out as before. The returned stop ends the extensions and returns the
// end of the lease this worker last held (unix ms; 0 for none).
func (h *Handler) holdHook(ctx context.Context, rec ledger.Record) (stop func() int64) {
	lease := ledger.Millis(rec.HookUntil).Sub(h.store.Now())
	if rec.HookUntil == 0 || lease <= 0 {
		return func() int64 { return rec.HookUntil }
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	held := []int64{rec.HookUntil} // the goroutine's until stop has waited for it
	go func() {
		defer wg.Done()
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			next := h.store.Now().Add(lease).UnixMilli()
			ok, err := h.store.ExtendHook(context.WithoutCancel(ctx), rec.ID, held, next)
			switch {
			case err != nil:
				// It may have applied: hold that value too, and try again
				// at the next tick (two thirds of the lease are left).
				h.log.WarnContext(ctx, "nexjob: extending the dead-letter hook's lease failed", "job_id", rec.ID, "err", err)
				held = append(held[max(0, len(held)-3):], next)
			case !ok:
				held = []int64{rec.HookUntil}
				return // done, or no longer ours
			default:
				held = []int64{next}
			}
		}
	}()
	return func() int64 {
		close(done)
		wg.Wait()
		return slices.Min(held) // the lease surely held (a lost reply leaves two candidates)
	}
}
