package recurring_test

import (
	"context"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
)

// A firing whose job ended Failed (every attempt's worker killed: an
// orphan out of attempts), delivered again by Scheduler's retry, gets its
// own job back: one firing, one job, whatever its end.
func TestRetriedFiringOfAFailedJobMakesNoSecondJob(t *testing.T) {
	e := awstest.New(t, nil)
	ctx := context.Background()
	c, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f := recurring.Firing{V: 1, ID: "hourly", Kind: "report", Args: []byte(`{"name":"h"}`), Concurrency: recurring.SkipIfRunning, ScheduledTime: "2026-12-12T09:00:00Z", MaxAttempts: 1}
	first, err := recurring.Fire(ctx, c, f)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Store()
	rec, err := st.Claim(ctx, first.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "orphaned"}); err != nil {
		t.Fatal(err)
	}
	again, err := recurring.Fire(ctx, c, f)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID {
		t.Fatalf("the firing delivered again after its job Failed made a second job %s (first %s)", again.ID, first.ID)
	}
}
