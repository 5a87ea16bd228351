package enqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// BenchmarkEnqueue measures keyed enqueues against the configured backend
// (make bench: the default emulator, so the figures are the emulator's, not
// DynamoDB's): a new key each time (1 PutItem + 1 SendMessage), a
// duplicate of an active job (1 failed conditional PutItem), and re-use of
// a terminal key (a failed PutItem, then the two-item transaction).
func BenchmarkEnqueue(b *testing.B) {
	e := awstest.New(b, nil)
	c, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("new-key", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := c.Enqueue(ctx, payment{OrderID: "n"}, &enqueue.Opts{IdempotencyKey: fmt.Sprintf("new-%d", i)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		if _, err := c.Enqueue(ctx, payment{OrderID: "d"}, &enqueue.Opts{IdempotencyKey: "dup"}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if res, err := c.Enqueue(ctx, payment{OrderID: "d"}, &enqueue.Opts{IdempotencyKey: "dup"}); err != nil || !res.Duplicate {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("reuse-after-terminal", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			key := fmt.Sprintf("reuse-%d", i)
			first, err := c.Enqueue(ctx, payment{OrderID: "r"}, &enqueue.Opts{IdempotencyKey: key})
			if err != nil {
				b.Fatal(err)
			}
			rec, err := c.Store().Claim(ctx, first.ID, time.Minute)
			if err == nil {
				_, err = c.Store().Finish(ctx, rec, ledger.Finish{State: ledger.Succeeded})
			}
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if res, err := c.Enqueue(ctx, payment{OrderID: "r"}, &enqueue.Opts{IdempotencyKey: key}); err != nil || res.Duplicate {
				b.Fatal(res, err)
			}
		}
	})
}
