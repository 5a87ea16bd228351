package main

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestOperatorViews (issue 30, item 11): what an operator asks of the
// CLI, answered. A Scheduled listing shows when each job runs; a failed
// run that will retry reads "failed; retry at …" (it read "ended
// Scheduled: …"); a fan-in child shows its parents; and "who holds key
// X" has a command, which never prints the key.
func TestOperatorViews(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	c := r.e.Client
	res, err := c.Enqueue(ctx, report{Name: "later"}, &enqueue.Opts{Delay: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	out := r.must(t, "list", "--state", "Scheduled")
	runAt := time.UnixMilli(r.e.Get(t, res.ID).RunAt).UTC().Format(time.RFC3339)
	if !strings.Contains(out, "RUNS AT") || !strings.Contains(out, runAt) {
		t.Fatalf("nexjob list --state Scheduled:\n%s\nwant a RUNS AT column with %s", out, runAt)
	}

	// A run that failed and will retry.
	r.broken.Store(true)
	retry, err := c.Enqueue(ctx, report{Name: "flaky"}, &enqueue.Opts{MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	h := r.e.Handler(t, retryRegistry(), &handler.Options{Logger: quiet, Backoff: func(int) time.Duration { return time.Hour }})
	r.e.DrainNow(t, h)
	got := r.must(t, "get", retry.ID)
	if !strings.Contains(got, "failed; retry at ") || strings.Contains(got, "ended Scheduled") {
		t.Fatalf("nexjob get of a job that will retry:\n%s\nwant its run to read \"failed; retry at …\"", got)
	}

	// A fan-in child names its parents.
	a, _ := c.Enqueue(ctx, report{Name: "a"}, &enqueue.Opts{Delay: time.Hour})
	b, _ := c.Enqueue(ctx, report{Name: "b"}, &enqueue.Opts{Delay: time.Hour})
	child, err := c.ContinueWhenAll(ctx, []string{a.ID, b.ID}, report{Name: "both"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got = r.must(t, "get", child.ID)
	if !strings.Contains(got, "parents") || !strings.Contains(got, a.ID) || !strings.Contains(got, b.ID) || !strings.Contains(got, "0 of 2 succeeded") {
		t.Fatalf("nexjob get of a fan-in child:\n%s\nwant its parents, 0 of 2 succeeded", got)
	}

	// Who holds a key.
	const key = "customer-42-invoice"
	held, err := c.Enqueue(ctx, report{Name: "invoice"}, &enqueue.Opts{IdempotencyKey: key, Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	got = r.must(t, "holder", key)
	if !strings.Contains(got, held.ID) || strings.Contains(got, key) {
		t.Fatalf("nexjob holder KEY:\n%s\nwant the holder %s, never the key", got, held.ID)
	}
	got = r.must(t, "holder", "nobody-holds-this")
	// Nor its hash: printed for any string, it was the key secret's HMAC
	// of whatever a reader chose (issue 38 item 14).
	if !strings.Contains(got, "no job holds the key") || strings.Contains(got, "nobody-holds-this") || strings.Contains(got, "hash") {
		t.Fatalf("nexjob holder of a free key:\n%s", got)
	}
}

// retryRegistry's report worker always fails, to be retried.
func retryRegistry() *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(context.Context, *handler.Job[report]) error {
		return errors.New("report store unavailable")
	}), nil)
	return reg
}

// TestRunEndWords: each way a run ends reads as what it means.
func TestRunEndWords(t *testing.T) {
	rec := ledger.Record{State: ledger.Scheduled, Attempt: 2, RunAt: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC).UnixMilli()}
	for _, c := range []struct {
		a    ledger.Attempt
		want string
	}{
		{ledger.Attempt{N: 2, State: ledger.Scheduled, Error: "boom"}, "failed; retry at 2026-12-06T10:00:00Z: boom"},
		{ledger.Attempt{N: 1, State: ledger.Scheduled, Error: "boom"}, "failed; retried: boom"},
		{ledger.Attempt{N: 1, State: ledger.Succeeded}, "succeeded"},
		{ledger.Attempt{N: 1, State: ledger.Failed, Error: "no"}, "failed: no"},
		{ledger.Attempt{N: 1, State: ledger.Enqueued, Error: "cut"}, "cut off by the invocation's deadline; run again: cut"},
	} {
		if got := dashboard.RunEnd(rec, c.a); got != c.want {
			t.Errorf("run %d ended %s: %q; want %q", c.a.N, c.a.State, got, c.want)
		}
	}
}

// nexjob get names a job's queue when it is a named one (found running
// the quick start by hand: a report on bulk read like any other job).
func TestGetShowsTheQueue(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	rec, _, err := r.e.Client.Store().Insert(context.Background(), ledger.Record{Kind: "report", Args: `{"Name":"q"}`, State: ledger.Enqueued, MaxAttempts: 3, Queue: "bulk"}, "", ledger.AllowAfterFailed, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := r.must(t, "get", rec.ID)
	if !regexp.MustCompile(`(?m)^queue +bulk$`).MatchString(got) {
		t.Fatalf("nexjob get of a job on bulk:\n%s\nwant a queue row naming bulk", got)
	}
	plain, err := r.e.Client.Enqueue(context.Background(), report{Name: "default"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.must(t, "get", plain.ID); strings.Contains(got, "\nqueue ") {
		t.Fatalf("a job on the job queue shows a queue row:\n%s", got)
	}
}
