package dashboard

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/ledger"
)

// The overview's charts are inline SVG drawn here, on the server, from
// what one load already read (admin.OverviewSince: the byState index's
// entries, the queues' attributes): no script, no request more, and
// their colours are the stylesheet's (each shape has a class, never a
// style). Each chart has a <title> and a <desc> that say its figures in
// words, each bar a <title> with its own, and an HTML legend.

// span is what the ends chart covers: the last hour by minutes or the
// last day by hours (?window=day).
type span struct {
	Name  string // "hour" or "day"
	Step  time.Duration
	Steps int
	Per   string // "minute" or "hour"
	Label string // the bars' time format
}

var spans = map[string]span{
	"hour": {Name: "hour", Step: time.Minute, Steps: 60, Per: "minute", Label: "15:04"},
	"day":  {Name: "day", Step: time.Hour, Steps: 24, Per: "hour", Label: "15:04"},
}

// start is the start of the span's first step, the last step being the
// one now falls in (steps aligned to the clock: a minute starts at :00).
func (sp span) start(now time.Time) time.Time {
	return now.UTC().Truncate(sp.Step).Add(-time.Duration(sp.Steps-1) * sp.Step)
}

// endSeries are the ends chart's series, bottom up: a cancelled job is
// Failed with its Cancelled mark, drawn apart.
var endSeries = []string{"Succeeded", "Failed", "Cancelled", "Expired"}

// seriesOf is the series an end is drawn in.
func seriesOf(e ledger.End) string {
	if e.State == ledger.Failed && e.Cancelled {
		return "Cancelled"
	}
	return string(e.State)
}

// seriesState is the state whose indexing decides whether a series is
// counted.
func seriesState(series string) ledger.State {
	if series == "Cancelled" {
		return ledger.Failed
	}
	return ledger.State(series)
}

// bucketEnds counts the ends by series in steps of step from start:
// counts[series][i] are those with start+i·step <= At < start+(i+1)·step,
// for i below steps. Ends outside are left out.
func bucketEnds(ends []ledger.End, start time.Time, step time.Duration, steps int) map[string][]int {
	counts := map[string][]int{}
	for _, s := range endSeries {
		counts[s] = make([]int, steps)
	}
	from, width := start.UnixMilli(), step.Milliseconds()
	for _, e := range ends {
		if e.At < from {
			continue
		}
		i := int((e.At - from) / width)
		c := counts[seriesOf(e)]
		if c == nil || i >= steps {
			continue
		}
		c[i]++
	}
	return counts
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, ascending: its smallest value with at least p % of the values
// at or below it. None: 0.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ⌈p·n/100⌉
	return sorted[max(rank, 1)-1]
}

// kindFigures are one kind's ends in the window.
type kindFigures struct {
	Kind        string
	Ended, Runs int
	Timed       int           // ends with a time to end (P50, P95)
	P50, P95    time.Duration // of the last run's duration
}

// runTime is how long an end's last run took, from its start to the
// job's end, and whether the record says: a job that never ran, or that
// no run of its own ended (dead-lettered, an orphan), keeps no start
// (ledger.End.Began), and a cancelled one keeps its due time.
func runTime(e ledger.End) (time.Duration, bool) {
	if e.Runs == 0 || e.Cancelled || e.State == ledger.Expired || e.Began == 0 || e.At < e.Began {
		return 0, false
	}
	return time.Duration(e.At-e.Began) * time.Millisecond, true
}

// byKind sums the ends at or after from by kind, in kind order.
func byKind(ends []ledger.End, from time.Time) []kindFigures {
	figs := map[string]*kindFigures{}
	times := map[string][]time.Duration{}
	for _, e := range ends {
		if e.At < from.UnixMilli() {
			continue
		}
		f := figs[e.Kind]
		if f == nil {
			f = &kindFigures{Kind: e.Kind}
			figs[e.Kind] = f
		}
		f.Ended++
		f.Runs += e.Runs
		if d, ok := runTime(e); ok {
			times[e.Kind] = append(times[e.Kind], d)
		}
	}
	out := make([]kindFigures, 0, len(figs))
	for k, f := range figs {
		ds := times[k]
		slices.Sort(ds)
		f.Timed, f.P50, f.P95 = len(ds), percentile(ds, 50), percentile(ds, 95)
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b kindFigures) int { return strings.Compare(a.Kind, b.Kind) })
	return out
}

// niceMax is the axis's top for a largest value n: the least of 1, 2, 5,
// 10, 20, 50 … at or above it.
func niceMax(n int) int {
	for m := 1; ; m *= 10 {
		for _, k := range []int{1, 2, 5} {
			if k*m >= n {
				return k * m
			}
		}
	}
}

// short says a duration for a chart: "850ms", "12.3s", "4m5s".
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// chart is one SVG: its size, its words, its shapes.
type chart struct {
	ID, Title, Desc string
	W, H            int
	Groups          []group
	Labels          []label
	Lines           []line
	Legend          []legendItem
}

// group is a bar, or a row of bars, with its words (its <title>).
type group struct {
	Title string
	Rects []rect
}

type rect struct {
	X, Y, W, H int
	Class      string
}

type label struct {
	X, Y   int
	Anchor string // start, middle, end
	Text   string
}

type line struct{ X1, Y1, X2, Y2 int }

type legendItem struct {
	Class, Text string
}

// Geometry of the ends chart: the plot's left edge, its height, its top.
const (
	plotLeft   = 44
	plotTop    = 10
	plotHeight = 150
	plotWidth  = 600
)

// endsChart draws the ends per step, stacked by series, over sp up to
// now; series whose state st does not count are named in the legend as
// not counted.
func endsChart(st admin.Stats, sp span, now time.Time) chart {
	start := sp.start(now)
	counts := bucketEnds(st.Ends, start, sp.Step, sp.Steps)
	totals, most := make([]int, sp.Steps), 0
	sums := map[string]int{}
	for _, s := range endSeries {
		for i, n := range counts[s] {
			totals[i] += n
			sums[s] += n
			most = max(most, totals[i])
		}
	}
	top := niceMax(most)
	slot := plotWidth / sp.Steps
	c := chart{ID: "ends", W: plotLeft + plotWidth + 24, H: plotTop + plotHeight + 24,
		Title: fmt.Sprintf("Jobs ended per %s, last %s", sp.Per, sp.Name)}
	var said, uncounted []string
	for _, s := range endSeries {
		if !st.IsCounted(seriesState(s)) {
			uncounted = append(uncounted, s)
			c.Legend = append(c.Legend, legendItem{Class: s, Text: s + ": not counted (not in the byState index)"})
			continue
		}
		said = append(said, fmt.Sprintf("%d %s", sums[s], s))
		c.Legend = append(c.Legend, legendItem{Class: s, Text: fmt.Sprintf("%s %d", s, sums[s])})
	}
	c.Desc = fmt.Sprintf("From %s to %s UTC: %s.", start.Format("2006-01-02 15:04"), start.Add(time.Duration(sp.Steps)*sp.Step).Format("15:04"), strings.Join(said, ", "))
	if len(uncounted) > 0 {
		c.Desc += " Not counted: " + strings.Join(uncounted, ", ") + "."
	}
	base := plotTop + plotHeight
	for i := range sp.Steps {
		if totals[i] == 0 {
			continue
		}
		g := group{}
		var parts []string
		y := base
		for _, s := range endSeries {
			n := counts[s][i]
			if n == 0 {
				continue
			}
			h := n * plotHeight / top
			g.Rects = append(g.Rects, rect{X: plotLeft + i*slot + 1, Y: y - h, W: max(slot-2, 1), H: h, Class: s})
			y -= h
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
		g.Title = start.Add(time.Duration(i)*sp.Step).Format(sp.Label) + ": " + strings.Join(parts, ", ")
		c.Groups = append(c.Groups, g)
	}
	c.Lines = []line{{plotLeft, base, plotLeft + plotWidth, base}, {plotLeft, plotTop, plotLeft, base}}
	c.Labels = []label{
		{X: plotLeft - 4, Y: plotTop + 4, Anchor: "end", Text: fmt.Sprint(top)},
		{X: plotLeft - 4, Y: base, Anchor: "end", Text: "0"},
	}
	for _, i := range []int{0, sp.Steps / 2, sp.Steps - 1} {
		c.Labels = append(c.Labels, label{X: plotLeft + i*slot + slot/2, Y: base + 16, Anchor: "middle", Text: start.Add(time.Duration(i) * sp.Step).Format(sp.Label)})
	}
	return c
}

// queueRow is one queue's depth.
type queueRow struct {
	Name                       string
	Visible, InFlight, Delayed int
}

// Geometry of the row charts (queues, kinds): the heading's height, a
// row's, the names' column, the bars' width.
const (
	headHeight = 20
	rowHeight  = 24
	nameWidth  = 150
	barsWidth  = 260
)

// queuesChart draws each queue's depth: visible, in flight, delayed.
func queuesChart(st admin.Stats) chart {
	rows := []queueRow{{"default", st.Queued, st.InFlight, st.Delayed}}
	for _, q := range st.Queues {
		rows = append(rows, queueRow{q.Name, q.Queued, q.InFlight, q.Delayed})
	}
	most := 0
	for _, r := range rows {
		most = max(most, r.Visible+r.InFlight+r.Delayed)
	}
	top := niceMax(most)
	c := chart{ID: "queues", Title: "Messages per queue: visible, in flight, delayed", W: nameWidth + barsWidth + 230, H: headHeight + len(rows)*rowHeight + 4,
		Legend: []legendItem{{"q-visible", "visible (waiting for a worker)"}, {"q-inflight", "in flight (received, not yet deleted)"}, {"q-delayed", "delayed (not yet visible)"}}}
	c.Labels = []label{{X: nameWidth, Y: 14, Anchor: "start", Text: "messages"}, {X: nameWidth + barsWidth + 8, Y: 14, Anchor: "start", Text: "visible · in flight · delayed"}}
	var said []string
	for i, r := range rows {
		y := headHeight + i*rowHeight
		words := fmt.Sprintf("%s: %d visible, %d in flight, %d delayed", r.Name, r.Visible, r.InFlight, r.Delayed)
		said = append(said, words)
		g := group{Title: words}
		x := nameWidth
		for _, part := range []struct {
			n     int
			class string
		}{{r.Visible, "q-visible"}, {r.InFlight, "q-inflight"}, {r.Delayed, "q-delayed"}} {
			if part.n == 0 {
				continue
			}
			w := max(part.n*barsWidth/top, 1)
			g.Rects = append(g.Rects, rect{X: x, Y: y, W: w, H: rowHeight - 8, Class: part.class})
			x += w
		}
		c.Groups = append(c.Groups, g)
		c.Labels = append(c.Labels, label{X: nameWidth - 6, Y: y + 12, Anchor: "end", Text: r.Name},
			label{X: nameWidth + barsWidth + 8, Y: y + 12, Anchor: "start", Text: fmt.Sprintf("%d · %d · %d", r.Visible, r.InFlight, r.Delayed)})
	}
	c.Desc = strings.Join(said, "; ") + "."
	return c
}

// kindsChart draws each kind's ends in the window: its runs, and the p50
// and p95 of their last runs' durations.
func kindsChart(kinds []kindFigures, sp span) chart {
	mostRuns, longest := 0, time.Duration(0)
	for _, k := range kinds {
		mostRuns, longest = max(mostRuns, k.Runs), max(longest, k.P95)
	}
	top := niceMax(mostRuns)
	half := barsWidth / 2
	c := chart{ID: "kinds", Title: fmt.Sprintf("Runs per kind and run time (p50, p95), last %s", sp.Name),
		W: nameWidth + 2*barsWidth + 120, H: headHeight + max(len(kinds), 1)*rowHeight + 4,
		Legend: []legendItem{{"k-runs", "runs (attempts spent by the jobs that ended)"}, {"k-p50", "p50 run time (the last run of each job)"}, {"k-p95", "p95"}}}
	durX := nameWidth + half + 70
	c.Labels = []label{{X: nameWidth, Y: 14, Anchor: "start", Text: "runs"}, {X: durX, Y: 14, Anchor: "start", Text: "run time: p50 (bar) · p95 (mark)"}}
	var said []string
	for i, k := range kinds {
		y := headHeight + i*rowHeight
		words := fmt.Sprintf("%s: %d ended, %d runs", k.Kind, k.Ended, k.Runs)
		if k.Timed > 0 {
			words += fmt.Sprintf("; run time p50 %s, p95 %s (%d timed)", short(k.P50), short(k.P95), k.Timed)
		}
		said = append(said, words)
		g := group{Title: words}
		if k.Runs > 0 {
			g.Rects = append(g.Rects, rect{X: nameWidth, Y: y, W: max(k.Runs*half/top, 1), H: rowHeight - 8, Class: "k-runs"})
		}
		durs := ""
		if k.Timed > 0 && longest > 0 {
			g.Rects = append(g.Rects, rect{X: durX, Y: y, W: max(int(int64(k.P50)*int64(barsWidth)/int64(longest)), 1), H: rowHeight - 8, Class: "k-p50"},
				rect{X: durX + max(int(int64(k.P95)*int64(barsWidth)/int64(longest)), 2) - 2, Y: y - 2, W: 2, H: rowHeight - 4, Class: "k-p95"})
			durs = short(k.P50) + " · " + short(k.P95)
		}
		c.Groups = append(c.Groups, g)
		c.Labels = append(c.Labels, label{X: nameWidth - 6, Y: y + 12, Anchor: "end", Text: k.Kind},
			label{X: nameWidth + half + 6, Y: y + 12, Anchor: "start", Text: fmt.Sprint(k.Runs)},
			label{X: durX + barsWidth + 6, Y: y + 12, Anchor: "start", Text: durs})
	}
	if len(kinds) == 0 {
		c.Labels = append(c.Labels, label{X: nameWidth, Y: headHeight + 12, Anchor: "start", Text: "no job ended in the last " + sp.Name})
		said = []string{"no job ended in the last " + sp.Name}
	}
	c.Desc = strings.Join(said, "; ") + "."
	return c
}
