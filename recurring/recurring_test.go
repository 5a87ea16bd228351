package recurring_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

type report struct {
	Name string `json:"name"`
}

func (report) Kind() string { return "report" }

// digest has kind defaults: the firing carries its attempt budget.
type digest struct{}

func (digest) Kind() string                  { return "digest" }
func (digest) JobDefaults() enqueue.Defaults { return enqueue.Defaults{MaxAttempts: 4} }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fire does what Scheduler does at a firing: it takes the schedule's input
// as stored, fills in the scheduled time, and invokes the target.
func fire(t *testing.T, r *recurring.Client, c *enqueue.Client, id, at string) enqueue.Result {
	t.Helper()
	list, err := r.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.ID == id {
			f := s.Firing
			f.ScheduledTime = at
			res, err := recurring.Fire(context.Background(), c, f)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	t.Fatalf("no schedule %s in %+v", id, list)
	return enqueue.Result{}
}

// TestRecurring (issue 12, item 1): schedules are created, updated, listed
// and removed on the emulator's EventBridge Scheduler API; firings (moto
// stores schedules but never runs them, so the test fires the stored
// input itself) enqueue through the policy path: SkipIfRunning keeps one
// active instance, AllowConcurrent one job per firing.
func TestRecurring(t *testing.T) {
	e := nexjobtest.New(t, nil)
	r := recurring.New(e.Cfg, recurring.Options{Group: "default",
		TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:nexjob-recurring", RoleARN: "arn:aws:iam::123456789012:role/nexjob-scheduler"})
	ctx := context.Background()
	skip, concurrent := e.Table+"-skip", e.Table+"-concurrent"
	if len(skip) > 64 {
		skip, concurrent = skip[len(skip)-64:], concurrent[len(concurrent)-64:]
	}
	if err := r.Recurring(ctx, skip, "cron(0 * * * ? *)", report{Name: "hourly"}, nil); err != nil {
		t.Fatal(err)
	}
	// Again, with another expression: an update, not an error.
	if err := r.Recurring(ctx, skip, "0 2 * * ? *", report{Name: "nightly"}, &recurring.Opts{Timezone: "Europe/Paris"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Recurring(ctx, concurrent, "rate(5 minutes)", report{Name: "ticker"}, &recurring.Opts{Concurrency: recurring.AllowConcurrent, MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	list, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]recurring.Schedule{}
	for _, s := range list {
		got[s.ID] = s
	}
	if s := got[skip]; s.Expression != "cron(0 2 * * ? *)" || s.Timezone != "Europe/Paris" || string(s.Firing.Args) != `{"name":"nightly"}` || s.Firing.Concurrency != recurring.SkipIfRunning || !s.Enabled {
		t.Fatalf("updated schedule %+v", s)
	}
	if s := got[concurrent]; s.Expression != "rate(5 minutes)" || s.Firing.Concurrency != recurring.AllowConcurrent || s.Firing.MaxAttempts != 2 {
		t.Fatalf("concurrent schedule %+v", s)
	}

	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(context.Context, *handler.Job[report]) error { return nil }), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})

	// SkipIfRunning: a firing while the last run is active is a duplicate.
	first := fire(t, r, e.Client, skip, "2026-12-03T02:00:00Z")
	second := fire(t, r, e.Client, skip, "2026-12-04T02:00:00Z")
	if first.Duplicate || !second.Duplicate || second.ID != first.ID {
		t.Fatalf("SkipIfRunning while active: %+v then %+v", first, second)
	}
	e.Drain(t, h)
	e.RequireState(t, first.ID, ledger.Succeeded)
	third := fire(t, r, e.Client, skip, "2026-12-05T02:00:00Z")
	if third.Duplicate || third.ID == first.ID {
		t.Fatalf("SkipIfRunning after the run ended: %+v", third)
	}
	if rec := e.Get(t, third.ID); rec.Args != `{"name":"nightly"}` || rec.Kind != "report" {
		t.Fatalf("enqueued %+v", rec)
	}

	// AllowConcurrent: each firing its own job, a firing delivered twice once.
	a := fire(t, r, e.Client, concurrent, "2026-12-03T10:00:00Z")
	again := fire(t, r, e.Client, concurrent, "2026-12-03T10:00:00Z")
	b := fire(t, r, e.Client, concurrent, "2026-12-03T10:05:00Z")
	if a.Duplicate || !again.Duplicate || again.ID != a.ID || b.Duplicate || b.ID == a.ID {
		t.Fatalf("AllowConcurrent: %+v, %+v, %+v", a, again, b)
	}
	if rec := e.Get(t, a.ID); rec.State != ledger.Enqueued || rec.MaxAttempts != 2 {
		t.Fatalf("concurrent job %+v", rec)
	}

	// The kind's JobDefaults: its MaxAttempts travels in the firing.
	defaults := e.Table + "-defaults"
	if len(defaults) > 64 {
		defaults = defaults[len(defaults)-64:]
	}
	if err := r.Recurring(ctx, defaults, "rate(1 hour)", digest{}, nil); err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, fire(t, r, e.Client, defaults, "2026-12-03T11:00:00Z").ID); rec.MaxAttempts != 4 {
		t.Fatalf("the kind's MaxAttempts: %d", rec.MaxAttempts)
	}
	if err := r.Remove(ctx, defaults); err != nil {
		t.Fatal(err)
	}

	if err := r.Remove(ctx, skip); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(ctx, skip); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if err := r.Remove(ctx, concurrent); err != nil {
		t.Fatal(err)
	}
	if list, _ := r.List(ctx); len(list) != 0 {
		for _, s := range list {
			if s.ID == skip || s.ID == concurrent {
				t.Fatalf("removed schedule still listed: %+v", s)
			}
		}
	}
	// Bad input, before any call.
	for _, tc := range []struct {
		id, expr string
		opts     *recurring.Opts
	}{{"no spaces allowed", "rate(1 hour)", nil}, {"x", "every hour", nil}, {"x", "rate(1 hour)", &recurring.Opts{Concurrency: "Sometimes"}}, {"x", "rate(1 hour)", &recurring.Opts{Timezone: "Mars/Olympus"}}} {
		if err := r.Recurring(ctx, tc.id, tc.expr, report{}, tc.opts); !errors.Is(err, enqueue.ErrInvalidInput) {
			t.Fatalf("%+v: %v", tc, err)
		}
	}
	if _, err := recurring.Fire(ctx, e.Client, recurring.Firing{V: 1, ID: "x", Kind: "report", Args: []byte("{}"), Concurrency: recurring.AllowConcurrent, ScheduledTime: "<aws.scheduler.scheduled-time>"}); !errors.Is(err, enqueue.ErrInvalidInput) {
		t.Fatalf("a firing without its time: %v", err)
	}
}

// TestScheduleInputCarriesSchedulersPlaceholder: the schedule's input
// holds <aws.scheduler.scheduled-time> literally, which Scheduler fills
// in at each firing (before, json.Marshal wrote it as
// \u003caws.scheduler.scheduled-time\u003e, which Scheduler leaves as it
// is: every AllowConcurrent firing on AWS was refused as having no
// scheduled time).
func TestScheduleInputCarriesSchedulersPlaceholder(t *testing.T) {
	_, in, err := recurring.ScheduleOf("hourly", "rate(1 hour)", digest{}, &recurring.Opts{Concurrency: recurring.AllowConcurrent})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(in), `"scheduledTime":"<aws.scheduler.scheduled-time>"`) {
		t.Fatalf("the input does not carry Scheduler's placeholder literally: %s", in)
	}
}
