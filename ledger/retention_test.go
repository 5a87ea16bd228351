package ledger_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestRetentionHeldWholeTime (scenario 19): a terminal record, and the
// protection of its key, last for the whole retention, never up to a
// second less; then the record counts as gone.
func TestRetentionHeldWholeTime(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var now atomic.Int64 // Unix ns; starts just before a second turns over
	now.Store(time.Unix(2_000_000_000, 900_000_000).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s, err := ledger.New(e.DB, e.Table, &ledger.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rec, _, err := s.Insert(ctx, ledger.Record{Kind: "notice", Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "legal-notice-7", ledger.RejectAlways, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = s.Claim(ctx, rec.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	const retention = 1500 * time.Millisecond
	if _, err = s.Finish(ctx, rec, ledger.Finish{State: ledger.Succeeded, ExpiresAt: clock().Add(retention)}); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(retention - 100*time.Millisecond)) // still within the retention
	if _, err := s.Get(ctx, rec.ID); err != nil {
		t.Fatalf("within its retention: %v", err)
	}
	_, _, err = s.Insert(ctx, ledger.Record{Kind: "notice", Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "legal-notice-7", ledger.RejectAlways, nil)
	var dup *ledger.DuplicateJobError
	if !errors.As(err, &dup) || dup.ExistingJobID != rec.ID {
		t.Fatalf("key re-used within the retention: %v; want the RejectAlways rejection", err)
	}
	now.Add(int64(time.Second + 100*time.Millisecond)) // past it, rounded up to the second
	if _, err := s.Get(ctx, rec.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("past its retention: %v; want ErrNotFound", err)
	}
}
