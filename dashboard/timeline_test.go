package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

type tlParent struct{}

func (tlParent) Kind() string { return "tl-parent" }

type tlKid struct{}

func (tlKid) Kind() string { return "tl-kid" }

// TestJobPageShowsTheTimeline (issue 39 item 11): a durable job's page
// lists its steps (a name with markup, escaped), its child with its state
// and its end; the values only with ?steps=1, escaped.
func TestJobPageShowsTheTimeline(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[tlParent](func(ctx context.Context, j *handler.Job[tlParent]) error {
		if _, err := handler.Step(ctx, "<b>charge</b>", func(context.Context) (string, error) { return "</pre><script>x()</script>", nil }); err != nil {
			return err
		}
		_, err := handler.Invoke[int](ctx, "ship", tlKid{}, nil)
		return err
	}), nil)
	handler.AddWorkerResult(reg, handler.ResultFunc[tlKid, int](func(context.Context, *handler.Job[tlKid]) (int, error) { return 1, nil }), nil)
	res, err := e.Client.Enqueue(context.Background(), tlParent{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, e.Handler(t, reg, &handler.Options{Logger: quiet}))
	e.RequireState(t, res.ID, ledger.Succeeded)
	a, err := admin.New(settings.Settings{AWS: e.Cfg, Table: e.Table, StepsTable: e.StepsTable, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	c := client(t)
	code, page := get(t, c, srv.URL+"/jobs/"+res.ID)
	for _, want := range []string{`<table id="timeline">`, `step &#34;&lt;b&gt;charge&lt;/b&gt;&#34;`, `child &#34;ship&#34; started: job `, `(Succeeded)`, ` ended Succeeded`, `steps table`, `id="showSteps"`} {
		if code != http.StatusOK || !strings.Contains(page, want) {
			t.Fatalf("job page: %d, want %s in it\n%s", code, want, page)
		}
	}
	if strings.Contains(page, "x()") || strings.Contains(page, "<b>") {
		t.Fatalf("job page without ?steps=1 shows a value, or markup:\n%s", page)
	}
	_, page = get(t, c, srv.URL+"/jobs/"+res.ID+"?steps=1")
	if strings.Contains(page, "<script>") || !strings.Contains(page, `\u003cscript\u003ex()`) {
		t.Fatalf("job page with ?steps=1: a value missing or not escaped:\n%s", page)
	}
}
