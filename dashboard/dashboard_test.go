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

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
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
	r := &rig{e: awstest.New(t, nil)}
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
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention})
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
	if code != http.StatusOK || !strings.Contains(page, "No job holds that key") || strings.Contains(page, "invoice-2026-12-ada") {
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
