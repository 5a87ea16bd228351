package dashboard

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/ledger"
)

var noon = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) int64 { return noon.Add(d).UnixMilli() }

func secs(ns ...int) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n) * time.Second
	}
	return out
}

// TestPercentileIsNearestRank: the p-th percentile of n sorted values is
// the ⌈p·n/100⌉-th, worked by hand below.
func TestPercentileIsNearestRank(t *testing.T) {
	for _, c := range []struct {
		values []time.Duration
		p      int
		want   time.Duration
	}{
		{nil, 50, 0},
		{secs(7), 50, 7 * time.Second},
		{secs(7), 95, 7 * time.Second},
		{secs(1, 2, 3), 50, 2 * time.Second},    // ⌈1.5⌉ = 2nd
		{secs(1, 2, 3), 95, 3 * time.Second},    // ⌈2.85⌉ = 3rd
		{secs(1, 2, 3), 1, 1 * time.Second},     // ⌈0.03⌉ = 1st
		{secs(1, 2, 3, 4), 50, 2 * time.Second}, // ⌈2⌉ = 2nd, not the mean of 2 and 3
		{secs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 50, 5 * time.Second},
		{secs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 95, 10 * time.Second}, // ⌈9.5⌉ = 10th
		{secs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 95, 19 * time.Second},
		{secs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 100, 20 * time.Second},
	} {
		if got := percentile(c.values, c.p); got != c.want {
			t.Errorf("p%d of %v = %v; want %v", c.p, c.values, got, c.want)
		}
	}
}

// TestBucketEndsByStep: an end falls in the step that holds it, its start
// included and its end not; ends before the first step or after the last
// are left out; a cancelled Failed job is drawn as Cancelled.
func TestBucketEndsByStep(t *testing.T) {
	ends := []ledger.End{
		{State: ledger.Succeeded, At: at(0)},                              // step 0, its first instant
		{State: ledger.Succeeded, At: at(time.Minute - time.Millisecond)}, // step 0, its last
		{State: ledger.Failed, At: at(time.Minute)},                       // step 1
		{State: ledger.Failed, Cancelled: true, At: at(90 * time.Second)}, // step 1, Cancelled
		{State: ledger.Expired, At: at(3*time.Minute - time.Millisecond)}, // step 2
		{State: ledger.Succeeded, At: at(3 * time.Minute)},                // after the last step
		{State: ledger.Failed, At: at(-time.Millisecond)},                 // before the first
	}
	got := bucketEnds(ends, noon, time.Minute, 3)
	want := map[string][]int{
		"Succeeded": {2, 0, 0},
		"Failed":    {0, 1, 0},
		"Cancelled": {0, 1, 0},
		"Expired":   {0, 0, 1},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("bucketEnds = %v; want %v", got, want)
	}
	// By hours over a day: 11:59:59 is the last instant of the step at 11:00.
	day := bucketEnds([]ledger.End{{State: ledger.Failed, At: at(-time.Second)}, {State: ledger.Failed, At: at(0)}}, noon.Add(-23*time.Hour), time.Hour, 24)
	if f := day["Failed"]; f[22] != 1 || f[23] != 1 {
		t.Errorf("by hours: %v; want one end in step 22 (11:00) and one in step 23 (12:00)", f)
	}
}

// TestSpanStartsOnTheClock: the last step is the one now falls in; the
// hour's steps start on the minute, the day's on the hour.
func TestSpanStartsOnTheClock(t *testing.T) {
	now := noon.Add(34*time.Minute + 56*time.Second)
	if got, want := spans["hour"].start(now), noon.Add(-25*time.Minute); !got.Equal(want) {
		t.Errorf("hour starts %v; want %v (12:34 minus 59 minutes)", got, want)
	}
	if got, want := spans["day"].start(now), noon.Add(-23*time.Hour); !got.Equal(want) {
		t.Errorf("day starts %v; want %v (12:00 minus 23 hours)", got, want)
	}
}

// TestByKindSumsRunsAndRunTimes: runs are the attempts the ended jobs
// spent; the run time runs from Began to At, for jobs whose record kept
// their last run's start.
func TestByKindSumsRunsAndRunTimes(t *testing.T) {
	ends := []ledger.End{
		{Kind: "a", State: ledger.Succeeded, Runs: 1, Began: at(0), At: at(time.Second)},
		{Kind: "a", State: ledger.Succeeded, Runs: 2, Began: at(10 * time.Second), At: at(13 * time.Second)},
		{Kind: "a", State: ledger.Failed, Runs: 3, Began: at(20 * time.Second), At: at(22 * time.Second)},
		{Kind: "a", State: ledger.Failed, Cancelled: true, At: at(time.Hour)},                                          // never ran
		{Kind: "a", State: ledger.Failed, Runs: 2, At: at(time.Hour)},                                                  // an orphan: no start kept
		{Kind: "a", State: ledger.Expired, At: at(time.Hour)},                                                          // never ran
		{Kind: "a", State: ledger.Succeeded, Runs: 1, Continues: true, Began: at(59 * time.Minute), At: at(time.Hour)}, // a continuation's own run
		{Kind: "b", State: ledger.Succeeded, Runs: 1, Began: at(5 * time.Second), At: at(5500 * time.Millisecond)},
		{Kind: "b", State: ledger.Failed, Runs: 4, Began: at(-time.Hour), At: at(-time.Millisecond)}, // before the window
	}
	got := byKind(ends, noon)
	want := []kindFigures{
		{Kind: "a", Ended: 7, Runs: 9, Timed: 4, P50: 2 * time.Second, P95: time.Minute},
		{Kind: "b", Ended: 1, Runs: 1, Timed: 1, P50: 500 * time.Millisecond, P95: 500 * time.Millisecond},
	}
	if !slices.Equal(got, want) {
		t.Errorf("byKind = %+v\nwant %+v", got, want)
	}
}

func TestNiceMax(t *testing.T) {
	for n, want := range map[int]int{0: 1, 1: 1, 2: 2, 3: 5, 5: 5, 6: 10, 11: 20, 21: 50, 51: 100, 101: 200, 999: 1000} {
		if got := niceMax(n); got != want {
			t.Errorf("niceMax(%d) = %d; want %d", n, got, want)
		}
	}
}

// TestEndsChartDrawsStackedBars: over the last hour at 12:34:30, with
// only Failed counted, the 12:33 bar stacks 1 Failed and 1 Cancelled
// (each half of the axis's top, 2) in slot 58, and the legend says
// Succeeded is not counted and how many of the others ended.
func TestEndsChartDrawsStackedBars(t *testing.T) {
	now := noon.Add(34*time.Minute + 30*time.Second)
	st := admin.Stats{Counted: []ledger.State{ledger.Failed, ledger.Expired}, Ends: []ledger.End{
		{State: ledger.Failed, At: at(33*time.Minute + 10*time.Second)},
		{State: ledger.Failed, Cancelled: true, At: at(33*time.Minute + 50*time.Second)},
		{State: ledger.Failed, At: at(34*time.Minute + time.Second)},
	}}
	c := endsChart(st, spans["hour"], now)
	if len(c.Groups) != 2 {
		t.Fatalf("%d bars; want 2: %+v", len(c.Groups), c.Groups)
	}
	g := c.Groups[0]
	// Slot 58 of 10 px from x = 44; the plot's base at y = 160, 150 high.
	wantRects := []rect{{X: 625, Y: 85, W: 8, H: 75, Class: "Failed"}, {X: 625, Y: 10, W: 8, H: 75, Class: "Cancelled"}}
	if g.Title != "12:33: 1 Failed, 1 Cancelled" || !slices.Equal(g.Rects, wantRects) {
		t.Errorf("12:33's bar: %q %+v; want %q %+v", g.Title, g.Rects, "12:33: 1 Failed, 1 Cancelled", wantRects)
	}
	if g := c.Groups[1]; g.Title != "12:34: 1 Failed" || g.Rects[0].H != 75 {
		t.Errorf("12:34's bar: %q %+v", g.Title, g.Rects)
	}
	wantLegend := []legendItem{{"Succeeded", "Succeeded: not counted (not in the byState index)"}, {"Failed", "Failed 2"}, {"Cancelled", "Cancelled 1"}, {"Expired", "Expired 0"}}
	if !slices.Equal(c.Legend, wantLegend) {
		t.Errorf("legend %v; want %v", c.Legend, wantLegend)
	}
	if want := "From 2026-03-14 11:35 to 12:35 UTC: 2 Failed, 1 Cancelled, 0 Expired. Not counted: Succeeded."; c.Desc != want {
		t.Errorf("desc %q; want %q", c.Desc, want)
	}
}
