package dashboard_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// rtdJob's run takes Secs seconds of the Env's clock; "retry" fails its
// first run after 500 s and succeeds in Secs; "sleep" sleeps an hour in
// its first run and takes Secs in its waking run.
type rtdJob struct {
	Secs int    `json:"secs"`
	Mode string `json:"mode,omitempty"`
}

func (rtdJob) Kind() string { return "rtd" }

// nearest is the nearest-rank percentile p of sorted xs.
func nearest(xs []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(xs)))) - 1
	return xs[max(i, 0)]
}

// TestAttackRTOverviewTimesAreLastRuns: the overview's run times per kind
// are the p50 and p95 (nearest rank) of the ended jobs' last runs, from
// their start to the job's end: a retried job's long failed first run and
// a slept job's hour asleep are not in them; a job cancelled before it ran
// and an Expired one are not timed. The page's figures agree with the
// records' (UpdatedAt - RunAt) and with what ran.
func TestAttackRTOverviewTimesAreLastRuns(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{IndexAllStates: true}})
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[string]int{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[rtdJob](func(ctx context.Context, j *handler.Job[rtdJob]) error {
		mu.Lock()
		seen[j.ID]++
		n := seen[j.ID]
		mu.Unlock()
		switch {
		case j.Args.Mode == "retry" && n == 1:
			e.Advance(t, 500*time.Second)
			return errors.New("slow failure")
		case j.Args.Mode == "sleep":
			if err := handler.Sleep(ctx, "nap", time.Hour); err != nil {
				return err
			}
		}
		e.Advance(t, time.Duration(j.Args.Secs)*time.Second)
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	enq := func(a rtdJob, o *enqueue.Opts) string {
		t.Helper()
		res, err := e.Client.Enqueue(ctx, a, o)
		if err != nil {
			t.Fatal(err)
		}
		return res.ID
	}
	// The sleeper first: its hour asleep passes before the others run.
	sleeper := enq(rtdJob{Secs: 1, Mode: "sleep"}, nil)
	e.Drain(t, h)
	e.Advance(t, time.Hour)
	// One at a time: a run's Advance moves the clock of every run beside it.
	ids := []string{sleeper}
	for s := 10; s <= 100; s += 10 {
		ids = append(ids, enq(rtdJob{Secs: s}, nil))
		e.Drain(t, h)
	}
	ids = append(ids, enq(rtdJob{Secs: 5, Mode: "retry"}, nil))
	e.Drain(t, h)
	cancelled := enq(rtdJob{Secs: 7}, &enqueue.Opts{Delay: time.Hour})
	if _, err := e.Client.Cancel(ctx, cancelled, "", 0); err != nil {
		t.Fatal(err)
	}
	expired := enq(rtdJob{Secs: 7}, &enqueue.Opts{Deadline: e.Now().Add(5 * time.Second)})
	e.Advance(t, 10*time.Second) // past its deadline before it runs
	e.Drain(t, h)
	if rec := e.Get(t, expired); rec.State != ledger.Expired {
		t.Fatalf("the job past its deadline is %s, want Expired", rec.State)
	}

	// What ran: the last runs took 1 s, 10..100 s, 5 s.
	var want []time.Duration
	want = append(want, time.Second, 5*time.Second)
	for s := 10; s <= 100; s += 10 {
		want = append(want, time.Duration(s)*time.Second)
	}
	slices.Sort(want)
	// What the records say.
	var fromRecs []time.Duration
	for _, id := range ids {
		r := e.Get(t, id)
		if r.State != ledger.Succeeded || r.RunAt == 0 || r.RunAt > r.UpdatedAt {
			t.Fatalf("job %s: %s, RunAt %d, end %d", id, r.State, r.RunAt, r.UpdatedAt)
		}
		fromRecs = append(fromRecs, time.Duration(r.UpdatedAt-r.RunAt)*time.Millisecond)
	}
	for _, id := range []string{expired} { // the cancelled one keeps its due time, and is not timed
		if r := e.Get(t, id); r.RunAt != 0 {
			t.Errorf("job %s (%s, never ran) keeps RunAt %d", id, r.State, r.RunAt)
		}
	}
	slices.Sort(fromRecs)
	for i := range want {
		if d := fromRecs[i] - want[i]; d < 0 || d > 2*time.Second {
			t.Errorf("the records' %d-th shortest last run is %v; what ran took %v (records %v)", i+1, fromRecs[i], want[i], fromRecs)
		}
	}

	srv := serveAllStates(t, e)
	code, page := get(t, client(t), srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
	kinds := bars(t, page, "kinds")
	if len(kinds) != 1 {
		t.Fatalf("the kinds chart says %q; want rtd only", kinds)
	}
	k := kinds[0]
	t.Logf("the kinds chart: %q", k)
	if !strings.Contains(k, "(12 timed)") {
		t.Errorf("the kinds chart says %q; want 12 timed (not the cancelled one nor the Expired one)", k)
	}
	m := regexp.MustCompile(`p50 ([0-9hms.µn]+), p95 ([0-9hms.µn]+)`).FindStringSubmatch(k)
	if m == nil {
		t.Fatalf("no p50/p95 in %q", k)
	}
	for i, p := range []float64{0.5, 0.95} {
		got, err := time.ParseDuration(m[i+1])
		if err != nil {
			t.Fatalf("%q: %v", m[i+1], err)
		}
		w, r := nearest(want, p), nearest(fromRecs, p)
		// The page may round; it must be within a second of the records'
		// and of what ran.
		if got < w-time.Second || got > r+time.Second {
			t.Errorf("the overview's p%.0f run time is %v; the last runs took %v (the records say %v): %q", p*100, got, w, r, k)
		}
	}
}
