package recurring_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/recurring"
)

// A recurring job's CreateSchedule (its target with the DLQ and the
// retry policy, issue 27 item 21) applied with its reply lost: the SDK's
// resend meets it, the update that follows writes the same, and one
// schedule names the DLQ. Throttled past the SDK's retries: an error and
// no schedule; the caller's retry makes it.
func TestRecurringScheduleUnderFaults(t *testing.T) {
	for _, fault := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			e := awstest.New(t, nil)
			ctx := context.Background()
			sched := scheduler.NewFromConfig(e.Cfg)
			group := "rec-" + e.Table[len(e.Table)-9:]
			if _, err := sched.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
				t.Fatal(err)
			}
			ft, cfg := e.Faulty()
			dlq := "arn:aws:sqs:us-east-1:123456789012:jobs-dlq"
			r := recurring.New(cfg, recurring.Options{Group: group, TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:t",
				RoleARN: "arn:aws:iam::123456789012:role/s", DeadLetterARN: dlq})
			times := 1
			if fault == faults.Throttle {
				times = faults.Attempts
			}
			h := ft.Add(faults.Rule{Op: "Scheduler.CreateSchedule", Fault: fault, Times: times})
			err := r.Recurring(ctx, "nightly", "cron(0 2 * * ? *)", report{Name: "n"}, nil)
			if got := h.Fired(); got != times {
				t.Fatalf("fault fired %d times, want %d", got, times)
			}
			if fault == faults.Throttle {
				if err == nil {
					t.Fatal("CreateSchedule throttled past the retries: no error")
				}
				if list, _ := sched.ListSchedules(ctx, &scheduler.ListSchedulesInput{GroupName: aws.String(group)}); len(list.Schedules) != 0 {
					t.Fatalf("%d schedules after a refused create", len(list.Schedules))
				}
				err = r.Recurring(ctx, "nightly", "cron(0 2 * * ? *)", report{Name: "n"}, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String("nightly"), GroupName: aws.String(group)})
			if err != nil || got.Target.DeadLetterConfig == nil || aws.ToString(got.Target.DeadLetterConfig.Arn) != dlq {
				t.Fatalf("the schedule: %v, target %+v; want its DLQ %s", err, got.Target, dlq)
			}
		})
	}
}
