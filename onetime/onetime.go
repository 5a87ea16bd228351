// Package onetime carries a far job's message to its run time with one
// EventBridge Scheduler one-time schedule instead of SQS delay hops: a job
// 30 days ahead made 2,880 hops of 900 s (receive, send, delete, a share of
// an invocation each); with a schedule it costs one CreateSchedule,
// Scheduler's one SendMessage two minutes before the run time (Lead) and
// the worker's carry of it to the run time, whatever the distance.
//
// A schedule is named after the job and its run time, "nj-<job id>-<run
// second>" (Name): one name per run of a job, never reused for another
// time. It fires Lead (two minutes) before the run time, at(run time less
// Lead), with no flexible window, sends the message's body (which names
// the run time) to the job's queue through the construct's scheduler
// role, and deletes itself after (ActionAfterCompletion DELETE). The
// worker carries a message that comes before its run time the rest of
// the way with an SQS delay, so a far run starts at its time, to the
// second, as a near one does, although Scheduler fires within a minute of
// a schedule's time, not on it (see Lead). A send that SQS
// refuses is retried by Scheduler for 24 hours (RetryPolicy), then the
// message goes to the dead-letter queue (Options.DeadLetterARN), whose
// consumer sends the job back: without one Scheduler dropped it and
// deleted the schedule, and the job stayed Scheduled for good. A schedule
// that fires for a job no longer waiting does nothing: the worker's claim
// refuses it, as it refuses any stray copy.
//
// Why per run time: a name per job was written again for the job's next
// run (a far retry, a debounce fold's carry, a later rate-limit slot),
// and a delete meant for the earlier run (a cancel's slow DeleteSchedule,
// or a fired schedule's own ActionAfterCompletion DELETE, which Scheduler
// applies after the firing, at a time of its choosing) could land after
// that write and remove the later run's schedule: the job stayed
// Scheduled with nothing to send it. Now a delete names a run time, and no
// later run shares it.
//
// # How it fails
//
// Schedule is idempotent: a create that meets its own name (a resend of
// an applied create, or the same run dispatched again) updates the
// schedule to the body given, and an update that finds the schedule gone
// (it fired, or a cancel removed it, between the two) creates it again;
// a lost reply reads as done. Ensure, the dispatch guard's check of a far
// job, is one create, and meeting the name is done (the name is the run:
// its message is there already). Unschedule of a missing schedule is done.
// Any other error is returned wrapped: the caller treats it as a failed
// send (the job is marked unsent; a retry of its key, or the dispatch
// guard, sends it again).
package onetime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/scheduler/types"
)

// Options name where the schedules live and what they send to.
type Options struct {
	// Group is the far jobs' schedule group (the construct's
	// FarScheduleGroup: their own, never the recurring jobs'). Required.
	Group string
	// QueueARN is the job queue's ARN, the schedules' target. Required.
	QueueARN string
	// RoleARN is the role Scheduler assumes to send to the queue
	// (sqs:SendMessage on it only). Required.
	RoleARN string
	// QueueARNs are the named queues' ARNs (name → ARN), the targets of
	// schedules for jobs on them. Defaults to none.
	QueueARNs map[string]string
	// DeadLetterARN is the SQS queue where Scheduler puts a message it
	// could not send within the targets' retry policy (RetryPolicy: 24 h,
	// 185 retries): the job queue's DLQ, whose consumer sends a job that
	// never started back. RoleARN must be allowed to send to it. Defaults
	// to none: Scheduler drops such a message (the settings and the
	// construct always set it).
	DeadLetterARN string
}

// Lead is how long before its run time a schedule fires. EventBridge
// Scheduler invokes targets with 60 second precision (its user guide,
// "Schedule types": a schedule set for 1:00 invokes its target between
// 1:00:00 and 1:00:59), so a schedule at the run time sent its message up
// to a minute late, and work that must start on its time did not (a
// throttled start whose message came more than a second after its slot
// took a new slot an hour on, every hour while the firings stayed late;
// a job whose deadline fell within that minute expired unrun). Two
// minutes: the documented minute, and a minute more for Scheduler's send
// to reach the queue and the worker's event source to receive it, and for
// a firing later than documented. A firing up to Lead late comes by the
// run time; the worker carries it the rest of the way with an SQS delay
// (one send, no DynamoDB request). One later still (Scheduler retrying a
// send SQS refused, an outage) is handled late, as a late SQS message is.
// A schedule's run time must be more than Lead ahead when it is made
// (enqueue.MinFarAfter).
const Lead = 2 * time.Minute

// RetryPolicy is every schedule target's: Scheduler retries a send SQS
// refuses (throttling, an outage) for up to 24 hours and 185 times, then
// puts the message in Options.DeadLetterARN.
var RetryPolicy = types.RetryPolicy{MaximumEventAgeInSeconds: aws.Int32(86400), MaximumRetryAttempts: aws.Int32(185)}

// Scheduler is the part of *scheduler.Client this package uses.
type Scheduler interface {
	CreateSchedule(context.Context, *scheduler.CreateScheduleInput, ...func(*scheduler.Options)) (*scheduler.CreateScheduleOutput, error)
	UpdateSchedule(context.Context, *scheduler.UpdateScheduleInput, ...func(*scheduler.Options)) (*scheduler.UpdateScheduleOutput, error)
	DeleteSchedule(context.Context, *scheduler.DeleteScheduleInput, ...func(*scheduler.Options)) (*scheduler.DeleteScheduleOutput, error)
}

// Client makes and removes one-time schedules. It is safe for concurrent
// use.
type Client struct {
	s Scheduler
	o Options
}

// New returns a Client; it does no I/O. Missing options are an error.
func New(s Scheduler, o Options) (*Client, error) {
	if s == nil || o.Group == "" || o.QueueARN == "" || o.RoleARN == "" {
		return nil, errors.New("nexjob: one-time schedules need a Scheduler client, Group, QueueARN and RoleARN")
	}
	return &Client{s: s, o: o}, nil
}

// Name is the schedule name of a job's run at runAt: "nj-" + job id +
// "-" + the run's second (rounded up, as the schedule's at() is) in base
// 32. Within Scheduler's 64 characters for every job id (53 at most).
func Name(jobID string, runAt time.Time) string {
	return "nj-" + jobID + "-" + strconv.FormatInt(second(runAt).Unix(), 32)
}

// second is t rounded up to the second: when an at() schedule fires.
func second(t time.Time) time.Time { return t.UTC().Add(time.Second - 1).Truncate(time.Second) }

// Schedule makes (or refreshes) the schedule name to send body, the
// message of a run at at, Lead before at (rounded up to the second, UTC)
// to the named queue, "" the job queue. The name should be Name(job,
// at): one schedule per run time.
func (c *Client) Schedule(ctx context.Context, name string, at time.Time, queue, body string) error {
	arn, err := c.queueARN(name, queue)
	if err != nil {
		return err
	}
	create := func() error {
		_, err := c.s.CreateSchedule(ctx, c.createInput(name, at, arn, body))
		return err
	}
	var conflict *types.ConflictException
	var gone *types.ResourceNotFoundException
	err = create()
	if errors.As(err, &conflict) {
		// Ours already (a resent create, or the run dispatched again):
		// the body given wins.
		in := c.createInput(name, at, arn, body)
		_, err = c.s.UpdateSchedule(ctx, &scheduler.UpdateScheduleInput{
			Name: in.Name, GroupName: in.GroupName, ScheduleExpression: in.ScheduleExpression,
			ScheduleExpressionTimezone: in.ScheduleExpressionTimezone, Target: in.Target,
			FlexibleTimeWindow: in.FlexibleTimeWindow, ActionAfterCompletion: in.ActionAfterCompletion,
		})
		if errors.As(err, &gone) {
			// Gone between the two (it fired and deleted itself, or a
			// cancel removed it): made again. A conflict now is the same
			// run's schedule, made meanwhile by another dispatch.
			if err = create(); errors.As(err, &conflict) {
				err = nil
			}
		}
	}
	if err != nil {
		return fmt.Errorf("nexjob: schedule %s: %w", name, err)
	}
	return nil
}

// Ensure makes the schedule name to send body Lead before at, unless it exists:
// a create that meets the name is done, with no update. For the
// dispatch guard's check of a far job: a name is one run of one job
// (Name), so a schedule of that name already sends this run's message.
// One CreateSchedule, which Scheduler refuses or applies; a lost reply's
// resend meets its own schedule.
func (c *Client) Ensure(ctx context.Context, name string, at time.Time, queue, body string) error {
	arn, err := c.queueARN(name, queue)
	if err != nil {
		return err
	}
	_, err = c.s.CreateSchedule(ctx, c.createInput(name, at, arn, body))
	var conflict *types.ConflictException
	if err != nil && !errors.As(err, &conflict) {
		return fmt.Errorf("nexjob: schedule %s: %w", name, err)
	}
	return nil
}

// queueARN is the target of a schedule for the named queue ("" the job
// queue).
func (c *Client) queueARN(name, queue string) (string, error) {
	if queue == "" {
		return c.o.QueueARN, nil
	}
	arn, ok := c.o.QueueARNs[queue]
	if !ok {
		return "", fmt.Errorf("nexjob: schedule %s: no ARN for the named queue %q (Options.QueueARNs)", name, queue)
	}
	return arn, nil
}

// createInput is the schedule name: at(at less Lead) in UTC, no flexible
// window, sending body to the queue arn through the role, deleted once
// fired.
func (c *Client) createInput(name string, at time.Time, arn, body string) *scheduler.CreateScheduleInput {
	return &scheduler.CreateScheduleInput{
		Name: aws.String(name), GroupName: aws.String(c.o.Group),
		ScheduleExpression:         aws.String("at(" + second(at.Add(-Lead)).Format("2006-01-02T15:04:05") + ")"),
		ScheduleExpressionTimezone: aws.String("UTC"),
		Target:                     c.target(arn, body),
		FlexibleTimeWindow:         &types.FlexibleTimeWindow{Mode: types.FlexibleTimeWindowModeOff},
		ActionAfterCompletion:      types.ActionAfterCompletionDelete,
	}
}

// target sends body to the queue arn through the role, retried for 24
// hours, then to the dead-letter queue.
func (c *Client) target(arn, body string) *types.Target {
	rp := RetryPolicy
	t := &types.Target{Arn: aws.String(arn), RoleArn: aws.String(c.o.RoleARN), Input: aws.String(body), RetryPolicy: &rp}
	if c.o.DeadLetterARN != "" {
		t.DeadLetterConfig = &types.DeadLetterConfig{Arn: aws.String(c.o.DeadLetterARN)}
	}
	return t
}

// Unschedule removes the schedule name; a missing one is done.
func (c *Client) Unschedule(ctx context.Context, name string) error {
	_, err := c.s.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: aws.String(name), GroupName: aws.String(c.o.Group)})
	var nf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &nf) {
		return fmt.Errorf("nexjob: unschedule %s: %w", name, err)
	}
	return nil
}

// QueueARN turns an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME,
// or an emulator's http://HOST/ACCOUNT/NAME) into its ARN.
func QueueARN(region, queueURL string) (string, error) {
	parts := strings.Split(strings.TrimRight(queueURL, "/"), "/")
	if len(parts) < 2 {
		return "", fmt.Errorf("nexjob: %q is not a queue URL", queueURL)
	}
	return fmt.Sprintf("arn:aws:sqs:%s:%s:%s", region, parts[len(parts)-2], parts[len(parts)-1]), nil
}
