package handler_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// Issue 27 item 21: Scheduler's targets had no dead-letter queue and no
// retry policy of ours: a send SQS refused for 24 hours was dropped, the
// schedule deleted itself, and the far job stayed Scheduled for good.
// With the deployment's settings, far and recurring schedules' targets
// name the DLQ and the retry policy; when Scheduler gives up on a far
// job's send it puts the message there, and the DLQ consumer sends the
// job, which never started, back: it runs.
func TestSchedulerTargetsHaveADeadLetterQueue(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, true)
	ctx := context.Background()
	var mu sync.Mutex
	var bodies []string
	r.ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: faults.Pass, Times: faults.Forever, Before: func(_ *http.Request, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(b))
	}})
	recGroup := "rec-" + r.group
	if _, err := r.sched.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(recGroup)}); err != nil {
		t.Fatal(err)
	}
	queueARN, _ := onetime.QueueARN(r.cfg.Region, r.e.QueueURL)
	dlqARN, _ := onetime.QueueARN(r.cfg.Region, r.e.DLQURL)
	vars := map[string]string{
		settings.EnvTable: r.e.Table, settings.EnvQueueURL: r.e.QueueURL, settings.EnvDLQURL: r.e.DLQURL,
		settings.EnvFarRole: "arn:aws:iam::123456789012:role/far", settings.EnvFarScheduleGroup: r.group, settings.EnvScheduleGroup: recGroup, settings.EnvQueueARN: queueARN,
		settings.EnvScheduleTarget: "arn:aws:lambda:us-east-1:123456789012:function:t", settings.EnvSchedulerRole: "arn:aws:iam::123456789012:role/s",
		"NEXJOB_SCHEDULE_DLQ_ARN": dlqARN,
	}
	s, err := settings.FromEnv(ctx, r.cfg, settings.Producer, func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Client(&enqueue.ClientOptions{Ledger: ledger.Options{Now: r.clock.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Enqueue(ctx, email{To: "refused@example.com"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := recurring.New(r.cfg, s.Schedules).Recurring(ctx, "nightly", "cron(0 2 * * ? *)", email{To: "n@example.com"}, nil); err != nil {
		t.Fatal(err)
	}
	rec := r.e.Get(t, res.ID)
	far, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(onetimeName(res.ID, rec.RunAt)), GroupName: aws.String(r.group)})
	if err != nil {
		t.Fatal(err)
	}
	nightly, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String("nightly"), GroupName: aws.String(recGroup)})
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]*scheduler.GetScheduleOutput{"far job's": far, "recurring job's": nightly} {
		if got.Target.DeadLetterConfig == nil || aws.ToString(got.Target.DeadLetterConfig.Arn) != dlqARN {
			t.Errorf("the %s schedule has no dead-letter queue (target DeadLetterConfig %+v, want %s): a send refused for 24 h is dropped", name, got.Target.DeadLetterConfig, dlqARN)
		}
	}
	mu.Lock()
	for _, b := range bodies {
		if !strings.Contains(b, `"RetryPolicy":{"MaximumEventAgeInSeconds":86400,"MaximumRetryAttempts":185}`) {
			t.Errorf("a CreateSchedule sets no retry policy of ours: %s", b)
		}
	}
	mu.Unlock()
	if t.Failed() {
		return
	}
	// SQS refuses Scheduler's send for 24 hours: Scheduler gives up and
	// sends the target's input to the DLQ, as the schedule names it.
	r.clock.Advance(30*24*time.Hour + 24*time.Hour)
	if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: far.Target.Input}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sched.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: far.Name, GroupName: aws.String(r.group)}); err != nil {
		t.Fatal(err)
	}
	for _, m := range r.e.Messages(t, r.e.DLQURL) {
		if _, err := r.h.HandleDeadLetters(ctx, poller.Event(r.e.DLQURL, []sqstypes.Message{m})); err != nil {
			t.Fatal(err)
		}
	}
	r.e.Drain(t, r.h)
	if got := r.e.Get(t, res.ID); got.State != ledger.Succeeded || got.Attempt != 1 {
		t.Fatalf("the far job whose send Scheduler gave up on: %s attempt %d, want Succeeded (sent back from the DLQ)", got.State, got.Attempt)
	}
}
