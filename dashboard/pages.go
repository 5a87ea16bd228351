package dashboard

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/ledger"
)

// overviewRefresh is how often the overview reloads itself, in seconds.
const overviewRefresh = 10

// overview counts the jobs from the byState index (admin.Overview: its
// entries hold no args, so a load costs the same whatever the args weigh)
// and reloads itself. The states the index does not hold are counted only
// when asked (?count=scan: admin.Stats, a Scan of the whole table billed
// for every record, shown once, not reloaded).
//
// Its charts (charts.go) are drawn from the same load: the ends listed by
// that Scan over the last hour, or day (?window=day), and the queues'
// attributes.
func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	scan := q.Get("count") == "scan"
	sp, ok := spans[cmp.Or(q.Get("window"), "hour")]
	if !ok {
		s.fail(w, r, badRequest(fmt.Sprintf("window %q is not hour or day", q.Get("window"))))
		return
	}
	count := s.a.OverviewSince
	if scan {
		count = s.a.StatsSince
	}
	v := s.view(r, "jobs")
	st, err := count(r.Context(), sp.start(v.now))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v.Stats, v.Scanned, v.Span = st, scan, sp.Name
	v.EndsChart, v.QueueChart = endsChart(st, sp, v.now), queuesChart(st)
	v.KindChart = kindsChart(byKind(st.Ends, sp.start(v.now)), sp)
	if !scan {
		v.Refresh = overviewRefresh
	}
	for _, state := range v.States {
		if !st.IsCounted(state) {
			v.NotCounted = append(v.NotCounted, state)
		}
	}
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
	rec, timeline, err := s.a.Timeline(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := s.view(r, "job "+rec.ID)
	rec.Result = rec.SucceededResult() // a requeued job's item may keep its run before's
	v.Job, v.ShowArgs, v.History, v.Actions = rec, r.URL.Query().Get("args") == "1", history(rec), actions(rec)
	v.ShowResult = r.URL.Query().Get("result") == "1"
	v.Timeline, v.ShowSteps = timeline, r.URL.Query().Get("steps") == "1"
	s.render(w, http.StatusOK, "job", v)
}

// history reads a job's story from its record's times, oldest first.
func history(r ledger.Record) []event {
	ev := []event{{r.CreatedAt, "created (" + r.Policy + ")"}}
	switch {
	case r.RunAt > 0 && r.State.Terminal():
		ev = append(ev, event{r.RunAt, "last run began"}) // an ended job's RunAt (ledger.Finish.Began)
	case r.RunAt > 0:
		ev = append(ev, event{r.RunAt, "due"})
	}
	if r.Deadline > 0 {
		ev = append(ev, event{r.Deadline, "deadline to start"})
	}
	if r.Attempt > 0 {
		ev = append(ev, event{r.UpdatedAt, fmt.Sprintf("%d of %d attempts spent", r.Attempt, r.MaxAttempts)})
	}
	if r.LeaseUntil > 0 {
		ev = append(ev, event{r.LeaseUntil, "lease of the current run ends"})
	}
	for _, a := range r.Attempts() { // the last runs' ends, kept by the record
		ev = append(ev, event{a.At, fmt.Sprintf("run %d %s", a.N, RunEnd(r, a))})
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
	case waitsFor(r) != "":
		return []string{"signal", "cancel", "delete"}
	case r.State == ledger.Enqueued || r.State == ledger.Scheduled:
		return []string{"cancel", "delete"}
	}
	return []string{"delete"}
}

// waitsFor is the signal a Scheduled job sleeps in a wait for (the first
// by name), or "".
func waitsFor(r ledger.Record) string {
	if r.State != ledger.Scheduled {
		return ""
	}
	var names []string
	for step := range r.Steps {
		if name, ok := strings.CutPrefix(step, ledger.WaitStep("")); ok && r.Steps[ledger.SignalStep(name)] == "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return names[0]
}

var explain = map[string]string{
	"requeue": "The job goes back to Enqueued with a fresh attempt budget and is sent to the queue: it will run again.",
	"cancel":  "The job will not run. Its record becomes Failed, marked cancelled, and is kept for the failed retention; its key stays held as by any failed job.",
	"signal":  "The job's wait for this signal ends: the payload (JSON) is recorded on the job, and the job runs again at once. The first signal of a name wins.",
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
		if action == "signal" {
			if rec, err := s.a.Get(r.Context(), id); err == nil {
				v.Signal = waitsFor(rec)
			}
		}
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
	case action == "signal":
		err = s.a.Signal(ctx, id, r.PostFormValue("name"), r.PostFormValue("payload"))
		done = "signalled"
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
		// Not the key's hash: shown for any string typed here, it was the
		// key secret's HMAC of anything a reader chose (issue 38 item 14).
		v.Title = "No job holds that key: an enqueue with it would be new"
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
