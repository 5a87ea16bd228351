package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

// view is every page's data; each page fills what it shows.
type view struct {
	Title, Base, Table, Flash, Error, CSRF string
	Write                                  bool
	Refresh                                int // seconds: the page reloads itself (the overview); 0 never
	now                                    time.Time

	Stats      admin.Stats
	States     []ledger.State
	Kinds      []string
	NotCounted []ledger.State // states the overview did not count (not in the byState index)
	Span       string         // the overview's window: hour or day
	EndsChart  chart          // the overview's charts (charts.go)
	QueueChart chart
	KindChart  chart

	State        ledger.State
	Kind, Since  string
	Jobs         []ledger.Record
	Next         string
	Scanned      bool
	Job          ledger.Record
	ShowArgs     bool
	ShowResult   bool
	History      []event
	Timeline     []admin.Event // a durable job's steps, waits, children, compensations (admin.Timeline)
	ShowSteps    bool          // the timeline's values shown (?steps=1)
	Actions      []string
	Letters      []admin.DeadLetter
	Schedules    []admin.ScheduledJob
	NoSchedules  bool
	Action       string
	Target       string
	Explain      string
	Signal       string // the signal a job waits for, on its signal page
	PostTo, Back string
}

// Waiting says how long the job waiting longest to start has been due,
// for the overview.
func (v view) Waiting() string {
	if v.Stats.OldestDue.IsZero() {
		return "none"
	}
	return "due " + Ago(v.Stats.OldestDue, v.now)
}

// Ended are the end states, in the order the overview shows them.
func (v view) Ended() []ledger.State {
	return []ledger.State{ledger.Succeeded, ledger.Failed, ledger.Expired}
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
// RunEnd says how run a of job r ended, for people: what Finish made
// the job, in words ("failed; retry at …" where the record says
// Scheduled after a failure), with its error.
func RunEnd(r ledger.Record, a ledger.Attempt) string {
	var what string
	switch {
	case a.State == ledger.Scheduled && a.Error != "":
		what = "failed; retried"
		if r.State == ledger.Scheduled && r.Attempt == a.N && r.RunAt > 0 {
			what = "failed; retry at " + ledger.Millis(r.RunAt).UTC().Format(time.RFC3339)
		}
	case a.State == ledger.Scheduled:
		what = "deferred"
	case a.State == ledger.Enqueued:
		what = "cut off by the invocation's deadline; run again"
	case a.State == ledger.Succeeded:
		what = "succeeded"
	case a.State == ledger.Failed:
		what = "failed"
	default:
		what = "ended " + string(a.State)
	}
	if a.Error != "" {
		what += ": " + a.Error
	}
	return what
}

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
	case errors.Is(err, errReadOnly), errors.Is(err, admin.ErrKeySecretWithheld):
		status = http.StatusForbidden
	}
	v.Title = http.StatusText(status)
	s.render(w, status, "problem", v)
}

type badRequest string

func (b badRequest) Error() string { return string(b) }

var errReadOnly = errors.New("this dashboard is read-only: start it with --write (nexjob dashboard --write) to act on jobs")
