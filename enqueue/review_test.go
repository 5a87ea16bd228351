package enqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Review: a keyed enqueue takes its rate-limit slot under its key's tag,
// and a later enqueue with the same key finds the tag in the log and is
// let through with no new slot, "a retry of the same call". But once the
// key's job has ended, the default policy (AllowAfterFailed) makes that
// later enqueue a new job: accepted, written and run, uncounted. With a
// Limit of 1 an hour, one key accepts a new job every time its last one
// ended.
func TestReviewRateLimitKeyedReuseUncounted(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	c := e.Client
	st := c.Store()
	opts := &enqueue.Opts{IdempotencyKey: "order-9", RateLimit: &enqueue.RateLimit{Key: "tenant-3", Limit: 1, Period: time.Hour}}
	accepted := map[string]bool{}
	for i := range 3 {
		res, err := c.Enqueue(ctx, payment{OrderID: "9", Cents: i}, opts)
		if err != nil {
			break // refused: the limit is reached
		}
		if res.Duplicate {
			t.Fatalf("enqueue %d: a duplicate of %s, though its job ended", i, res.ID)
		}
		accepted[res.ID] = true
		// The job runs and succeeds: the key is free again for a new job.
		rec, err := st.Claim(ctx, res.ID, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Succeeded, Nonce: ledger.NewNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	if len(accepted) > 1 {
		t.Fatalf("%d new jobs accepted within an hour under a RateLimit of 1 an hour: want 1", len(accepted))
	}
}
