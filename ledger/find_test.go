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

// TestFind pages through an indexed state (a Query) and a scanned one
// with a limit smaller than the result, a kind filter and a time window:
// every match once, none other; a withdrawn job is Failed and marked.
func TestFind(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var now atomic.Int64
	now.Store(time.Unix(2_000_000_000, 0).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s, err := ledger.New(e.DB, e.Table, &ledger.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	insert := func(kind string) ledger.Record {
		rec, _, err := s.Insert(ctx, ledger.Record{Kind: kind, Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "", ledger.AllowAfterFailed, nil)
		if err != nil {
			t.Fatal(err)
		}
		now.Add(int64(time.Second))
		return rec
	}
	want := map[ledger.State]map[string]bool{ledger.Failed: {}, ledger.Enqueued: {}}
	start := clock()
	for i := range 7 {
		kind := "a"
		if i%3 == 2 {
			kind = "b"
		}
		rec := insert(kind)
		if rec, err = s.Claim(ctx, rec.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "boom"}); err != nil {
			t.Fatal(err)
		}
		if kind == "a" {
			want[ledger.Failed][rec.ID] = true
		}
	}
	now.Add(int64(time.Second))
	mid := clock()
	for range 5 {
		want[ledger.Enqueued][insert("a").ID] = true
	}
	cancelled := insert("a")
	if rec, ok, err := s.Withdraw(ctx, cancelled.ID, "not wanted", time.Time{}); err != nil || !ok || rec.State != ledger.Failed || !rec.Cancelled {
		t.Fatalf("withdraw: %+v %v %v", rec, ok, err)
	}
	if rec, ok, err := s.Withdraw(ctx, cancelled.ID, "again", time.Time{}); err != nil || ok || rec.LastError != "not wanted" {
		t.Fatalf("second withdraw: %+v %v %v; want refused, nothing written", rec, ok, err)
	}
	want[ledger.Failed][cancelled.ID] = true

	for st, ids := range want {
		seen := map[string]bool{}
		f := ledger.Filter{State: st, Kind: "a", Limit: 2}
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatalf("%s: the cursor did not end", st)
			}
			recs, next, err := s.Find(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > 2 {
				t.Fatalf("%s: page of %d, limit 2", st, len(recs))
			}
			for _, r := range recs {
				if !ids[r.ID] || seen[r.ID] {
					t.Fatalf("%s: %s (kind %s, %s) listed wrongly or twice", st, r.ID, r.Kind, r.State)
				}
				seen[r.ID] = true
			}
			if next == "" {
				break
			}
			f.Cursor = next
		}
		if len(seen) != len(ids) {
			t.Fatalf("%s: listed %d of %d jobs", st, len(seen), len(ids))
		}
	}
	// The window: jobs changed in [start, mid) are the seven that failed.
	recs, _, err := s.Find(ctx, ledger.Filter{State: ledger.Failed, Since: start, Until: mid})
	if err != nil || len(recs) != 7 {
		t.Fatalf("window: %d records, %v; want the 7 failed ones", len(recs), err)
	}
	counts, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts[ledger.Failed]["a"] != 6 || counts[ledger.Failed]["b"] != 2 || counts[ledger.Enqueued]["a"] != 5 {
		t.Fatalf("counts %v", counts)
	}
	if _, _, err := s.Find(ctx, ledger.Filter{State: "Done"}); err == nil {
		t.Fatal("an unknown state was accepted")
	}
	if _, _, err := s.Find(ctx, ledger.Filter{State: ledger.Failed, Cursor: "not-a-cursor"}); !errors.Is(err, ledger.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}
