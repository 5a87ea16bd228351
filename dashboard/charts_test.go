package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

// thumbnail fails for good when N%3 == 0, once (then succeeds on its
// retry) when N%3 == 1, and succeeds otherwise.
type thumbnail struct{ N int }

func (thumbnail) Kind() string { return "thumbnail" }

// email fails for good when sent to "bounce".
type email struct{ To string }

func (email) Kind() string { return "email" }

// chartRig runs thumbnails and emails on a deployment that indexes every
// state, in two batches three minutes apart, and serves a dashboard on
// the Env's clock. It returns the ended jobs' ids.
func chartRig(t *testing.T) (*nexjobtest.Env, *httptest.Server, []string) {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{IndexAllStates: true}})
	ctx := context.Background()
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[thumbnail](func(ctx context.Context, j *handler.Job[thumbnail]) error {
		switch {
		case j.Args.N%3 == 0:
			return handler.Permanent(errors.New("unreadable image"))
		case j.Args.N%3 == 1 && j.Attempt == 1:
			return errors.New("store busy")
		}
		return nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[email](func(ctx context.Context, j *handler.Job[email]) error {
		switch j.Args.To {
		case "bounce":
			return handler.Permanent(errors.New("mailbox unavailable"))
		case "bob": // a run of 90 s on the Env's clock
			e.Advance(t, 90*time.Second)
		}
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	var ids []string
	add := func(args enqueue.JobArgs) string {
		t.Helper()
		res, err := e.Client.Enqueue(ctx, args, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
		return res.ID
	}
	// Batch 1: thumbnails 0-3 (0 and 3 fail, 1 is retried), two emails,
	// and one email cancelled before it runs.
	for n := range 4 {
		add(thumbnail{N: n})
	}
	add(email{To: "ada"})
	add(email{To: "bob"})
	withdrawn := add(email{To: "eve"})
	if _, err := e.Client.Cancel(ctx, withdrawn, "", handler.DefaultRetention.Failed); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	// Batch 2, three minutes on: thumbnails 4 (retried) and 5, a bounce.
	e.Advance(t, 3*time.Minute)
	add(thumbnail{N: 4})
	add(thumbnail{N: 5})
	add(email{To: "bounce"})
	e.Drain(t, h)

	srv := serveAllStates(t, e)
	return e, srv, ids
}

// serveAllStates serves a read-only dashboard on e's tables, which index
// every state, at e's clock.
func serveAllStates(t *testing.T, e *nexjobtest.Env) *httptest.Server {
	t.Helper()
	a, err := admin.New(settings.Settings{AWS: e.Cfg, Table: e.Table, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention, IndexAllStates: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet, Now: e.Now}))
	t.Cleanup(srv.Close)
	return srv
}

// series is the chart series a job's end is drawn in.
func series(r ledger.Record) string {
	if r.State == ledger.Failed && r.Cancelled {
		return "Cancelled"
	}
	return string(r.State)
}

// wantBars are the ends chart's bar titles for these records, by steps
// of step: "15:04: 2 Succeeded, 1 Failed", oldest first.
func wantBars(recs []ledger.Record, step time.Duration) []string {
	counts := map[time.Time]map[string]int{}
	for _, r := range recs {
		at := ledger.Millis(r.UpdatedAt).UTC().Truncate(step)
		if counts[at] == nil {
			counts[at] = map[string]int{}
		}
		counts[at][series(r)]++
	}
	var bars []string
	for _, at := range slices.SortedFunc(maps.Keys(counts), time.Time.Compare) {
		var parts []string
		for _, s := range []string{"Succeeded", "Failed", "Cancelled", "Expired"} {
			if n := counts[at][s]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, s))
			}
		}
		bars = append(bars, at.Format("15:04")+": "+strings.Join(parts, ", "))
	}
	return bars
}

var barRE = regexp.MustCompile(`<g class="bar"><title>([^<]*)</title>`)

// svg is the page's SVG of this id, from its start tag to its end.
func svg(t *testing.T, page, id string) string {
	t.Helper()
	i := strings.Index(page, `<svg id="`+id+`"`)
	if i < 0 {
		t.Fatalf("the page has no svg#%s:\n%s", id, page)
	}
	j := strings.Index(page[i:], "</svg>")
	return page[i : i+j]
}

func bars(t *testing.T, page, id string) []string {
	t.Helper()
	var out []string
	for _, m := range barRE.FindAllStringSubmatch(svg(t, page, id), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestOverviewChartsMatchWhatRan (issue 41 item 9): two kinds of jobs,
// some failing, one retried, one cancelled, run in two batches three
// minutes apart; the overview's charts say what ran: the ends per minute
// (and per hour over the day) by state, each bar where the records' ends
// put it; per kind the jobs ended and the runs they spent (counted by
// hand: thumbnails 6 ended, 8 runs; emails 4 ended, 3 runs); the queue's
// visible and delayed messages; and the job waiting to start.
func TestOverviewChartsMatchWhatRan(t *testing.T) {
	t.Parallel()
	e, srv, ids := chartRig(t)
	var recs []ledger.Record
	for _, id := range ids {
		r := e.Get(t, id)
		if !r.State.Terminal() {
			t.Fatalf("job %s (%s) is %s after the drains", id, r.Kind, r.State)
		}
		recs = append(recs, r)
	}
	// Something waiting: a job not run, and a message delayed 15 minutes.
	if _, err := e.Client.Enqueue(context.Background(), email{To: "later"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String("{}"), DelaySeconds: 900}); err != nil {
		t.Fatal(err)
	}

	code, page := get(t, client(t), srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	if got, want := bars(t, page, "ends"), wantBars(recs, time.Minute); !slices.Equal(got, want) {
		t.Errorf("the per-minute bars say %q; the records' ends say %q", got, want)
	}
	for _, want := range []string{
		">Succeeded 6</li>", ">Failed 3</li>", ">Cancelled 1</li>", ">Expired 0</li>", // by hand: 4+2, 2+1, 1, 0
		"<g class=\"bar\"><title>default: 1 visible, 0 in flight, 1 delayed</title>",
		`<p id="waiting">Oldest job waiting to start: due `,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the overview lacks %q:\n%s", want, page)
		}
	}
	kinds := bars(t, page, "kinds")
	if len(kinds) != 2 || !strings.HasPrefix(kinds[0], "email: 4 ended, 3 runs; run time p50 ") ||
		!strings.HasPrefix(kinds[1], "thumbnail: 6 ended, 8 runs; run time p50 ") {
		t.Errorf("the kinds chart says %q; want email 4 ended 3 runs, thumbnail 6 ended 8 runs, with their times", kinds)
	}
	// Every job that ran is timed; the cancelled email never ran.
	if !strings.Contains(kinds[0], "(3 timed)") || !strings.Contains(kinds[1], "(6 timed)") {
		t.Errorf("timed ends: %q; want 3 emails (not the cancelled one) and 6 thumbnails", kinds)
	}
	// A run time is the last run's, from its start (the record's RunAt)
	// to the end: bob's run took 90 s, the retried thumbnails' last runs
	// began after their first ended, a job no run ended keeps no start.
	for _, r := range recs {
		var a email
		_ = json.Unmarshal([]byte(r.Args), &a)
		hist := r.Attempts() // the record's ring of the last runs' ends, in slot order
		slices.SortFunc(hist, func(a, b ledger.Attempt) int { return a.N - b.N })
		switch {
		case r.Cancelled:
			if r.RunAt != 0 {
				t.Errorf("job %s, cancelled before it ran, keeps RunAt %d; want none", r.ID, r.RunAt)
			}
		case r.RunAt == 0 || r.RunAt > r.UpdatedAt:
			t.Errorf("job %s (%s) ended at %d with RunAt %d; want its last run's start", r.ID, r.Kind, r.UpdatedAt, r.RunAt)
		case a.To == "bob" && r.UpdatedAt-r.RunAt < (90*time.Second).Milliseconds():
			t.Errorf("bob's run took 90 s on the Env's clock; its record says %d ms", r.UpdatedAt-r.RunAt)
		case len(hist) > 1 && r.RunAt < hist[len(hist)-2].At:
			t.Errorf("job %s (%s) last run began at %d, before its first ended (%d): created %d, updated %d, history %+v", r.ID, r.Kind, r.RunAt, hist[len(hist)-2].At, r.CreatedAt, r.UpdatedAt, hist)
		}
	}
	if m := regexp.MustCompile(`p95 ([0-9hms.]+)`).FindStringSubmatch(kinds[0]); m == nil {
		t.Errorf("the emails' p95 is missing: %q", kinds[0])
	} else if d, err := time.ParseDuration(m[1]); err != nil || d < 90*time.Second {
		t.Errorf("the emails' p95 run time is %q; want bob's 90 s or more", m[1])
	}

	code, page = get(t, client(t), srv.URL+"/?window=day")
	if code != http.StatusOK {
		t.Fatalf("overview by day: %d\n%s", code, page)
	}
	if got, want := bars(t, page, "ends"), wantBars(recs, time.Hour); !slices.Equal(got, want) {
		t.Errorf("the per-hour bars say %q; the records' ends say %q", got, want)
	}
	if !strings.Contains(page, "Jobs ended per hour, last day") || !strings.Contains(page, ">Succeeded 6</li>") {
		t.Errorf("the day's chart lacks its title or its 6 Succeeded:\n%s", svg(t, page, "ends"))
	}
	if code, page := get(t, client(t), srv.URL+"/?window=week"); code != http.StatusBadRequest || !strings.Contains(page, `window &#34;week&#34; is not hour or day`) {
		t.Errorf("?window=week: %d\n%s", code, page)
	}
}

// TestCancelledJobKeepsItsDueTimeAndIsNotTimed: a job cancelled while
// Scheduled (due in an hour) keeps its due time as RunAt (Cancel removes a
// far job's schedule by it), and the run times leave it out: it never ran.
func TestCancelledJobKeepsItsDueTimeAndIsNotTimed(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{IndexAllStates: true}})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, email{To: "later"}, &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	due := e.Get(t, res.ID).RunAt
	if _, err := e.Client.Cancel(ctx, res.ID, "", handler.DefaultRetention.Failed); err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, res.ID); rec.State != ledger.Failed || !rec.Cancelled || rec.RunAt != due || due == 0 {
		t.Errorf("cancelled: %s (cancelled %v) with RunAt %d; want Failed, cancelled, its due time %d", rec.State, rec.Cancelled, rec.RunAt, due)
	}
	srv := serveAllStates(t, e)
	code, page := get(t, client(t), srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	if kinds := bars(t, page, "kinds"); len(kinds) != 1 || !strings.HasPrefix(kinds[0], "email: 1 ended, 0 runs") || strings.Contains(kinds[0], "timed") {
		t.Errorf("the kinds chart says %q; want the cancelled email ended, not timed", kinds)
	}
}
