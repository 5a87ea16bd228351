// Package recurring runs jobs on a schedule with Amazon EventBridge
// Scheduler, NexJob's recurring jobs: a schedule per recurring id invokes
// the small target function (lambdamain.Recurring), which enqueues the job
// through the same conditional write and policy matrix as any Enqueue.
//
//	r := recurring.New(cfg, recurring.Options{Group: g, TargetARN: fn, RoleARN: role})
//	err := r.Recurring(ctx, "nightly-report", "cron(0 2 * * ? *)", Report{}, nil)
//
// # Concurrency
//
// SkipIfRunning (the default, NexJob's): one active instance. Each firing
// enqueues with the idempotency key "nexjob-recurring:<id>": while the
// previous run is active the firing is a duplicate and nothing new runs;
// once it ended (any terminal state) the next firing starts a new job,
// whose record replaces the ended run's in the same conditional write
// (enqueue.Opts.ReplaceEnded: a later firing costs the 3 write units of
// the first, with its run; the ended run's outcome stays in the logs and
// metrics, its record is gone).
// AllowConcurrent: each firing is its own job, keyed by the recurring id
// and the firing's scheduled time.
//
// Either way one firing makes one run, whatever the retries: the firing
// (id and scheduled time) is the enqueue's Opts.RequestID, so a firing
// Scheduler delivers twice (it delivers at least once), or retries after
// an error although its job was recorded and later ran (its send failed
// and the dispatch guard sent it), gets its own job back as a duplicate,
// in whatever state, instead of a second run.
//
// # How it fails
//
// Recurring and Remove are idempotent (a create that meets its own
// schedule updates it; removing a missing schedule is done), so a lost
// reply is retried safely. A bad id, expression or args is an
// *enqueue.InputError before any call. A firing whose enqueue fails
// returns the error to Scheduler, which retries it (the schedule's retry
// policy, then its dead-letter queue, Options.DeadLetterARN): the key
// makes a retried firing enqueue once.
package recurring

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/scheduler/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/internal/redact"
	"github.com/nexjob/nexjob-aws/onetime"
)

// Concurrency is what a firing does while an earlier run is active.
type Concurrency string

// The concurrency policies.
const (
	SkipIfRunning   Concurrency = "SkipIfRunning"
	AllowConcurrent Concurrency = "AllowConcurrent"
)

// KeyPrefix starts the idempotency key of every recurring job.
const KeyPrefix = "nexjob-recurring:"

// Options say where schedules live and what they invoke.
type Options struct {
	// Group is the schedule group. Defaults to "default".
	Group string
	// TargetARN is the target function's ARN (the construct's
	// RecurringTarget). Required for Recurring.
	TargetARN string
	// RoleARN is the role Scheduler assumes to invoke it (the construct's
	// SchedulerRole). Required for Recurring.
	RoleARN string
	// DeadLetterARN is the SQS queue where Scheduler puts a firing it
	// could not deliver within the retry policy (onetime.RetryPolicy: 24
	// h, 185 retries); the job queue's DLQ, whose consumer keeps it in
	// the ledger as a non-job record, listed with the Failed jobs.
	// RoleARN must be allowed to send to it. Defaults to none: Scheduler
	// drops such a firing.
	DeadLetterARN string
}

// Opts tune one recurring job.
type Opts struct {
	// Concurrency defaults to SkipIfRunning.
	Concurrency Concurrency
	// Timezone of a cron expression (IANA name). Defaults to UTC.
	Timezone string
	// MaxAttempts of each run. Defaults to the kind's (the args type's
	// JobDefaults, read here: the target has only the JSON), else
	// enqueue's.
	MaxAttempts int
	// Queue is the named queue each run goes to. Defaults to the kind's
	// (JobDefaults, read here as MaxAttempts is), else the job queue.
	Queue string
	// Disabled creates the schedule paused. Defaults to false.
	Disabled bool
}

// Client manages recurring jobs' schedules.
type Client struct {
	s *scheduler.Client
	o Options
}

// New returns a Client. It does no I/O.
func New(cfg aws.Config, opts Options) *Client {
	if opts.Group == "" {
		opts.Group = "default"
	}
	return &Client{s: scheduler.NewFromConfig(cfg), o: opts}
}

// Firing is the input a schedule gives the target: what to enqueue.
// Scheduler fills ScheduledTime from its <aws.scheduler.scheduled-time>
// context attribute.
type Firing struct {
	V             int             `json:"v"`
	ID            string          `json:"id"`
	Kind          string          `json:"kind"`
	Args          json.RawMessage `json:"args"`
	Concurrency   Concurrency     `json:"concurrency"`
	MaxAttempts   int             `json:"maxAttempts,omitempty"`
	Queue         string          `json:"queue,omitempty"`
	ScheduledTime string          `json:"scheduledTime"`
}

// scheduledTimeAttr is Scheduler's context attribute for the firing's time.
const scheduledTimeAttr = "<aws.scheduler.scheduled-time>"

var idRE = regexp.MustCompile(`^[0-9A-Za-z_.-]{1,64}$`)

func invalid(field, reason string) error { return &enqueue.InputError{Field: field, Reason: reason} }

// expressionOf accepts cron(…), rate(…), at(…) or six bare cron fields.
func expressionOf(e string) (string, error) {
	e = strings.TrimSpace(e)
	for _, p := range []string{"cron(", "rate(", "at("} {
		if strings.HasPrefix(e, p) && strings.HasSuffix(e, ")") {
			return e, nil
		}
	}
	if len(strings.Fields(e)) == 6 {
		return "cron(" + e + ")", nil
	}
	return "", invalid("cron", fmt.Sprintf("%q is not cron(…), rate(…), at(…) or six cron fields", e))
}

// NewFiring is the input the schedule id gives its target each time, with
// no ScheduledTime (Scheduler fills it in): what Recurring stores, and
// what a test fires itself (nexjobtest's Env.FireRecurring) with no
// schedule, target or role. Bad input is an *enqueue.InputError.
func NewFiring(id string, args enqueue.JobArgs, opts *Opts) (Firing, error) {
	var o Opts
	if opts != nil {
		o = *opts
	}
	if o.Concurrency == "" {
		o.Concurrency = SkipIfRunning
	}
	if !idRE.MatchString(id) {
		return Firing{}, invalid("id", "1 to 64 letters, digits, '-', '_' or '.'")
	}
	if o.Concurrency != SkipIfRunning && o.Concurrency != AllowConcurrent {
		return Firing{}, invalid("Concurrency", fmt.Sprintf("%q is not SkipIfRunning or AllowConcurrent", o.Concurrency))
	}
	if o.MaxAttempts < 0 {
		return Firing{}, invalid("MaxAttempts", "negative")
	}
	if args == nil {
		return Firing{}, invalid("args", "nil")
	}
	if !kinds.Valid(args.Kind()) {
		return Firing{}, invalid("args", "Kind() must be "+kinds.Rule)
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return Firing{}, &enqueue.InputError{Field: "args", Reason: "cannot be encoded as JSON: " + redact.JSON(err), Err: err}
	}
	if d, ok := args.(enqueue.KindDefaults); ok {
		// The target enqueues raw JSON, with no type to ask: the kind's
		// attempt budget and queue go into the firing here.
		if o.MaxAttempts == 0 {
			o.MaxAttempts = d.JobDefaults().MaxAttempts
		}
		if o.Queue == "" {
			o.Queue = d.JobDefaults().Queue
		}
	}
	return Firing{V: 1, ID: id, Kind: args.Kind(), Args: raw, Concurrency: o.Concurrency, MaxAttempts: o.MaxAttempts, Queue: o.Queue}, nil
}

// ScheduleOf is what a schedule id firing at expr with args and opts
// holds: its expression (cron(…), rate(…), at(…)) and its target's input
// (a Firing as JSON, its time filled in by Scheduler at each firing). The
// one definition of a recurring job's schedule: Client.Recurring creates
// it at run time, the construct's JobQueue.AddRecurring at deploy time.
// Errors are *enqueue.InputError (a bad id, expression, time zone or
// args, an input over Scheduler's 8,192 bytes).
func ScheduleOf(id, expr string, args enqueue.JobArgs, opts *Opts) (expression string, input []byte, err error) {
	sched, err := expressionOf(expr)
	if err != nil {
		return "", nil, err
	}
	f, err := NewFiring(id, args, opts)
	if err != nil {
		return "", nil, err
	}
	if opts != nil && opts.Timezone != "" {
		if _, err := time.LoadLocation(opts.Timezone); err != nil {
			return "", nil, invalid("Timezone", err.Error())
		}
	}
	f.ScheduledTime = scheduledTimeAttr // Scheduler fills it in at each firing
	// Not json.Marshal: it writes '<' as \u003c, and Scheduler fills in
	// only the literal <aws.scheduler.scheduled-time> (before, every
	// firing of an AllowConcurrent schedule on AWS was refused as having
	// no scheduled time).
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(f) // ints, strings and valid JSON
	in := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(in) > 8192 {
		return "", nil, invalid("args", fmt.Sprintf("a schedule's input holds 8192 bytes; this one is %d", len(in)))
	}
	return sched, in, nil
}

// Recurring creates or updates the schedule id, firing at expr, that
// enqueues args each time (see "Concurrency").
func (c *Client) Recurring(ctx context.Context, id, expr string, args enqueue.JobArgs, opts *Opts) error {
	if c.o.TargetARN == "" || c.o.RoleARN == "" {
		return invalid("Options", "TargetARN and RoleARN are required to create schedules: NEXJOB_SCHEDULE_TARGET_ARN and NEXJOB_SCHEDULER_ROLE_ARN "+
			"(the construct's Recurring prop sets them; on an emulator, nexjob provision NAME --recurring prints them)")
	}
	var o Opts
	if opts != nil {
		o = *opts
	}
	sched, in, err := ScheduleOf(id, expr, args, opts)
	if err != nil {
		return err
	}
	state := types.ScheduleStateEnabled
	if o.Disabled {
		state = types.ScheduleStateDisabled
	}
	rp := onetime.RetryPolicy
	target := &types.Target{Arn: aws.String(c.o.TargetARN), RoleArn: aws.String(c.o.RoleARN), Input: aws.String(string(in)), RetryPolicy: &rp}
	if c.o.DeadLetterARN != "" {
		target.DeadLetterConfig = &types.DeadLetterConfig{Arn: aws.String(c.o.DeadLetterARN)}
	}
	window := &types.FlexibleTimeWindow{Mode: types.FlexibleTimeWindowModeOff}
	var tz *string
	if o.Timezone != "" {
		tz = aws.String(o.Timezone)
	}
	_, err = c.s.CreateSchedule(ctx, &scheduler.CreateScheduleInput{
		Name: aws.String(id), GroupName: aws.String(c.o.Group), ScheduleExpression: aws.String(sched),
		ScheduleExpressionTimezone: tz, Target: target, FlexibleTimeWindow: window, State: state,
	})
	var conflict *types.ConflictException
	if errors.As(err, &conflict) {
		_, err = c.s.UpdateSchedule(ctx, &scheduler.UpdateScheduleInput{
			Name: aws.String(id), GroupName: aws.String(c.o.Group), ScheduleExpression: aws.String(sched),
			ScheduleExpressionTimezone: tz, Target: target, FlexibleTimeWindow: window, State: state,
		})
	}
	if err != nil {
		return c.scheduleError(ctx, id, err)
	}
	return nil
}

// scheduleError is err of a create or update of schedule id, naming the
// missing piece when it is the group (one GetScheduleGroup, on this path
// only): Scheduler's answer does not always say (an emulator's is a 500
// with a page of HTML).
func (c *Client) scheduleError(ctx context.Context, id string, err error) error {
	_, gerr := c.s.GetScheduleGroup(ctx, &scheduler.GetScheduleGroupInput{Name: aws.String(c.o.Group)})
	var nf *types.ResourceNotFoundException
	if errors.As(gerr, &nf) {
		return fmt.Errorf("nexjob: schedule recurring job %s: schedule group %q does not exist (NEXJOB_SCHEDULE_GROUP names it; the construct's Recurring prop makes it, on an emulator nexjob provision NAME --recurring): %w",
			id, c.o.Group, err)
	}
	return fmt.Errorf("nexjob: schedule recurring job %s: %w", id, err)
}

// Schedule is one recurring job as Scheduler holds it.
type Schedule struct {
	ID         string
	Expression string
	Timezone   string
	Enabled    bool
	Firing     Firing    // what each firing enqueues
	Created    time.Time // when the schedule was made (a rate's start)
}

// NextFiring is the schedule's next firing after now (see Next); false
// for a disabled schedule or one Next does not evaluate.
func (s Schedule) NextFiring(now time.Time) (time.Time, bool) {
	if !s.Enabled {
		return time.Time{}, false
	}
	return Next(s.Expression, s.Timezone, s.Created, now)
}

// List returns the group's recurring jobs (one ListSchedules page per 100
// and one GetSchedule each). Schedules of the group that are not nexjob's
// recurring jobs are left out. Far jobs' one-time schedules are in a
// group of their own (package onetime, NEXJOB_FAR_SCHEDULE_GROUP), so
// they are neither read nor listed here.
func (c *Client) List(ctx context.Context) ([]Schedule, error) {
	var out []Schedule
	p := scheduler.NewListSchedulesPaginator(c.s, &scheduler.ListSchedulesInput{GroupName: aws.String(c.o.Group)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("nexjob: list schedules of group %s: %w", c.o.Group, err)
		}
		for _, s := range page.Schedules {
			got, err := c.s.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: s.Name, GroupName: aws.String(c.o.Group)})
			var nf *types.ResourceNotFoundException
			if errors.As(err, &nf) {
				continue // removed meanwhile
			}
			if err != nil {
				return nil, fmt.Errorf("nexjob: read schedule %s: %w", aws.ToString(s.Name), err)
			}
			var f Firing
			if got.Target == nil || json.Unmarshal([]byte(aws.ToString(got.Target.Input)), &f) != nil || f.V != 1 || len(f.Args) == 0 || f.Concurrency == "" {
				continue // not a firing (a far job's message, made before far jobs had a group of their own)
			}
			out = append(out, Schedule{ID: aws.ToString(got.Name), Expression: aws.ToString(got.ScheduleExpression),
				Timezone: aws.ToString(got.ScheduleExpressionTimezone), Enabled: got.State == types.ScheduleStateEnabled, Firing: f,
				Created: aws.ToTime(got.CreationDate)})
		}
	}
	return out, nil
}

// Remove deletes the schedule id; a missing one is not an error. Jobs it
// already enqueued are left alone.
func (c *Client) Remove(ctx context.Context, id string) error {
	_, err := c.s.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: aws.String(id), GroupName: aws.String(c.o.Group)})
	var nf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &nf) {
		return fmt.Errorf("nexjob: remove recurring job %s: %w", id, err)
	}
	return nil
}

// rawArgs carries a firing's args, already JSON, under its kind.
type rawArgs struct {
	kind string
	raw  json.RawMessage
}

func (a rawArgs) Kind() string                 { return a.kind }
func (a rawArgs) MarshalJSON() ([]byte, error) { return a.raw, nil }

// Fire enqueues one firing through c: the target function's whole work.
// SkipIfRunning returns the active run as a duplicate; AllowConcurrent
// keys the job by the firing's scheduled time.
func Fire(ctx context.Context, c *enqueue.Client, f Firing) (enqueue.Result, error) {
	if f.V != 1 || !idRE.MatchString(f.ID) || f.Kind == "" || len(f.Args) == 0 {
		return enqueue.Result{}, invalid("firing", "not a nexjob recurring firing")
	}
	key := KeyPrefix + f.ID
	switch f.Concurrency {
	case SkipIfRunning:
	case AllowConcurrent:
		if f.ScheduledTime == "" || f.ScheduledTime == scheduledTimeAttr {
			return enqueue.Result{}, invalid("firing", "no scheduled time (the schedule's input must carry <aws.scheduler.scheduled-time>)")
		}
		key += ":" + f.ScheduledTime
	default:
		return enqueue.Result{}, invalid("firing", fmt.Sprintf("concurrency %q", f.Concurrency))
	}
	// The firing is the request: Scheduler delivers it at least once and
	// retries a failed one, and a delivery that finds the job it created
	// (ended, even) gets it back instead of a second run.
	// Firings come in order: a late retry of one (Scheduler's, after its
	// send failed) that meets a later firing's record gets it back
	// rather than run again (RequestTime).
	var request string
	var at time.Time
	if f.ScheduledTime != "" && f.ScheduledTime != scheduledTimeAttr {
		request = "nexjob-recurring-firing:" + f.ID + "@" + f.ScheduledTime
		at, _ = time.Parse(time.RFC3339, f.ScheduledTime) // zero if not: ordered by the request alone
	}
	return c.Enqueue(ctx, rawArgs{kind: f.Kind, raw: f.Args}, &enqueue.Opts{IdempotencyKey: key, RequestID: request, RequestTime: at, MaxAttempts: f.MaxAttempts, Queue: f.Queue, DuplicatePolicy: enqueue.AllowAfterFailed, ReplaceEnded: true})
}
