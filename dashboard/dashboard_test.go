package dashboard_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// invoice is the dashboard tests' job: it fails while broken is set.
type invoice struct {
	Customer string `json:"customer"`
}

func (invoice) Kind() string { return "invoice" }

// rig is a deployment with one Failed invoice job, a worker, and a
// dashboard over it (write actions as asked).
type rig struct {
	e      *awstest.Env
	h      *handler.Handler
	broken atomic.Bool
	failed string // the Failed job's id
	srv    *httptest.Server
}

func newRig(t *testing.T, write bool) *rig {
	t.Helper()
	return newRigOn(t, write, ledger.Options{})
}

// newRigOn is newRig on a deployment with these ledger options (every
// process of it agrees on them, as the construct's settings make them).
func newRigOn(t *testing.T, write bool, lo ledger.Options) *rig {
	t.Helper()
	r := &rig{e: &awstest.Env{Env: nexjobtest.New(t, &nexjobtest.Options{Ledger: lo})}}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[invoice](func(ctx context.Context, j *handler.Job[invoice]) error {
		if r.broken.Load() {
			return handler.Permanent(errors.New("ledger service unreachable"))
		}
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	r.broken.Store(true)
	res, err := r.e.Client.Enqueue(context.Background(), invoice{Customer: "ada@example.com"}, &enqueue.Opts{IdempotencyKey: "invoice-2026-11-ada", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.failed = res.ID
	r.e.Drain(t, r.h)
	r.e.RequireState(t, r.failed, ledger.Failed)
	r.broken.Store(false)
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention, IndexAllStates: lo.IndexAllStates})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewServer(dashboard.New(a, &dashboard.Options{Write: write, Logger: quiet}))
	t.Cleanup(r.srv.Close)
	return r
}

// client is a browser-like client: it keeps cookies and does not follow
// redirects, so a test sees them.
func client(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var tokenRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func post(t *testing.T, c *http.Client, u string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location") + string(b)
}

// TestWriteProtection: a write needs the flag, the page's CSRF token and
// a same-origin request; each refusal writes nothing.
func TestWriteProtection(t *testing.T) {
	t.Parallel()
	for _, write := range []bool{false, true} {
		r := newRig(t, write)
		c := client(t)
		code, page := get(t, c, r.srv.URL+"/jobs/"+r.failed+"/requeue")
		if !write {
			if code != http.StatusForbidden || !strings.Contains(page, "read-only") {
				t.Fatalf("read-only confirm page: %d\n%s", code, page)
			}
			// A token from any page still does not make a write pass.
			_, page = get(t, c, r.srv.URL+"/")
		}
		m := tokenRE.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no CSRF token on the page:\n%s", page)
		}
		action := r.srv.URL + "/jobs/" + r.failed + "/requeue"
		cases := []struct {
			name   string
			form   url.Values
			header http.Header
			want   int
		}{
			{"no token", url.Values{}, nil, http.StatusForbidden},
			{"wrong token", url.Values{"csrf": {strings.Repeat("x", 43)}}, nil, http.StatusForbidden},
			{"cross-site", url.Values{"csrf": {m[1]}}, http.Header{"Sec-Fetch-Site": {"cross-site"}}, http.StatusForbidden},
		}
		for _, tc := range cases {
			if code, body := post(t, c, action, tc.form, tc.header); code != tc.want {
				t.Fatalf("write=%v %s: %d %s", write, tc.name, code, body)
			}
		}
		code, body := post(t, c, action, url.Values{"csrf": {m[1]}}, http.Header{"Sec-Fetch-Site": {"same-origin"}})
		rec := r.e.Get(t, r.failed)
		switch {
		case !write && (code != http.StatusForbidden || rec.State != ledger.Failed):
			t.Fatalf("read-only requeue: %d, job %s\n%s", code, rec.State, body)
		case write && (code != http.StatusSeeOther || rec.State != ledger.Enqueued):
			t.Fatalf("requeue: %d, job %s\n%s", code, rec.State, body)
		}
	}
}

// TestKeyLookup: the key is posted, hashed and looked up; the page shows
// the holder, never the key.
func TestKeyLookup(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	c := client(t)
	_, page := get(t, c, r.srv.URL+"/")
	tok := tokenRE.FindStringSubmatch(page)[1]
	code, loc := post(t, c, r.srv.URL+"/key", url.Values{"csrf": {tok}, "key": {"invoice-2026-11-ada"}}, nil)
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/jobs/"+r.failed+"?") {
		t.Fatalf("lookup: %d %s", code, loc)
	}
	code, page = get(t, c, r.srv.URL+strings.SplitN(loc, "<", 2)[0])
	if code != http.StatusOK || strings.Contains(page, "invoice-2026-11-ada") || strings.Contains(page, "ada@example.com") {
		t.Fatalf("job page %d leaks the key or the args:\n%s", code, page)
	}
	code, page = post(t, c, r.srv.URL+"/key", url.Values{"csrf": {tok}, "key": {"invoice-2026-12-ada"}}, nil)
	// Nor its hash: shown for any string, it was the key secret's HMAC of
	// whatever a reader chose (issue 38 item 14).
	if code != http.StatusOK || !strings.Contains(page, "No job holds that key") || strings.Contains(page, "invoice-2026-12-ada") || strings.Contains(page, "(hash ") {
		t.Fatalf("free key: %d\n%s", code, page)
	}
	if code, _ := get(t, c, r.srv.URL+"/jobs/aaaaaaaaaaaaaaaaaaaaaaaaaa"); code != http.StatusNotFound {
		t.Fatalf("unknown job: %d", code)
	}
	if code, _ := get(t, c, r.srv.URL+"/jobs/no%20such%20job"); code != http.StatusBadRequest {
		t.Fatalf("malformed job id: %d", code)
	}
	if code, _ := get(t, c, r.srv.URL+"/jobs?state=Done"); code != http.StatusBadRequest {
		t.Fatalf("unknown state: %d", code)
	}
}

// TestDLQPageLeavesMessagesVisible: viewing the DLQ page (a GET) must not
// hide its messages from the DLQ consumer or a redrive. It received with
// the queue's own visibility timeout (the SDK drops a 0), so after one
// view a consumer received nothing.
func TestDLQPageLeavesMessagesVisible(t *testing.T) {
	r := newRig(t, false)
	ctx := context.Background()
	for _, body := range []string{"not a job", "neither is this"} {
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if code, page := get(t, client(t), r.srv.URL+"/dlq"); code != http.StatusOK || !strings.Contains(page, "not a job") {
			t.Fatalf("GET /dlq: %d\n%s", code, page)
		}
	}
	out, err := r.e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(r.e.DLQURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 2 {
		t.Fatalf("a consumer received %d of the DLQ's 2 messages after three views of the page", len(out.Messages))
	}
}

// TestHostChecked: a request naming another Host (a rebound name, the
// attacker's) is refused 421 before anything runs; loopback literals and
// localhost pass, as do the allowed names.
func TestHostChecked(t *testing.T) {
	r := newRig(t, true)
	port := r.srv.URL[strings.LastIndex(r.srv.URL, ":")+1:]
	req := func(host, path string) int {
		rq, _ := http.NewRequest(http.MethodGet, r.srv.URL+path, nil)
		rq.Host = host
		resp, err := http.DefaultClient.Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(b), "not the dashboard's address") {
			t.Fatalf("%s: refusal text with 200", host)
		}
		return resp.StatusCode
	}
	for host, want := range map[string]int{
		"rebind.example:" + port:   http.StatusMisdirectedRequest,
		"127.0.0.1.nip.io:" + port: http.StatusMisdirectedRequest,
		"127.0.0.1:" + port:        http.StatusOK,
		"localhost:" + port:        http.StatusOK,
		"[::1]:" + port:            http.StatusOK,
	} {
		if got := req(host, "/jobs/"+r.failed+"?args=1"); got != want {
			t.Errorf("Host %s: %d, want %d", host, got, want)
		}
	}
	// A POST from the rebound name is refused as well, before the CSRF check.
	rq, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/jobs/"+r.failed+"/delete", strings.NewReader("csrf=x"))
	rq.Host = "rebind.example:" + port
	rq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("POST from a rebound Host: %d", resp.StatusCode)
	}
	r.e.RequireState(t, r.failed, ledger.Failed)

	// With Addr, only that address and localhost on its port; plus the allowlist.
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	addr := r.srv.Listener.Addr().String()
	strict := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet, Addr: addr, AllowedHosts: []string{"jobs.internal.example", ".lambda-url.eu-west-1.on.aws"}}))
	t.Cleanup(strict.Close)
	for host, want := range map[string]int{
		addr:                                 http.StatusOK,
		"localhost:" + port:                  http.StatusOK,
		"localhost:1":                        http.StatusMisdirectedRequest,
		"127.0.0.2:" + port:                  http.StatusMisdirectedRequest,
		"jobs.internal.example":              http.StatusOK,
		"abc123.lambda-url.eu-west-1.on.aws": http.StatusOK,
		"abc123.lambda-url.eu-west-1.on.aws.evil": http.StatusMisdirectedRequest,
	} {
		rq, _ := http.NewRequest(http.MethodGet, strict.URL+"/", nil)
		rq.Host = host
		resp, err := http.DefaultClient.Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("strict, Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestSecurityHeaders: every page is no-store (it may show args), says
// no-referrer, refuses framing and foreign form targets; the stylesheet
// is nosniff; the banner text is never the URL's.
func TestSecurityHeaders(t *testing.T) {
	r := newRig(t, true)
	for _, path := range []string{"/", "/jobs/" + r.failed + "?args=1", "/dlq", "/assets/style.css"} {
		resp, err := http.Get(r.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		h := resp.Header
		csp := h.Get("Content-Security-Policy")
		if h.Get("Referrer-Policy") != "no-referrer" || h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" ||
			!strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "form-action 'self'") || !strings.Contains(csp, "base-uri 'none'") {
			t.Errorf("%s: headers %v", path, h)
		}
		if page := !strings.HasPrefix(path, "/assets/"); page != (h.Get("Cache-Control") == "no-store") {
			t.Errorf("%s: Cache-Control %q", path, h.Get("Cache-Control"))
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
	_, page := get(t, client(t), r.srv.URL+"/jobs/"+r.failed+"?done="+url.QueryEscape("Your account is locked: call +1 555 0100"))
	if strings.Contains(page, "account is locked") {
		t.Fatal("the banner showed text from the URL")
	}
	_, page = get(t, client(t), r.srv.URL+"/jobs/"+r.failed+"?done=requeued")
	if !strings.Contains(page, "requeued: the job is Enqueued") {
		t.Fatal("a known banner code shows no text")
	}
}

// TestJobPageShowsRuns: the job page lists the runs the record keeps,
// with their errors.
func TestJobPageShowsRuns(t *testing.T) {
	r := newRig(t, false)
	_, page := get(t, client(t), r.srv.URL+"/jobs/"+r.failed)
	if !strings.Contains(page, "run 1 failed: ledger service unreachable") {
		t.Fatalf("the job page lacks the run's end:\n%s", page)
	}
}

// TestOverviewRefreshesAndCountsEnds (issue 30, item 11): the overview
// reloads itself, says how many jobs ended in the last hour by state, and
// has no row for items that are not jobs (a blank kind of zeros headed
// it: flow control's items counted as jobs). The overview reads the
// byState index (issue 38 item 18), so the deployment here indexes every
// state, Succeeded included (IndexAllStates); without it Succeeded is
// not counted on the overview (TestOverviewCostDoesNotGrowWithArgs).
func TestOverviewRefreshesAndCountsEnds(t *testing.T) {
	r := newRigOn(t, false, ledger.Options{IndexAllStates: true})
	ctx := context.Background()
	if _, err := r.e.Client.Enqueue(ctx, invoice{Customer: "bob@example.com"}, &enqueue.Opts{
		RateLimit: &enqueue.RateLimit{Key: "invoices", Limit: 5, Period: time.Minute}}); err != nil {
		t.Fatal(err) // a rate log item beside the jobs
	}
	r.e.Drain(t, r.h)
	_, page := get(t, client(t), r.srv.URL+"/")
	if !strings.Contains(page, `<meta http-equiv="refresh" content="10">`) {
		t.Fatalf("the overview does not reload itself:\n%s", page)
	}
	if !strings.Contains(page, "Ended in the last hour: 1 Succeeded, 1 Failed, 0 Expired.") {
		t.Fatalf("the overview's last hour:\n%s", page)
	}
	if strings.Contains(page, "<tr><td></td>") {
		t.Fatalf("a row with no kind heads the overview:\n%s", page)
	}
}

// TestSchedulesPage: the dashboard lists the recurring jobs, with their
// next firing; without a schedule group it says there is none.
func TestSchedulesPage(t *testing.T) {
	r := newRig(t, false)
	ctx := context.Background()
	group := "dash-" + r.e.Table[len(r.e.Table)-9:]
	if _, err := scheduler.NewFromConfig(r.e.Cfg).CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
		t.Fatal(err)
	}
	opts := recurring.Options{Group: group, TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:t", RoleARN: "arn:aws:iam::123456789012:role/s"}
	if err := recurring.New(r.e.Cfg, opts).Recurring(ctx, "month-end", "cron(0 6 1 * ? *)", invoice{Customer: "all"}, nil); err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention, Schedules: opts})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	n1, _ := recurring.Next("cron(0 6 1 * ? *)", "", time.Time{}, time.Now()) // the page's clock reads between n1's and n2's
	code, page := get(t, client(t), srv.URL+"/schedules")
	n2, _ := recurring.Next("cron(0 6 1 * ? *)", "", time.Time{}, time.Now())
	shows := func(n time.Time) bool { return strings.Contains(page, n.UTC().Format("2006-01-02 15:04 MST")) }
	if code != http.StatusOK || !strings.Contains(page, "month-end") || !shows(n1) && !shows(n2) {
		t.Fatalf("%d\n%s", code, page)
	}
	if _, page := get(t, client(t), r.srv.URL+"/schedules"); !strings.Contains(page, "No schedule group is configured") {
		t.Fatalf("with no group:\n%s", page)
	}
}

// A read-only dashboard is not given the key secret (issue 38 item 14):
// its lookup by key is refused, saying why, rather than answered with a
// hash made without the secret ("no job holds that key" for a held key).
func TestKeyLookupWithTheSecretWithheld(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention, KeySecretWithheld: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	c := client(t)
	_, page := get(t, c, srv.URL+"/")
	tok := tokenRE.FindStringSubmatch(page)[1]
	code, page := post(t, c, srv.URL+"/key", url.Values{"csrf": {tok}, "key": {"invoice-2026-11-ada"}}, nil)
	if code != http.StatusForbidden || !strings.Contains(page, "key secret") || strings.Contains(page, "No job holds that key") {
		t.Fatalf("a lookup by key with the secret withheld: %d\n%s\nwant 403 saying the key secret is needed", code, page)
	}
	if code, _ := get(t, c, srv.URL+"/jobs/"+r.failed); code != http.StatusOK {
		t.Fatalf("the job by its id: %d", code)
	}
}
