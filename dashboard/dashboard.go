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
// embedded; nothing is fetched from elsewhere and no script runs. The
// overview's charts (jobs ended per minute or hour by state, each
// queue's depth, runs and times per kind) are inline SVG drawn on the
// server from the same load's index Scan and queue attributes.
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
// 'none', X-Frame-Options), nosniff; pages (which may show args and
// results) are no-store; forms post only to the dashboard (form-action
// 'self', base-uri 'none'). The banner after an action is chosen from
// fixed texts by a code, never taken from the URL.
//
// Read-only unless Options.Write: without it no action is offered and
// every write answers 403. Each write is a POST that must carry the
// page's CSRF token (a double-submit cookie, SameSite=Strict) and pass
// net/http's CrossOriginProtection (Sec-Fetch-Site / Origin), so another
// site cannot make a browser act. Args and a job's result are shown only
// on request, escaped; keys are looked up by hash and never shown, logged
// or put in a URL.
//
// # How it fails
//
// An AWS error shows as the page's error line with status 502; a refused
// action (a job in the wrong state) as the job's page with the reason and
// status 409; an unknown job, 404. Nothing is half-done: every action is
// one of admin's, which write nothing when they refuse.
package dashboard

import (
	"embed"
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
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
