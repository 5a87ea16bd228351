package recurring_test

import (
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
)

type bulkReport struct{ Day string }

func (bulkReport) Kind() string                  { return "bulk-report" }
func (bulkReport) JobDefaults() enqueue.Defaults { return enqueue.Defaults{Queue: "bulk"} }

// TestFiringGoesToTheKindsQueue: a recurring job runs on the queue its
// kind's defaults name, or the one its Opts name, as an Enqueue of it
// would (issue 30, a team's first day: the quick start's hourly report on
// "bulk" was sent to the job queue; the target enqueues raw JSON, with no
// type to ask). Before: "the firing's job went to queue \"\"; want bulk".
func TestFiringGoesToTheKindsQueue(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk", "reports"}})
	at := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	res := e.FireRecurring(t, "nightly", bulkReport{Day: "monday"}, nil, at)
	if rec := e.Get(t, res.ID); rec.Queue != "bulk" {
		t.Fatalf("the firing's job went to queue %q; want bulk", rec.Queue)
	}
	e.WantDepth(t, e.Queues["bulk"], 1, "bulk: the firing's job")
	res = e.FireRecurring(t, "other", bulkReport{Day: "tuesday"}, &recurring.Opts{Queue: "reports"}, at)
	if rec := e.Get(t, res.ID); rec.Queue != "reports" {
		t.Fatalf("Opts.Queue: the job went to %q; want reports", rec.Queue)
	}
	e.WantDepth(t, e.Queues["reports"], 1, "reports: the firing's job")
}
