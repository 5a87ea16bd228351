package guard_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/onetime"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// TestCheckSkipsJobsClaimedInTheBatch (issue 12, the guard's cost): a job
// inserted and claimed in the same stream batch gets no check message; a
// job claimed and then requeued in one batch, or never claimed, gets one.
func TestCheckSkipsJobsClaimedInTheBatch(t *testing.T) {
	e := nexjobtest.New(t, nil)
	// Checks due at once (MaxDelay 1 ns rounds up to SQS's 1 s delay).
	g := guard.New(e.SQS, e.QueueURL, &guard.Options{MaxDelay: 1})
	changes := []guard.Change{
		{ID: "claimed", Kind: "k", State: ledger.Enqueued},
		{ID: "requeued", Kind: "k", State: ledger.Processing, OldState: ledger.Enqueued, Attempt: 1},
		{ID: "claimed", Kind: "k", State: ledger.Processing, OldState: ledger.Enqueued, Attempt: 1},
		{ID: "requeued", Kind: "k", State: ledger.Enqueued, OldState: ledger.Failed},
		{ID: "waiting", Kind: "k", State: ledger.Scheduled, RunAt: 1},
	}
	if err := g.Check(context.Background(), changes); err != nil {
		t.Fatal(err)
	}
	n := e.QueueDepth(t, e.QueueURL) // visible, in flight and delayed
	var got []sqstypes.Message
	for end := time.Now().Add(time.Minute); len(got) < n && time.Now().Before(end); {
		got = append(got, e.Messages(t, e.QueueURL)...) // the delayed ones turn visible within a second
		if len(got) < n {
			time.Sleep(100 * time.Millisecond)
		}
	}
	var ids []string
	for _, m := range got {
		msg, err := enqueue.DecodeMessage(aws.ToString(m.Body))
		if err != nil || !msg.Check {
			t.Fatalf("%q: %v", aws.ToString(m.Body), err)
		}
		ids = append(ids, msg.ID)
	}
	// Distinct ids: a loaded emulator's 5xx makes the SDK resend a batch
	// it had applied (a copy of a check is harmless; its claim decides),
	// and that is not this test's question (it failed once so, beside
	// two make tests: [requeued requeued waiting waiting]).
	slices.Sort(ids)
	if ids = slices.Compact(ids); !slices.Equal(ids, []string{"requeued", "waiting"}) {
		t.Fatalf("checks sent for %v; want requeued and waiting only", ids)
	}
}

// TestFarCheckMakesTheJobsSchedule: with Far, the check of a job due 30
// days ahead makes sure of the job's own one-time schedule (its run's
// name, its message, at its run time): no check schedule, no SQS
// message. A retried batch meets the schedule: done, still one.
func TestFarCheckMakesTheJobsSchedule(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	group := "guard-" + e.Table[len(e.Table)-9:]
	sched := scheduler.NewFromConfig(e.Cfg)
	if _, err := sched.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
		t.Fatal(err)
	}
	arn, err := onetime.QueueARN(e.Cfg.Region, e.QueueURL)
	if err != nil {
		t.Fatal(err)
	}
	far, err := onetime.New(sched, onetime.Options{Group: group, QueueARN: arn, RoleARN: "arn:aws:iam::123456789012:role/far"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	g := guard.New(e.SQS, e.QueueURL, &guard.Options{Far: far, Now: func() time.Time { return now }})
	runAt := now.Add(30 * 24 * time.Hour)
	for range 2 {
		if err := g.Check(ctx, []guard.Change{{ID: "far-job", Kind: "k", State: ledger.Scheduled, RunAt: runAt.UnixMilli()}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.QueueDepth(t, e.QueueURL); n != 0 {
		t.Fatalf("%d SQS messages for a far job's check, want none", n)
	}
	list, err := sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(group)})
	if err != nil || len(list.Schedules) != 1 {
		t.Fatalf("schedules: %v %d, want the job's alone", err, len(list.Schedules))
	}
	got, err := sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(onetime.Name("far-job", runAt)), GroupName: aws.String(group)})
	if err != nil {
		t.Fatal(err)
	}
	want := "at(" + runAt.Add(-onetime.Lead).Format("2006-01-02T15:04:05") + ")" // its run time carried in the message
	msg, err := enqueue.DecodeMessage(aws.ToString(got.Target.Input))
	if aws.ToString(got.ScheduleExpression) != want || err != nil || msg.Check || msg.ID != "far-job" || msg.RunAt != runAt.UnixMilli() {
		t.Fatalf("the job's schedule: %s %q %v, want the job's message at %s", aws.ToString(got.ScheduleExpression), aws.ToString(got.Target.Input), err, want)
	}
}

// TestCheckGoesToTheJobsQueue: a job on a named queue gets its check on
// that queue (the stream image's queue attribute), in a batch of its own;
// a queue the guard was not told of falls back to the job queue, where a
// worker runs the check all the same.
func TestCheckGoesToTheJobsQueue(t *testing.T) {
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk"}})
	g := guard.New(e.SQS, e.QueueURL, &guard.Options{MaxDelay: 1, Queues: e.Queues})
	changes := []guard.Change{
		{ID: "main", Kind: "k", State: ledger.Enqueued},
		{ID: "bulk", Kind: "k", State: ledger.Enqueued, Queue: "bulk"},
		{ID: "unknown", Kind: "k", State: ledger.Enqueued, Queue: "gone"},
	}
	if err := g.Check(context.Background(), changes); err != nil {
		t.Fatal(err)
	}
	read := func(url string, n int) map[string]string {
		got := map[string]string{}
		for end := time.Now().Add(time.Minute); len(got) < n && time.Now().Before(end); {
			for _, m := range e.Messages(t, url) {
				msg, err := enqueue.DecodeMessage(aws.ToString(m.Body))
				if err != nil || !msg.Check {
					t.Fatalf("%q: %v", aws.ToString(m.Body), err)
				}
				got[msg.ID] = msg.Queue
			}
			if len(got) < n {
				time.Sleep(100 * time.Millisecond)
			}
		}
		return got
	}
	if got := read(e.Queues["bulk"], 1); len(got) != 1 || got["bulk"] != "bulk" {
		t.Fatalf("the bulk queue got %v, want the bulk job's check (queue bulk)", got)
	}
	if got := read(e.QueueURL, 2); len(got) != 2 || got["main"] != "" || got["unknown"] != "" {
		t.Fatalf("the job queue got %v, want main's and unknown's checks (queue \"\")", got)
	}
}
