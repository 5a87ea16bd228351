package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

type signoff struct {
	Month string `json:"month"`
}

func (signoff) Kind() string { return "signoff" }

// The seed's reconciliation that needs a human's sign-off, from the
// dashboard: a job asleep in its wait for "approval" offers a signal
// action; its page names the signal; the post (with the page's CSRF
// token, same-origin) sends the payload and the job resumes with it. A
// payload that is not JSON is refused and writes nothing.
func TestDashboardSignalsAWaitingJob(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	by := make(chan string, 1)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[signoff](func(ctx context.Context, j *handler.Job[signoff]) error {
		a, err := handler.WaitForSignal[struct {
			By string `json:"by"`
		}](ctx, "approval", time.Hour)
		if err != nil {
			return err
		}
		by <- a.By
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(context.Background(), signoff{Month: "2026-11"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	a, err := admin.New(settings.Settings{AWS: e.Cfg, Table: e.Table, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(dashboard.New(a, &dashboard.Options{Write: true, Logger: quiet}))
	t.Cleanup(ts.Close)
	srv := ts.URL
	c := client(t)
	if code, page := get(t, c, srv+"/jobs/"+res.ID); code != http.StatusOK || !strings.Contains(page, `id="signal"`) {
		t.Fatalf("the waiting job's page: %d, no signal action", code)
	}
	code, page := get(t, c, srv+"/jobs/"+res.ID+"/signal")
	m := tokenRE.FindStringSubmatch(page)
	if code != http.StatusOK || m == nil || !strings.Contains(page, `value="approval"`) {
		t.Fatalf("the signal page: %d, want the waited signal's name and a token\n%s", code, page)
	}
	same := http.Header{"Sec-Fetch-Site": {"same-origin"}}
	if code, _ := post(t, c, srv+"/jobs/"+res.ID+"/signal", url.Values{"csrf": {m[1]}, "name": {"approval"}, "payload": {"{not json"}}, same); code == http.StatusSeeOther {
		t.Fatal("a payload that is not JSON was sent")
	}
	if rec := e.Get(t, res.ID); rec.Steps[ledger.SignalStep("approval")] != "" {
		t.Fatal("the refused signal was written")
	}
	if code, body := post(t, c, srv+"/jobs/"+res.ID+"/signal", url.Values{"csrf": {m[1]}, "name": {"approval"}, "payload": {`{"by":"ada"}`}}, same); code != http.StatusSeeOther {
		t.Fatalf("signal: %d\n%s", code, body)
	}
	e.Drain(t, h)
	if got := <-by; got != "ada" || e.Get(t, res.ID).State != ledger.Succeeded {
		t.Fatalf("signed off by %q, job %s", got, e.Get(t, res.ID).State)
	}
}
