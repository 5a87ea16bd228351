package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

type report struct {
	Body string `json:"body"`
}

func (report) Kind() string { return "report" }

// overviewCost is what three loads of the overview cost over 60 jobs whose
// args are argBytes each (20 Failed, 20 Scheduled, 20 Enqueued): the
// AWS requests, the units (Query and Scan read units counted), and the
// last page and the day's.
type overviewCost struct {
	dynamo, sqs []string
	units       awstest.Units
	page, day   string
}

func loadOverview(t *testing.T, argBytes int) overviewCost {
	t.Helper()
	e := awstest.New(t, nil)
	ctx := context.Background()
	store := e.Client.Store()
	args := report{Body: strings.Repeat("r", argBytes)}
	for i := range 60 {
		var o *enqueue.Opts
		if i%3 == 1 {
			o = &enqueue.Opts{Delay: time.Hour}
		}
		res, err := e.Client.Enqueue(ctx, args, o)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			rec, err := store.Claim(ctx, res.ID, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "no data", Began: ledger.Millis(rec.UpdatedAt)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := e.Cfg.Copy()
	m := awstest.NewMeter(&cfg, e.DB).Queries()
	a, err := admin.New(settings.Settings{AWS: cfg, Table: e.Table, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	var c overviewCost
	// The page reloads itself every 10 s; its charts' day is a load too.
	for _, path := range []string{"/", "/?window=day", "/"} {
		code, page := get(t, client(t), srv.URL+path)
		if code != http.StatusOK {
			t.Fatalf("overview %s: %d\n%s", path, code, page)
		}
		if path == "/" {
			c.page = page
		} else {
			c.day = page
		}
	}
	for _, call := range m.Calls() {
		switch {
		case strings.HasPrefix(call, "DynamoDB."):
			c.dynamo = append(c.dynamo, call)
		case strings.HasPrefix(call, "SQS."):
			c.sqs = append(c.sqs, call)
		}
	}
	c.units = m.Units()
	return c
}

// TestOverviewCostDoesNotGrowWithArgs (issue 38 item 18): the overview
// Scanned the whole table, args included, on every load, and reloads
// every 10 s: 3 loads over 60 jobs of 60 KB were 12 Scans billed for
// every byte of every job. It now reads the byState index only (one Scan
// of its entries, which hold no args): over the same jobs with args of
// 100 bytes and of 60 KB it makes the same requests, one Scan of the
// index a load, and the same read units, a few per load; it shows the
// indexed states' counts by kind and their ends in the last hour, and
// says which states the index does not hold (here Enqueued, Processing,
// Succeeded), with a link that counts them by scanning the table.
//
// Its charts (issue 41 item 9) are drawn from the same loads: the ends
// that Scan read, the queues' depths in the same GetQueueAttributes (the
// job queue's and the DLQ's, two a load); a load of the day's chart
// (?window=day) costs what the hour's does.
func TestOverviewCostDoesNotGrowWithArgs(t *testing.T) {
	t.Parallel()
	small, large := loadOverview(t, 100), loadOverview(t, 60<<10)
	if !slices.Equal(small.dynamo, large.dynamo) || small.units.Read != large.units.Read {
		t.Fatalf("the overview's 3 loads: %d requests %v, %g read units with args of 60 KB; %d requests %v, %g read units with args of 100 B: its cost grows with the args",
			len(large.dynamo), large.dynamo, large.units.Read, len(small.dynamo), small.dynamo, small.units.Read)
	}
	if want := slices.Repeat([]string{"SQS.GetQueueAttributes"}, 6); !slices.Equal(small.sqs, want) || !slices.Equal(large.sqs, want) {
		t.Errorf("the overview's 3 loads made %v (args of 100 B) and %v (60 KB) of SQS; want two GetQueueAttributes a load", small.sqs, large.sqs)
	}
	for _, page := range []string{large.page, large.day} {
		for _, want := range []string{
			`<svg id="ends"`, `>Failed 20</li>`, `>Succeeded: not counted (not in the byState index)</li>`,
			`<title>report: 20 ended, 20 runs; run time p50 `,
			`<svg id="queues"`, `<g class="bar"><title>default: `, // its figures move with the messages' 1 s hops
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the overview's charts lack %q:\n%s", want, page)
			}
		}
	}
	if want := []string{"DynamoDB.Scan", "DynamoDB.Scan", "DynamoDB.Scan"}; !slices.Equal(large.dynamo, want) {
		t.Errorf("the overview's 3 loads made %v; want one Scan of the index each", large.dynamo)
	}
	// 40 index entries of a few hundred bytes: 4 KB to 16 KB, 0.5 to 2
	// read units a load.
	if large.units.Read < 3*0.5 || large.units.Read > 3*2 {
		t.Errorf("the overview's 3 loads: %g read units; want 0.5 to 2 a load (40 index entries)", large.units.Read)
	}
	for _, want := range []string{
		`<a href="/jobs?state=Failed&amp;kind=report">20</a>`,
		`<a href="/jobs?state=Scheduled&amp;kind=report">20</a>`,
		"Ended in the last hour: Succeeded not indexed, 20 Failed, 0 Expired.",
		`href="/?count=scan"`,
	} {
		if !strings.Contains(large.page, want) {
			t.Errorf("the overview lacks %q:\n%s", want, large.page)
		}
	}
	if n := strings.Count(large.page, `title="not in the byState index"`); n != 3 {
		t.Errorf("%d cells say not indexed; want Enqueued's, Processing's and Succeeded's", n)
	}
	if !strings.Contains(large.page, `<meta http-equiv="refresh" content="10">`) {
		t.Errorf("the overview does not reload itself:\n%s", large.page)
	}
}

// TestOverviewCountsByScanOnlyWhenAsked: the overview's link counts every
// state by a Scan of the table, once: the page says so and does not
// reload itself.
func TestOverviewCountsByScanOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	if _, err := r.e.Client.Enqueue(context.Background(), invoice{Customer: "eve@example.com"}, nil); err != nil {
		t.Fatal(err)
	}
	code, page := get(t, client(t), r.srv.URL+"/?count=scan")
	if code != http.StatusOK {
		t.Fatalf("%d\n%s", code, page)
	}
	for _, want := range []string{
		`<a href="/jobs?state=Enqueued&amp;kind=invoice">1</a>`, `<a href="/jobs?state=Failed&amp;kind=invoice">1</a>`,
		"Ended in the last hour: 0 Succeeded, 1 Failed, 0 Expired.", `id="counted"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the counted page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, `http-equiv="refresh"`) || strings.Contains(page, "not in the byState index") {
		t.Errorf("the counted page reloads itself or leaves states uncounted:\n%s", page)
	}
}
