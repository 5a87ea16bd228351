package handler

import (
	"context"
	"sync"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// holdHook keeps this worker's lease on rec's due dead-letter hook alive
// while the hook runs: every third of the lease it moves the lease's end
// a whole lease ahead (ledger.Store.ExtendHook), so a hook slower than
// its lease is never taken over by a duplicate delivery and run twice
// beside itself. A holder that dies stops extending, and the lease runs
// out as before. The returned stop ends the extensions.
func (h *Handler) holdHook(ctx context.Context, rec ledger.Record) (stop func()) {
	lease := ledger.Millis(rec.HookUntil).Sub(h.store.Now())
	if rec.HookUntil == 0 || lease <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		held := []int64{rec.HookUntil}
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
				return // done, or no longer ours
			default:
				held = []int64{next}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
