// Package dashboard is nexjob's web dashboard: jobs by state and kind, a
// job's detail with its history and last error, which job holds a key,
// the dead-letter queue, and (when allowed) requeue, cancel, delete and
// redrive, each behind a confirmation page. It is one http.Handler over
// package admin, served by `nexjob dashboard` on 127.0.0.1 or by the
// construct's optional Lambda function URL (IAM auth).
//
//	a, _ := admin.New(s)
//	http.ListenAndServe("127.0.0.1:8080", dashboard.New(a, nil))
//
// Pages are server-rendered with html/template; the stylesheet is
// embedded; nothing is fetched from elsewhere and no script runs.
//
// # Safety
//
// Every request's Host must be the address it is served on (Options.Addr,
// and localhost on its port), a loopback literal when no address is
// given, or one of Options.AllowedHosts; any other answers 421. A page
// whose name an attacker rebinds to 127.0.0.1 (DNS rebinding) shares the
// dashboard's origin in the browser, so origin and CSRF checks do not
// stop it: its requests still say their own Host.
//
// Every response says no-referrer, refuses framing (frame-ancestors
// 'none', X-Frame-Options), nosniff; pages (which may show args) are
// no-store; forms post only to the dashboard (form-action 'self',
// base-uri 'none'). The banner after an action is chosen from fixed texts
// by a code, never taken from the URL.
//
// Read-only unless Options.Write: without it no action is offered and
// every write answers 403. Each write is a POST that must carry the
// page's CSRF token (a double-submit cookie, SameSite=Strict) and pass
// net/http's CrossOriginProtection (Sec-Fetch-Site / Origin), so another
// site cannot make a browser act. Args are shown only on request; keys
// are looked up by hash and never shown, logged or put in a URL.
//
// # How it fails
//
// An AWS error shows as the page's error line with status 502; a refused
// action (a job in the wrong state) as the job's page with the reason and
// status 409; an unknown job, 404. Nothing is half-done: every action is
// one of admin's, which write nothing when they refuse.
package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

//go:embed templates.html
var templateText string

//go:embed assets
var assets embed.FS

// Options tune the dashboard. The zero value is read-only at the root.
type Options struct {
	// Write turns the actions on: requeue, cancel, delete, redrive.
	// Defaults to false (read-only).
	Write bool
	// Prefix is the path the handler is mounted under ("" for the root),
	// without a trailing slash; requests must arrive with it.
	Prefix string
	// Logger receives one line per action (job id and outcome, never args
	// or keys). Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock for "3m ago". Defaults to time.Now.
	Now func() time.Time
	// Addr is the address the dashboard is served on ("127.0.0.1:8080"):
	// requests must name it, or localhost on its port, as their Host.
	// Empty: any loopback literal (127.0.0.1, [::1]) or localhost, any
	// port.
	Addr string
	// AllowedHosts are further Host values to accept: a proxy's name, the
	// Lambda function URL's domain. An entry starting with "." matches
	// every name ending with it (".lambda-url.eu-west-1.on.aws"). Names
	// are matched without their port unless the entry has one.
	AllowedHosts []string
}

type server struct {
	a    *admin.Admin
	o    Options
	tmpl *template.Template
}

const csrfCookie = "nexjob_csrf"

// New returns the dashboard's handler over a.
func New(a *admin.Admin, opts *Options) http.Handler {
	s := &server{a: a}
	if opts != nil {
		s.o = *opts
	}
	if s.o.Logger == nil {
		s.o.Logger = slog.Default()
	}
	if s.o.Now == nil {
		s.o.Now = time.Now
	}
	s.tmpl = template.Must(template.New("").Parse(templateText))
	mux := http.NewServeMux()
	mux.Handle("GET /assets/", http.FileServerFS(assets))
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /jobs", s.jobs)
	mux.HandleFunc("GET /jobs/{id}", s.job)
	mux.HandleFunc("GET /jobs/{id}/{action}", s.confirm)
	mux.HandleFunc("POST /jobs/{id}/{action}", s.act)
	mux.HandleFunc("POST /key", s.key)
	mux.HandleFunc("GET /dlq", s.dlq)
	mux.HandleFunc("GET /schedules", s.schedules)
	mux.HandleFunc("GET /dlq/redrive", s.confirm)
	mux.HandleFunc("POST /dlq/redrive", s.act)
	var h http.Handler = mux
	if s.o.Prefix != "" {
		h = http.StripPrefix(s.o.Prefix, h)
	}
	return s.withHost(withHeaders(http.NewCrossOriginProtection().Handler(s.withToken(h))))
}

// withHost answers 421 to a request whose Host is not the dashboard's.
func (s *server) withHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hostAllowed(r.Host) {
			http.Error(w, "nexjob dashboard: this Host is not the dashboard's address; open it by its own address (or allow the name with AllowedHosts / --allow-host)", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *server) hostAllowed(host string) bool {
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = host, ""
	}
	name = strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	for _, a := range s.o.AllowedHosts {
		a = strings.ToLower(a)
		switch {
		case strings.HasPrefix(a, "."):
			if strings.HasSuffix(name, a) {
				return true
			}
		case strings.EqualFold(a, host) || a == name:
			return true
		}
	}
	if s.o.Addr != "" {
		_, lport, err := net.SplitHostPort(s.o.Addr)
		if err != nil {
			return false
		}
		return strings.EqualFold(host, s.o.Addr) || port == lport && (name == "localhost" || isLoopbackIP(name) && lhost(s.o.Addr) == name)
	}
	return name == "localhost" || isLoopbackIP(name)
}

func lhost(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return strings.Trim(h, "[]")
}

func isLoopbackIP(name string) bool {
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// withHeaders sets the headers every response carries, and no-store on
// everything but the stylesheet.
func withHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		if !strings.HasPrefix(r.URL.Path, "/assets/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

const csp = "default-src 'self'; script-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"

// banners are the texts shown after an action, chosen by the code in the
// redirect's ?done= (never the URL's own text).
var banners = map[string]string{
	"requeued":  "requeued: the job is Enqueued and on its way to a worker",
	"cancelled": "cancelled: the job will not run",
	"deleted":   "deleted the job",
	"redrove":   "redrive done: the dead-letter queue's jobs are back in work (see each job)",
	"holder":    "this job holds the key",
}

// withToken gives every visitor a CSRF token cookie and checks it on
// every POST.
func (s *server) withToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(csrfCookie)
		if err != nil || len(c.Value) < 32 {
			b := make([]byte, 32)
			_, _ = rand.Read(b)
			c = &http.Cookie{Name: csrfCookie, Value: base64.RawURLEncoding.EncodeToString(b), Path: "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"}
			http.SetCookie(w, c)
			r.AddCookie(c)
		}
		if r.Method == http.MethodPost && subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(c.Value)) != 1 {
			http.Error(w, "nexjob dashboard: missing or wrong CSRF token; reload the page and try again", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// view is every page's data; each page fills what it shows.
type view struct {
	Title, Base, Table, Flash, Error, CSRF string
	Write                                  bool
	now                                    time.Time

	Stats  admin.Stats
	States []ledger.State
	Kinds  []string

	State        ledger.State
	Kind, Since  string
	Jobs         []ledger.Record
	Next         string
	Scanned      bool
	Job          ledger.Record
	ShowArgs     bool
	History      []event
	Actions      []string
	Letters      []admin.DeadLetter
	Schedules    []admin.ScheduledJob
	NoSchedules  bool
	Action       string
	Target       string
	Explain      string
	PostTo, Back string
}

type event struct {
	At   int64
	What string
}

var allStates = []ledger.State{ledger.Enqueued, ledger.Scheduled, ledger.Processing, ledger.AwaitingContinuation, ledger.Succeeded, ledger.Failed, ledger.Expired}

// Count is the number of kind's jobs in state st.
func (v view) Count(st ledger.State, kind string) int { return v.Stats.Jobs[st][kind] }

// Time formats Unix milliseconds.
func (v view) Time(ms int64) string {
	if ms == 0 {
		return ""
	}
	return ledger.Millis(ms).UTC().Format(time.RFC3339)
}

// Ago says how long before (or after) now a Unix-milliseconds time is.
func (v view) Ago(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return Ago(ledger.Millis(ms), v.now)
}

// AgoTime is Ago for a time.Time.
func (v view) AgoTime(t time.Time) string { return Ago(t, v.now) }

// Short cuts a last error for a table cell.
func (v view) Short(s string) string {
	if r := []rune(s); len(r) > 90 {
		return string(r[:89]) + "…"
	}
	return s
}

// Ago is t relative to now for people: "3m ago", "in 2h", "just now".
func Ago(t, now time.Time) string {
	d := now.Sub(t)
	suffix := " ago"
	if d < 0 {
		d, suffix = -d, ""
	}
	var s string
	switch {
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d.Hours()))
	default:
		s = fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	if suffix == "" {
		return "in " + s
	}
	return s + suffix
}

func (s *server) view(r *http.Request, title string) view {
	c, _ := r.Cookie(csrfCookie)
	v := view{Title: title, Base: s.o.Prefix, Table: s.a.Table(), Write: s.o.Write, now: s.o.Now(), States: allStates,
		Flash: banners[r.URL.Query().Get("done")]}
	if c != nil {
		v.CSRF = c.Value
	}
	return v
}

func (s *server) render(w http.ResponseWriter, status int, name string, v view) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.tmpl.ExecuteTemplate(w, name, v); err != nil {
		s.o.Logger.Error("nexjob dashboard: render", "page", name, "err", err)
	}
}

// fail renders err on a plain page with a status that says what it was.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	v := s.view(r, "error")
	v.Error = err.Error()
	status := http.StatusBadGateway
	var nt *enqueue.NotTerminalError
	var nc *enqueue.NotCancellableError
	var bad badRequest
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		status = http.StatusNotFound
	case errors.As(err, &bad), errors.Is(err, ledger.ErrBadCursor), errors.Is(err, ledger.ErrBadID):
		status = http.StatusBadRequest
	case errors.As(err, &nt), errors.As(err, &nc), errors.Is(err, ledger.ErrKeyReused), errors.Is(err, ledger.ErrDeadLetterRecord):
		status = http.StatusConflict
	case errors.Is(err, errReadOnly):
		status = http.StatusForbidden
	}
	v.Title = http.StatusText(status)
	s.render(w, status, "problem", v)
}

type badRequest string

func (b badRequest) Error() string { return string(b) }

var errReadOnly = errors.New("this dashboard is read-only: start it with --write (nexjob dashboard --write) to act on jobs")

func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	st, err := s.a.Stats(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := s.view(r, "jobs")
	v.Stats = st
	kinds := map[string]bool{}
	for _, byKind := range st.Jobs {
		for k := range byKind {
			kinds[k] = true
		}
	}
	for k := range kinds {
		v.Kinds = append(v.Kinds, k)
	}
	sort.Strings(v.Kinds)
	s.render(w, http.StatusOK, "overview", v)
}

func (s *server) jobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := s.view(r, "jobs")
	v.State, v.Kind, v.Since = ledger.State(q.Get("state")), q.Get("kind"), q.Get("since")
	if v.State == "" {
		v.State = ledger.Failed
	}
	if !v.State.Valid() {
		s.fail(w, r, badRequest(fmt.Sprintf("unknown state %q", v.State)))
		return
	}
	f := ledger.Filter{State: v.State, Kind: v.Kind, Limit: 50, Cursor: q.Get("cursor")}
	if v.Since != "" {
		d, err := time.ParseDuration(v.Since)
		if err != nil || d <= 0 {
			s.fail(w, r, badRequest(fmt.Sprintf("since %q is not a duration like 24h", v.Since)))
			return
		}
		f.Since = v.now.Add(-d)
	}
	recs, next, err := s.a.Find(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v.Title = string(v.State) + " jobs"
	v.Jobs, v.Next, v.Scanned = recs, next, !s.a.Indexed(v.State)
	s.render(w, http.StatusOK, "jobs", v)
}

func (s *server) job(w http.ResponseWriter, r *http.Request) {
	rec, err := s.a.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := s.view(r, "job "+rec.ID)
	v.Job, v.ShowArgs, v.History, v.Actions = rec, r.URL.Query().Get("args") == "1", history(rec), actions(rec)
	s.render(w, http.StatusOK, "job", v)
}

// history reads a job's story from its record's times, oldest first.
func history(r ledger.Record) []event {
	ev := []event{{r.CreatedAt, "created (" + r.Policy + ")"}}
	if r.RunAt > 0 {
		ev = append(ev, event{r.RunAt, "due"})
	}
	if r.Deadline > 0 {
		ev = append(ev, event{r.Deadline, "deadline to start"})
	}
	if r.Attempt > 0 {
		ev = append(ev, event{r.UpdatedAt, fmt.Sprintf("attempt %d of %d", r.Attempt, r.MaxAttempts)})
	}
	if r.LeaseUntil > 0 {
		ev = append(ev, event{r.LeaseUntil, "lease of the current run ends"})
	}
	for _, a := range r.Attempts() { // the last runs' ends, kept by the record
		what := fmt.Sprintf("run %d ended %s", a.N, a.State)
		if a.Error != "" {
			what += ": " + a.Error
		}
		ev = append(ev, event{a.At, what})
	}
	what := "now " + string(r.State)
	if r.Cancelled {
		what += ", cancelled by an operator"
	}
	if r.Returns > 0 {
		what += fmt.Sprintf(", sent back from the DLQ %d times", r.Returns)
	}
	ev = append(ev, event{r.UpdatedAt, what})
	if r.ExpiresAt > 0 {
		ev = append(ev, event{r.ExpiresAt * 1000, "retention ends (the record is deleted)"})
	}
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At < ev[j].At })
	return ev
}

// actions are the ones the job's state allows.
func actions(r ledger.Record) []string {
	switch {
	case r.Kind == ledger.DeadLetterKind:
		return []string{"delete"}
	case r.State.Terminal():
		return []string{"requeue", "delete"}
	case r.State == ledger.Enqueued || r.State == ledger.Scheduled:
		return []string{"cancel", "delete"}
	}
	return []string{"delete"}
}

var explain = map[string]string{
	"requeue": "The job goes back to Enqueued with a fresh attempt budget and is sent to the queue: it will run again.",
	"cancel":  "The job will not run. Its record becomes Failed, marked cancelled, and is kept for the failed retention; its key stays held as by any failed job.",
	"delete":  "The record is removed and its idempotency key is free at once. A message still on the queue is then dropped without a run.",
	"redrive": "Every message in the dead-letter queue goes back into work: ended jobs are requeued, active ones sent again. Messages that are not jobs stay.",
}

func (s *server) confirm(w http.ResponseWriter, r *http.Request) {
	if !s.o.Write {
		s.fail(w, r, errReadOnly)
		return
	}
	v := s.view(r, "confirm")
	id, action := r.PathValue("id"), r.PathValue("action")
	if id == "" {
		v.Action, v.Target, v.PostTo, v.Back = "redrive", "the dead-letter queue", v.Base+"/dlq/redrive", v.Base+"/dlq"
	} else {
		if _, ok := explain[action]; !ok {
			s.fail(w, r, badRequest(fmt.Sprintf("unknown action %q", action)))
			return
		}
		v.Action, v.Target = action, "job "+id
		v.PostTo, v.Back = v.Base+"/jobs/"+url.PathEscape(id)+"/"+action, v.Base+"/jobs/"+url.PathEscape(id)
	}
	v.Title, v.Explain = v.Action, explain[v.Action]
	s.render(w, http.StatusOK, "confirm", v)
}

func (s *server) act(w http.ResponseWriter, r *http.Request) {
	if !s.o.Write {
		s.fail(w, r, errReadOnly)
		return
	}
	ctx := r.Context()
	id, action := r.PathValue("id"), r.PathValue("action")
	var done string
	var err error
	back := s.o.Prefix + "/jobs/" + url.PathEscape(id)
	switch {
	case id == "":
		action, back = "redrive", s.o.Prefix+"/dlq"
		var rep admin.Report
		rep, err = s.a.Redrive(ctx, nil)
		if err == nil {
			err = rep.Err()
		}
		if err == nil && rep.Hidden > 0 {
			err = fmt.Errorf("nexjob: the DLQ still holds %d messages this redrive could not see (in flight: visible again when their visibility timeout ends); redrive again then", rep.Hidden)
		}
		done = "redrove"
	case action == "requeue":
		_, err = s.a.Requeue(ctx, id)
		done = "requeued"
	case action == "cancel":
		_, err = s.a.Cancel(ctx, id, r.PostFormValue("reason"))
		done = "cancelled"
	case action == "delete":
		err = s.a.Delete(ctx, id)
		done, back = "deleted", s.o.Prefix+"/"
	default:
		s.fail(w, r, badRequest(fmt.Sprintf("unknown action %q", action)))
		return
	}
	s.o.Logger.InfoContext(ctx, "nexjob dashboard: action", "action", action, "job_id", id, "err", err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	http.Redirect(w, r, back+"?done="+done, http.StatusSeeOther)
}

func (s *server) key(w http.ResponseWriter, r *http.Request) {
	key := r.PostFormValue("key")
	if key == "" {
		s.fail(w, r, badRequest("give a key to look up"))
		return
	}
	rec, err := s.a.Holder(r.Context(), key)
	if errors.Is(err, ledger.ErrNotFound) {
		v := s.view(r, "key")
		v.Title = "No job holds that key (hash " + s.a.HashKey(key) + "): an enqueue with it would be new"
		s.render(w, http.StatusOK, "problem", v)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	http.Redirect(w, r, s.o.Prefix+"/jobs/"+url.PathEscape(rec.ID)+"?done=holder", http.StatusSeeOther)
}

func (s *server) schedules(w http.ResponseWriter, r *http.Request) {
	v := s.view(r, "recurring jobs")
	list, err := s.a.Schedules(r.Context())
	switch {
	case errors.Is(err, admin.ErrNoSchedules):
		v.NoSchedules = true
	case err != nil:
		s.fail(w, r, err)
		return
	}
	v.Schedules = list
	s.render(w, http.StatusOK, "schedules", v)
}

func (s *server) dlq(w http.ResponseWriter, r *http.Request) {
	v := s.view(r, "dead letters")
	letters, err := s.a.DeadLetters(r.Context(), 10)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v.Letters = letters
	s.render(w, http.StatusOK, "dlq", v)
}
