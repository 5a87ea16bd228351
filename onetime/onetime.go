// Package onetime carries a far job's message to its run time with one
// EventBridge Scheduler one-time schedule instead of SQS delay hops: a job
// 30 days ahead made 2,880 hops of 900 s (receive, send, delete, a share of
// an invocation each); with a schedule it costs one CreateSchedule, and
// Scheduler's one SendMessage at the run time, whatever the distance.
//
// The schedule is named after the message ("nj-<job id>", "njc-<job id>"
// for a dispatch guard's check), fires at(run time) with no flexible
// window, sends the message's body to the job queue through the
// construct's scheduler role, and deletes itself after (ActionAfterCompletion
// DELETE). A schedule that fires for a job no longer waiting does
// nothing: the worker's claim refuses it, as it refuses any stray copy.
//
// # How it fails
//
// Schedule is idempotent: a create that meets its own name (a resend of
// an applied create, or the job dispatched again) updates the schedule to
// the time and body given, so the last dispatch wins and a lost reply
// reads as done. Unschedule of a missing schedule is done. Any other
// error is returned wrapped: the caller treats it as a failed send (the
// job is marked unsent; a retry of its key, or the dispatch guard, sends
// it again).
package onetime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/scheduler/types"
)

// Options name where the schedules live and what they send to.
type Options struct {
	// Group is the schedule group (the construct's, shared with recurring
	// jobs). Required.
	Group string
	// QueueARN is the job queue's ARN, the schedules' target. Required.
	QueueARN string
	// RoleARN is the role Scheduler assumes to send to the queue
	// (sqs:SendMessage on it only). Required.
	RoleARN string
	// QueueARNs are the named queues' ARNs (name → ARN), the targets of
	// schedules for jobs on them. Defaults to none.
	QueueARNs map[string]string
}

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

// Name is the schedule name of a job's message (check: a dispatch guard's
// check): within Scheduler's 64 characters for every job id.
func Name(jobID string, check bool) string {
	if check {
		return "njc-" + jobID
	}
	return "nj-" + jobID
}

// Schedule makes (or moves) the schedule name to send body at at
// (rounded up to the second, UTC) to the named queue, "" the job queue.
func (c *Client) Schedule(ctx context.Context, name string, at time.Time, queue, body string) error {
	arn := c.o.QueueARN
	if queue != "" {
		var ok bool
		if arn, ok = c.o.QueueARNs[queue]; !ok {
			return fmt.Errorf("nexjob: schedule %s: no ARN for the named queue %q (Options.QueueARNs)", name, queue)
		}
	}
	expr := "at(" + at.UTC().Add(time.Second-1).Truncate(time.Second).Format("2006-01-02T15:04:05") + ")"
	target := &types.Target{Arn: aws.String(arn), RoleArn: aws.String(c.o.RoleARN), Input: aws.String(body)}
	window := &types.FlexibleTimeWindow{Mode: types.FlexibleTimeWindowModeOff}
	_, err := c.s.CreateSchedule(ctx, &scheduler.CreateScheduleInput{
		Name: aws.String(name), GroupName: aws.String(c.o.Group), ScheduleExpression: aws.String(expr),
		ScheduleExpressionTimezone: aws.String("UTC"), Target: target, FlexibleTimeWindow: window,
		ActionAfterCompletion: types.ActionAfterCompletionDelete,
	})
	var conflict *types.ConflictException
	if errors.As(err, &conflict) {
		// Ours already (a resent create, or the job dispatched again):
		// the given time and body win.
		_, err = c.s.UpdateSchedule(ctx, &scheduler.UpdateScheduleInput{
			Name: aws.String(name), GroupName: aws.String(c.o.Group), ScheduleExpression: aws.String(expr),
			ScheduleExpressionTimezone: aws.String("UTC"), Target: target, FlexibleTimeWindow: window,
			ActionAfterCompletion: types.ActionAfterCompletionDelete,
		})
	}
	if err != nil {
		return fmt.Errorf("nexjob: schedule %s: %w", name, err)
	}
	return nil
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
