package infra

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsscheduler"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/onetime"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// scheduleGroups adds the schedule groups: the recurring jobs' (with the
// Recurring prop) and, with far schedules, the far jobs' own
// (FarScheduleGroup, and FarRole: farSchedules). Apart, so that
// GrantSchedule cannot touch far jobs' schedules, far grantees cannot
// touch recurring ones, and a recurring listing reads no far job.
//
// The recurring group ("Schedules") is made with far schedules alone
// too, unexported: far schedules were made in it before they had a group
// of their own, and deleting a group deletes its schedules (those jobs
// would wait for good). Once they have fired it stays empty.
func (q *JobQueue) scheduleGroups(c constructs.Construct, p JobQueueProps, env map[string]*string) {
	recurring, far := p.Recurring != nil && *p.Recurring, p.NoFarSchedules == nil || !*p.NoFarSchedules
	if recurring || far {
		group := awsscheduler.NewScheduleGroup(c, jsii.String("Schedules"), &awsscheduler.ScheduleGroupProps{})
		if recurring {
			q.ScheduleGroup = group
		}
	}
	if far {
		q.farSchedules(c, env)
	}
}

// recurring adds the target and Scheduler's role (the group is made by
// scheduleGroups).
func (q *JobQueue) recurring(c constructs.Construct, p JobQueueProps, env map[string]*string) {
	q.RecurringTarget = newFunction(c, p, "RecurringTarget", p.code(settings.Recurring), awscdk.Duration_Seconds(jsii.Number(30)), jsii.Number(128), env)
	q.GrantEnqueue(q.RecurringTarget)
	// Only Scheduler acting for this account may assume it (the confused
	// deputy: another account's schedule naming this role).
	q.SchedulerRole = awsiam.NewRole(c, jsii.String("SchedulerRole"), &awsiam.RoleProps{
		AssumedBy: awsiam.NewServicePrincipal(jsii.String("scheduler.amazonaws.com"), &awsiam.ServicePrincipalOpts{
			Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
		}),
	})
	q.RecurringTarget.GrantInvoke(q.SchedulerRole)
	// A firing Scheduler could not deliver goes to the DLQ (the
	// schedules' targets name it), where the consumer keeps it.
	q.DeadLetterQueue.Grant(q.SchedulerRole, jsii.String("sqs:SendMessage"))
	q.env[settings.EnvScheduleDLQARN] = q.DeadLetterQueue.QueueArn()
	q.env[settings.EnvScheduleGroup] = q.ScheduleGroup.ScheduleGroupName()
	q.env[settings.EnvScheduleTarget] = q.RecurringTarget.FunctionArn()
	q.env[settings.EnvSchedulerRole] = q.SchedulerRole.RoleArn()
}

// farSchedules adds the far jobs' schedule group and the role Scheduler
// assumes to send their messages (package onetime), and their settings.
func (q *JobQueue) farSchedules(c constructs.Construct, env map[string]*string) {
	q.FarScheduleGroup = awsscheduler.NewScheduleGroup(c, jsii.String("FarSchedules"), &awsscheduler.ScheduleGroupProps{})
	q.FarRole = awsiam.NewRole(c, jsii.String("FarScheduleRole"), &awsiam.RoleProps{
		AssumedBy: awsiam.NewServicePrincipal(jsii.String("scheduler.amazonaws.com"), &awsiam.ServicePrincipalOpts{
			Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
		}),
	})
	q.grantQueues(q.FarRole, "sqs:SendMessage")
	// A message SQS refused for 24 hours goes to the DLQ (the schedules'
	// targets name it, onetime.Options.DeadLetterARN), whose consumer
	// sends the job back; Scheduler dropped it before.
	q.DeadLetterQueue.Grant(q.FarRole, jsii.String("sqs:SendMessage"))
	env[settings.EnvScheduleDLQARN] = q.DeadLetterQueue.QueueArn()
	env[settings.EnvFarScheduleGroup] = q.FarScheduleGroup.ScheduleGroupName()
	env[settings.EnvFarRole] = q.FarRole.RoleArn()
	env[settings.EnvQueueARN] = q.Queue.QueueArn()
}

// grantFar lets grantee make, move and remove far jobs' one-time
// schedules (named nj-… in the far group) and pass FarRole to
// Scheduler, nothing else of Scheduler's.
func (q *JobQueue) grantFar(grantee awsiam.IGrantable) {
	q.grantFarActions(grantee, "scheduler:CreateSchedule", "scheduler:UpdateSchedule", "scheduler:DeleteSchedule")
}

// grantFarActions grants these Scheduler actions on far jobs' schedules
// (the far group's nj-…: never a recurring job's) and passing FarRole to
// Scheduler.
func (q *JobQueue) grantFarActions(grantee awsiam.IGrantable, actions ...string) {
	if q.FarRole == nil {
		return
	}
	arn := awscdk.Fn_Join(jsii.String(""), jsii.Strings("arn:", *awscdk.Aws_PARTITION(), ":scheduler:", *awscdk.Aws_REGION(), ":", *awscdk.Aws_ACCOUNT_ID(), ":schedule/", *q.FarScheduleGroup.ScheduleGroupName(), "/nj-*"))
	awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
		Grantee: grantee, Actions: jsii.Strings(actions...), ResourceArns: jsii.Strings(*arn),
	})
	grantee.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:    jsii.Strings("iam:PassRole"),
		Resources:  jsii.Strings(*q.FarRole.RoleArn()),
		Conditions: &map[string]any{"StringEquals": map[string]any{"iam:PassedToService": "scheduler.amazonaws.com"}},
	}))
}

// GrantSchedule lets grantee create, update, read, list and remove
// recurring jobs' schedules in the construct's recurring group (package
// recurring; far jobs' schedules are in a group of their own, out of its
// reach), and pass Scheduler its role. It panics without the Recurring
// prop.
func (q *JobQueue) GrantSchedule(grantee awsiam.IGrantable) {
	if q.ScheduleGroup == nil {
		panic("nexjob infra: GrantSchedule needs JobQueueProps.Recurring")
	}
	q.ScheduleGroup.GrantWriteSchedules(grantee)
	q.ScheduleGroup.GrantReadSchedules(grantee)
	q.ScheduleGroup.GrantDeleteSchedules(grantee)
	awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
		Grantee: grantee, Actions: jsii.Strings("scheduler:ListSchedules"), ResourceArns: jsii.Strings("*"),
	})
	// Pass the role to Scheduler only.
	grantee.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:    jsii.Strings("iam:PassRole"),
		Resources:  jsii.Strings(*q.SchedulerRole.RoleArn()),
		Conditions: &map[string]any{"StringEquals": map[string]any{"iam:PassedToService": "scheduler.amazonaws.com"}},
	}))
}

// AddRecurring declares recurring job id in the stack: a schedule in the
// construct's group firing at expr (cron(…), rate(…), at(…) or six bare
// cron fields) that enqueues args each time through the recurring
// target, as recurring.Client.Recurring would make it at run time (the
// same input: recurring.ScheduleOf), but created and updated by
// CloudFormation with the deploy and removed with the stack. It needs the
// Recurring prop. A bad id, expression, time zone or args panics at
// synth with the *enqueue.InputError's message: a stack that cannot
// deploy fails before it is deployed.
//
//	q.AddRecurring("nightly-report", "cron(0 2 * * ? *)", reports.Nightly{}, &recurring.Opts{Timezone: "Europe/Paris"})
func (q *JobQueue) AddRecurring(id, expr string, args enqueue.JobArgs, opts *recurring.Opts) awsscheduler.CfnSchedule {
	if q.ScheduleGroup == nil {
		panic(fmt.Sprintf("nexjob infra: AddRecurring(%q): the JobQueue needs the Recurring prop (its schedule group and target)", id))
	}
	sched, input, err := recurring.ScheduleOf(id, expr, args, opts)
	if err != nil {
		panic(fmt.Sprintf("nexjob infra: AddRecurring(%q): %v", id, err))
	}
	var o recurring.Opts
	if opts != nil {
		o = *opts
	}
	state := "ENABLED"
	if o.Disabled {
		state = "DISABLED"
	}
	var tz *string
	if o.Timezone != "" {
		tz = jsii.String(o.Timezone)
	}
	return awsscheduler.NewCfnSchedule(q.Construct, jsii.String("Recurring-"+id), &awsscheduler.CfnScheduleProps{
		Name: jsii.String(id), GroupName: q.ScheduleGroup.ScheduleGroupName(),
		ScheduleExpression: jsii.String(sched), ScheduleExpressionTimezone: tz, State: jsii.String(state),
		FlexibleTimeWindow: &awsscheduler.CfnSchedule_FlexibleTimeWindowProperty{Mode: jsii.String("OFF")},
		Target: &awsscheduler.CfnSchedule_TargetProperty{
			Arn: q.RecurringTarget.FunctionArn(), RoleArn: q.SchedulerRole.RoleArn(), Input: jsii.String(string(input)),
			RetryPolicy:      &awsscheduler.CfnSchedule_RetryPolicyProperty{MaximumEventAgeInSeconds: jsii.Number(float64(*onetime.RetryPolicy.MaximumEventAgeInSeconds)), MaximumRetryAttempts: jsii.Number(float64(*onetime.RetryPolicy.MaximumRetryAttempts))},
			DeadLetterConfig: &awsscheduler.CfnSchedule_DeadLetterConfigProperty{Arn: q.DeadLetterQueue.QueueArn()},
		},
	})
}
