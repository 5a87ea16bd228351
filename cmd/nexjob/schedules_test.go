package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/onetime"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// TestSchedulesListsOnlyRecurringJobs (issue 27 item 22): far jobs'
// one-time schedules live in a group of their own
// (NEXJOB_FAR_SCHEDULE_GROUP), so `nexjob schedules` (and the dashboard's
// page) lists the recurring jobs only. They shared the recurring jobs'
// group, and every far job was listed as a recurring job (one GetSchedule
// each); a recurring grantee could update and delete them, a far grantee
// rewrite recurring schedules whose id starts with "nj".
func TestSchedulesListsOnlyRecurringJobs(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	sched := scheduler.NewFromConfig(r.e.Cfg)
	recGroup, farGroup := "rec-"+r.e.Table[len(r.e.Table)-9:], "far-"+r.e.Table[len(r.e.Table)-9:]
	for _, g := range []string{recGroup, farGroup} {
		if _, err := sched.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(g)}); err != nil {
			t.Fatal(err)
		}
	}
	queueARN, _ := onetime.QueueARN(r.e.Cfg.Region, r.e.QueueURL)
	dlqARN, _ := onetime.QueueARN(r.e.Cfg.Region, r.e.DLQURL)
	env := map[string]string{
		settings.EnvTable: r.e.Table, settings.EnvQueueURL: r.e.QueueURL, settings.EnvDLQURL: r.e.DLQURL,
		settings.EnvScheduleGroup: recGroup, "NEXJOB_FAR_SCHEDULE_GROUP": farGroup,
		settings.EnvScheduleTarget: "arn:aws:lambda:us-east-1:123456789012:function:t", settings.EnvSchedulerRole: "arn:aws:iam::123456789012:role/s",
		settings.EnvFarRole: "arn:aws:iam::123456789012:role/far", settings.EnvQueueARN: queueARN, settings.EnvScheduleDLQARN: dlqARN,
	}
	// A producer with the deployment's settings: a far job, a recurring job.
	s, err := settings.FromEnv(ctx, r.e.Cfg, settings.Producer, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Client(&enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, report{Name: "far"}, &enqueue.Opts{Delay: 30 * 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := recurring.New(r.e.Cfg, s.Schedules).Recurring(ctx, "nightly-report", "cron(0 2 * * ? *)", report{Name: "n"}, nil); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := r.cliAt(t, env, false, "", "schedules")
	if err != nil {
		t.Fatalf("schedules: %v\n%s", err, errOut)
	}
	var listed []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] { // past the header
		if f := strings.Fields(l); len(f) > 0 {
			listed = append(listed, f[0])
		}
	}
	if len(listed) != 1 || listed[0] != "nightly-report" {
		t.Fatalf("nexjob schedules lists %v; want the recurring job nightly-report alone:\n%s", listed, out)
	}
	for g, want := range map[string]int{recGroup: 1, farGroup: 1} {
		list, err := sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(g)})
		if err != nil || len(list.Schedules) != want {
			t.Fatalf("group %s: %v, %d schedules, want %d", g, err, len(list.Schedules), want)
		}
	}
}
