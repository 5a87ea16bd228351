// Package settings is the one place every part of a nexjob deployment
// reads its configuration from: the worker, the DLQ consumer, the dispatch
// guard, a team's producers and the nexjob CLI all call Load, so they
// cannot disagree on the table, the retention, the key secret or the
// index. The CDK construct (infra) sets the same variables on every
// function it creates.
//
//	s, err := settings.Load(ctx, settings.Producer)
//	client, err := enqueue.New(s.AWS, s.Table, s.QueueURL, s.ClientOptions())
//
// # Variables
//
//	NEXJOB_TABLE                 the ledger table (every role but the guard)
//	NEXJOB_QUEUE_URL             the job queue
//	NEXJOB_DLQ_URL               its dead-letter queue (optional)
//	NEXJOB_ROLE                  worker, deadletter or guard: for one binary serving all three
//	NEXJOB_RETENTION             "succeeded=168h,failed=720h,expired=168h" (any subset; 0 keeps forever)
//	NEXJOB_INDEX_ALL_STATES      "true" lists every state (ledger.Options.IndexAllStates)
//	NEXJOB_INDEX_SHARDS          the byState index's shards per state (ledger.Options.IndexShards; default 16;
//	                             a count above 16 is recorded in the table at start, so lowering it later hides nothing)
//	NEXJOB_STEPS_TABLE           the steps table: each of a durable job's steps an item of it (ledger.Options.StepsTable;
//	                             unset: steps on the job's record, at most 100); every role that reads or runs jobs
//	NEXJOB_BLOB_BUCKET           the blob bucket: step values over 256 KB as S3 objects (ledger.Options.BlobBucket;
//	                             unset: such a value is refused); every role that reads or runs jobs
//	NEXJOB_KEY_SECRET_PARAMETER  an SSM SecureString parameter holding the key secret (every role but the guard)
//	NEXJOB_KEY_SECRET            the key secret itself (local work only: it shows in the function's configuration)
//	NEXJOB_GUARD_AFTER           a Go duration: how long the guard lets a job wait for its own message
//	NEXJOB_DASHBOARD_WRITE       "true" turns the dashboard function's write actions on
//	NEXJOB_SCHEDULE_GROUP        the EventBridge Scheduler group of recurring jobs (optional)
//	NEXJOB_FAR_SCHEDULE_GROUP    far jobs: the group of their one-time schedules, not the recurring jobs'
//	NEXJOB_FAR_ROLE_ARN          far jobs: the role Scheduler assumes to send to the job queue (with the far group: one-time schedules)
//	NEXJOB_QUEUE_ARN             far jobs: the job queue's ARN, the one-time schedules' target
//	NEXJOB_SCHEDULE_DLQ_ARN      the dead-letter queue of Scheduler's targets (far and recurring jobs' schedules); required with NEXJOB_FAR_ROLE_ARN
//	NEXJOB_QUEUES                named queues (enqueue.Opts.Queue), JSON: {"bulk":{"url":"…","arn":"…","dlq":"…"}}; arn needed with far jobs, dlq optional
//	NEXJOB_SCHEDULE_TARGET_ARN   recurring jobs: the target function's ARN
//	NEXJOB_SCHEDULER_ROLE_ARN    recurring jobs: the role Scheduler assumes to invoke it
//
// AWS settings (region, credentials, AWS_ENDPOINT_URL for an emulator)
// are the SDK's standard ones.
//
// # The key secret
//
// Every role that hashes an idempotency key reads the secret: producers,
// the worker (continuations and jobs enqueued from jobs), the DLQ
// consumer, the recurring target and operators (key lookups and
// releases). The dispatch guard does not: it re-sends what the stream
// image holds and never hashes a key, so Load never reads the parameter
// for it (NeedsKeySecret), and the construct neither passes it nor
// grants it.
//
// # How it fails
//
// Load returns a *MissingError naming the variable a role needs and does
// not have, an *InvalidError naming one whose value does not parse, an
// error saying so when the SDK has no region, and the SSM error (wrapped)
// when the key secret's parameter cannot be read. It never logs a value.
package settings

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/internal/ssmparam"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/onetime"
	"github.com/nexjob/nexjob-aws/recurring"
)

// The environment variables, one name each for every reader.
const (
	EnvTable              = "NEXJOB_TABLE"
	EnvQueueURL           = "NEXJOB_QUEUE_URL"
	EnvDLQURL             = "NEXJOB_DLQ_URL"
	EnvRole               = "NEXJOB_ROLE"
	EnvRetention          = "NEXJOB_RETENTION"
	EnvIndexAllStates     = "NEXJOB_INDEX_ALL_STATES"
	EnvIndexShards        = "NEXJOB_INDEX_SHARDS"
	EnvStepsTable         = "NEXJOB_STEPS_TABLE"
	EnvBlobBucket         = "NEXJOB_BLOB_BUCKET"
	EnvKeySecretParameter = "NEXJOB_KEY_SECRET_PARAMETER"
	EnvKeySecret          = "NEXJOB_KEY_SECRET"
	// EnvKeySecretWithheld "true": the deployment has a key secret and
	// this process is not given it (a read-only dashboard, a read-only
	// operator's CLI): it hashes no key, and a lookup by key is refused
	// (admin.ErrKeySecretWithheld) rather than answered with a hash made
	// without the secret.
	EnvKeySecretWithheld = "NEXJOB_KEY_SECRET_WITHHELD"
	EnvGuardAfter        = "NEXJOB_GUARD_AFTER"
	EnvDashboardWrite    = "NEXJOB_DASHBOARD_WRITE"
	EnvScheduleGroup     = "NEXJOB_SCHEDULE_GROUP"
	EnvFarScheduleGroup  = "NEXJOB_FAR_SCHEDULE_GROUP"
	EnvScheduleTarget    = "NEXJOB_SCHEDULE_TARGET_ARN"
	EnvSchedulerRole     = "NEXJOB_SCHEDULER_ROLE_ARN"
	EnvFarRole           = "NEXJOB_FAR_ROLE_ARN"
	EnvQueueARN          = "NEXJOB_QUEUE_ARN"
	EnvScheduleDLQARN    = "NEXJOB_SCHEDULE_DLQ_ARN"
	EnvQueues            = "NEXJOB_QUEUES"
	EnvEventBus          = "NEXJOB_EVENT_BUS"
	// EnvIdempotencyFunction is an idempotent function's name, set by the
	// construct's GrantIdempotency with its grant (not by Settings: each
	// function has its own); package idempotency reads it
	// (idempotency.EnvFunction).
	EnvIdempotencyFunction = "NEXJOB_IDEMPOTENCY_FUNCTION"
)

// Role is what the process is: each reads the variables it needs.
type Role string

// The roles.
const (
	Worker     Role = "worker"     // runs jobs (handler.Handle)
	DeadLetter Role = "deadletter" // the DLQ consumer (handler.HandleDeadLetters)
	Guard      Role = "guard"      // the dispatch guard (guard.HandleStream)
	Producer   Role = "producer"   // enqueues (a team's API)
	Operator   Role = "operator"   // the CLI and the dashboard (package admin)
	Dashboard  Role = "dashboard"  // the dashboard as a Lambda function URL
	Recurring  Role = "recurring"  // the EventBridge Scheduler target (recurring.Fire)
	Events     Role = "events"     // the completion events' publisher (completion.HandleStream)
	Idempotent Role = "idempotent" // a team's function using package idempotency
)

// Vars lists the variables a role reads, required ones first. The CDK
// construct sets every one of them on the role's function.
func Vars(r Role) []string {
	switch r {
	case Guard:
		return []string{EnvQueueURL, EnvGuardAfter, EnvQueues}
	case Events:
		return []string{EnvEventBus}
	case Idempotent:
		return []string{EnvTable}
	case Worker:
		// GuardAfter: a re-armed guard check is due as late as the guard's.
		return []string{EnvTable, EnvQueueURL, EnvDLQURL, EnvRetention, EnvIndexAllStates, EnvIndexShards, EnvStepsTable, EnvBlobBucket, EnvQueues, EnvGuardAfter}
	case Operator:
		return []string{EnvTable, EnvQueueURL, EnvDLQURL, EnvRetention, EnvIndexAllStates, EnvIndexShards, EnvStepsTable, EnvBlobBucket, EnvQueues}
	case Dashboard:
		return []string{EnvTable, EnvQueueURL, EnvDLQURL, EnvRetention, EnvIndexAllStates, EnvIndexShards, EnvStepsTable, EnvBlobBucket, EnvDashboardWrite, EnvQueues}
	}
	return []string{EnvTable, EnvQueueURL, EnvRetention, EnvIndexAllStates, EnvIndexShards, EnvStepsTable, EnvBlobBucket, EnvQueues}
}

// NeedsKeySecret says whether role r hashes idempotency keys, and so reads
// the key secret (NEXJOB_KEY_SECRET_PARAMETER or NEXJOB_KEY_SECRET) at
// start: every role but the stream's consumers (the guard, the events'
// publisher).
func NeedsKeySecret(r Role) bool { return r != Guard && r != Events }

// required is how many of Vars(r) are required.
func required(r Role) int {
	if r == Guard || r == Events || r == Idempotent {
		return 1
	}
	return 2
}

// Settings is a deployment's configuration as one process sees it.
type Settings struct {
	Role     Role
	AWS      aws.Config
	Table    string
	QueueURL string
	DLQURL   string
	// Retention of terminal records; defaults to handler.DefaultRetention.
	Retention handler.Retention
	// IndexAllStates, IndexShards and KeySecret go to ledger.Options.
	IndexAllStates bool
	IndexShards    int
	KeySecret      []byte
	// StepsTable goes to ledger.Options (NEXJOB_STEPS_TABLE).
	StepsTable string
	// BlobBucket goes to ledger.Options (NEXJOB_BLOB_BUCKET).
	BlobBucket string
	// KeySecretWithheld: the deployment has a key secret this process is
	// not given (EnvKeySecretWithheld); KeySecret is nil.
	KeySecretWithheld bool
	// GuardAfter is guard.Options.After; zero takes its default.
	GuardAfter time.Duration
	// EventBus is the completion events' bus (name or ARN).
	EventBus string
	// DashboardWrite turns the dashboard's write actions on.
	DashboardWrite bool
	// Schedules are recurring.Options: where recurring jobs' schedules
	// live and what they invoke (empty without the construct's Recurring).
	Schedules recurring.Options
	// Far is where far jobs' one-time schedules live (a group of their
	// own, NEXJOB_FAR_SCHEDULE_GROUP) and what they send to (package
	// onetime); empty without NEXJOB_FAR_ROLE_ARN: far jobs hop through
	// SQS delays then.
	Far onetime.Options
	// Queues are the named queues (NEXJOB_QUEUES), by name.
	Queues map[string]NamedQueue
}

// NamedQueue is one named queue of a deployment, as NEXJOB_QUEUES names
// it (the construct writes it).
type NamedQueue struct {
	URL    string `json:"url"`
	ARN    string `json:"arn,omitempty"` // the far jobs' schedules' target
	DLQURL string `json:"dlq,omitempty"`
}

// QueueURLs are the named queues' URLs by name (enqueue's
// ClientOptions.Queues), nil when there are none.
func (s Settings) QueueURLs() map[string]string {
	if len(s.Queues) == 0 {
		return nil
	}
	m := make(map[string]string, len(s.Queues))
	for name, q := range s.Queues {
		m[name] = q.URL
	}
	return m
}

// parseQueues reads NEXJOB_QUEUES.
func parseQueues(v string, far bool) (map[string]NamedQueue, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var qs map[string]NamedQueue
	if err := json.Unmarshal([]byte(v), &qs); err != nil {
		return nil, &InvalidError{Var: EnvQueues, Reason: `want JSON such as {"bulk":{"url":"https://…","arn":"arn:aws:sqs:…"}}`}
	}
	for name, q := range qs {
		switch {
		case !kinds.Valid(name):
			return nil, &InvalidError{Var: EnvQueues, Reason: fmt.Sprintf("queue name %q: must be %s", name, kinds.Rule)}
		case q.URL == "":
			return nil, &InvalidError{Var: EnvQueues, Reason: fmt.Sprintf("queue %q has no url", name)}
		case far && q.ARN == "":
			return nil, &InvalidError{Var: EnvQueues, Reason: fmt.Sprintf("queue %q has no arn, which far jobs' schedules target (%s is set)", name, EnvFarRole)}
		}
	}
	return qs, nil
}

// MissingError: a variable the role needs is not set.
type MissingError struct {
	Var  string
	Role Role
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("nexjob: %s must be set (the %s needs it)", e.Var, e.Role)
}

// InvalidError: a variable's value does not parse. The value is not
// repeated (it may be a secret).
type InvalidError struct {
	Var    string
	Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("nexjob: %s is invalid: %s", e.Var, e.Reason)
}

// ErrNoRegion: the SDK found no AWS region.
var ErrNoRegion = errors.New("nexjob: no AWS region: set AWS_REGION (and, for an emulator, AWS_ENDPOINT_URL)")

// Load reads the role's settings from the environment and the SDK's
// default configuration, and reads the key secret's SSM parameter if one
// is named and the role needs it (one GetParameter, decrypted).
func Load(ctx context.Context, role Role) (Settings, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return Settings{}, fmt.Errorf("nexjob: AWS configuration: %w", err)
	}
	return FromEnv(ctx, cfg, role, os.Getenv)
}

// FromEnv is Load with the SDK configuration and the environment given.
func FromEnv(ctx context.Context, cfg aws.Config, role Role, getenv func(string) string) (Settings, error) {
	switch role {
	case Worker, DeadLetter, Guard, Producer, Operator, Dashboard, Recurring, Events, Idempotent:
	default:
		return Settings{}, &InvalidError{Var: EnvRole, Reason: fmt.Sprintf("%q is not a role: worker, deadletter, guard, producer, operator, dashboard, recurring, events or idempotent", string(role))}
	}
	if cfg.Region == "" {
		return Settings{}, ErrNoRegion
	}
	for _, v := range Vars(role)[:required(role)] {
		if strings.TrimSpace(getenv(v)) == "" {
			return Settings{}, &MissingError{Var: v, Role: role}
		}
	}
	s := Settings{
		Role: role, AWS: cfg,
		Table: getenv(EnvTable), QueueURL: getenv(EnvQueueURL), DLQURL: getenv(EnvDLQURL), EventBus: getenv(EnvEventBus),
		Retention: handler.DefaultRetention,
		Schedules: recurring.Options{Group: getenv(EnvScheduleGroup), TargetARN: getenv(EnvScheduleTarget), RoleARN: getenv(EnvSchedulerRole),
			DeadLetterARN: getenv(EnvScheduleDLQARN)},
	}
	if role := getenv(EnvFarRole); role != "" {
		s.Far = onetime.Options{Group: getenv(EnvFarScheduleGroup), RoleARN: role, QueueARN: getenv(EnvQueueARN), DeadLetterARN: getenv(EnvScheduleDLQARN)}
		if s.Far.Group == "" || s.Far.QueueARN == "" || s.Far.DeadLetterARN == "" {
			// Without a DLQ Scheduler drops a message SQS refused for
			// 24 h, and the far job waits for good.
			return Settings{}, &InvalidError{Var: EnvFarRole, Reason: "one-time schedules also need " + EnvFarScheduleGroup + ", " + EnvQueueARN + " and " + EnvScheduleDLQARN}
		}
		if s.Far.Group == s.Schedules.Group {
			// Apart: a recurring grantee could update and delete far
			// jobs' schedules, a far grantee rewrite recurring ones, and
			// listings showed far jobs as recurring jobs.
			return Settings{}, &InvalidError{Var: EnvFarScheduleGroup, Reason: "far jobs' schedules need a group of their own, not " + EnvScheduleGroup + "'s"}
		}
	}
	var err error
	if s.Queues, err = parseQueues(getenv(EnvQueues), s.Far.RoleARN != ""); err != nil {
		return Settings{}, err
	}
	for name, q := range s.Queues {
		if s.Far.QueueARNs == nil {
			s.Far.QueueARNs = map[string]string{}
		}
		s.Far.QueueARNs[name] = q.ARN
	}
	if s.Retention, err = ParseRetention(getenv(EnvRetention)); err != nil {
		return Settings{}, err
	}
	if v := getenv(EnvIndexAllStates); v != "" {
		if s.IndexAllStates, err = strconv.ParseBool(v); err != nil {
			return Settings{}, &InvalidError{Var: EnvIndexAllStates, Reason: "want true or false"}
		}
	}
	if v := getenv(EnvIndexShards); v != "" {
		if s.IndexShards, err = strconv.Atoi(v); err != nil || s.IndexShards < 1 || s.IndexShards > ledger.MaxIndexShards {
			return Settings{}, &InvalidError{Var: EnvIndexShards, Reason: fmt.Sprintf("want a whole number from 1 to %d", ledger.MaxIndexShards)}
		}
	}
	s.StepsTable = getenv(EnvStepsTable)
	s.BlobBucket = getenv(EnvBlobBucket)
	if s.BlobBucket != "" && s.StepsTable == "" {
		return Settings{}, &InvalidError{Var: EnvBlobBucket, Reason: "needs " + EnvStepsTable + " (the steps' items name the objects)"}
	}
	if v := getenv(EnvDashboardWrite); v != "" {
		if s.DashboardWrite, err = strconv.ParseBool(v); err != nil {
			return Settings{}, &InvalidError{Var: EnvDashboardWrite, Reason: "want true or false"}
		}
	}
	if v := getenv(EnvGuardAfter); v != "" {
		if s.GuardAfter, err = time.ParseDuration(v); err != nil || s.GuardAfter < 0 {
			return Settings{}, &InvalidError{Var: EnvGuardAfter, Reason: "want a Go duration such as 2m"}
		}
	}
	writes := role != Guard && role != Events && role != Idempotent && (role != Dashboard || s.DashboardWrite)
	if s.IndexShards > ledger.DefaultIndexShards && writes {
		// Recorded before any write with it, so that a later deployment
		// with fewer shards still lists this one's entries (one
		// conditional UpdateItem at start; a read-only role writes no
		// index entry and is granted no write).
		st, err := ledger.New(dynamodb.NewFromConfig(cfg), s.Table, &ledger.Options{IndexShards: s.IndexShards})
		if err == nil {
			err = st.RecordIndexShards(ctx)
		}
		if err != nil {
			return Settings{}, err
		}
	}
	if !NeedsKeySecret(role) {
		return s, nil
	}
	if v := getenv(EnvKeySecretWithheld); v != "" {
		if s.KeySecretWithheld, err = strconv.ParseBool(v); err != nil {
			return Settings{}, &InvalidError{Var: EnvKeySecretWithheld, Reason: "want true or false"}
		}
	}
	switch p, raw := getenv(EnvKeySecretParameter), getenv(EnvKeySecret); {
	case s.KeySecretWithheld && (p != "" || raw != ""):
		return Settings{}, &InvalidError{Var: EnvKeySecretWithheld, Reason: "the key secret is withheld, yet " + EnvKeySecretParameter + " or " + EnvKeySecret + " is set"}
	case p != "" && raw != "":
		return Settings{}, &InvalidError{Var: EnvKeySecret, Reason: "set it or " + EnvKeySecretParameter + ", not both"}
	case p != "":
		v, err := ssmparam.Get(ctx, cfg, p)
		if err != nil {
			return Settings{}, fmt.Errorf("nexjob: read the key secret from SSM parameter %s (%s): %w", p, EnvKeySecretParameter, err)
		}
		s.KeySecret = []byte(v)
	case raw != "":
		s.KeySecret = []byte(raw)
	}
	return s, nil
}

// ParseRetention reads "succeeded=168h,failed=720h,expired=168h"; an
// outcome left out keeps handler.DefaultRetention's; "" is the default.
// Each duration is Go's (h, m, s), or a number of days with a "d".
func ParseRetention(v string) (handler.Retention, error) {
	r := handler.DefaultRetention
	if strings.TrimSpace(v) == "" {
		return r, nil
	}
	for part := range strings.SplitSeq(v, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		d, err := parseDays(val)
		if !ok || err != nil || d < 0 {
			return r, &InvalidError{Var: EnvRetention, Reason: fmt.Sprintf("%q: want outcome=duration, e.g. failed=720h or failed=30d", part)}
		}
		switch name {
		case "succeeded":
			r.Succeeded = d
		case "failed":
			r.Failed = d
		case "expired":
			r.Expired = d
		default:
			return r, &InvalidError{Var: EnvRetention, Reason: fmt.Sprintf("%q: outcomes are succeeded, failed and expired", name)}
		}
	}
	return r, nil
}

func parseDays(v string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(v, "d"); ok {
		days, err := strconv.Atoi(n)
		return time.Duration(days) * 24 * time.Hour, err
	}
	return time.ParseDuration(v)
}

// FormatRetention is ParseRetention's inverse (the construct writes it).
func FormatRetention(r handler.Retention) string {
	return fmt.Sprintf("succeeded=%s,failed=%s,expired=%s", r.Succeeded, r.Failed, r.Expired)
}

// LedgerOptions are the ledger's options these settings imply.
func (s Settings) LedgerOptions() ledger.Options {
	return ledger.Options{KeySecret: s.KeySecret, IndexAllStates: s.IndexAllStates, IndexShards: s.IndexShards, StepsTable: s.StepsTable, BlobBucket: s.BlobBucket}
}

// ClientOptions are the enqueue client's options these settings imply.
func (s Settings) ClientOptions() *enqueue.ClientOptions {
	r := s.Retention
	return &enqueue.ClientOptions{Ledger: s.LedgerOptions(), Far: s.FarScheduler(), Queues: s.QueueURLs(), Retention: &r}
}

// FarScheduler is the far jobs' one-time schedules client these settings
// name (package onetime), or nil: far jobs hop through SQS delays.
func (s Settings) FarScheduler() enqueue.FarScheduler {
	if s.Far.RoleARN == "" {
		return nil
	}
	c, err := onetime.New(scheduler.NewFromConfig(s.AWS), s.Far)
	if err != nil {
		return nil // FromEnv checked the options
	}
	return c
}

// Client returns the enqueue client of these settings. opts (nil: none)
// gives what the environment does not: Metrics, TracerProvider, XRay,
// Logger, clients, timings; its Ledger options are the settings' (the
// key secret, the index), with opts.Ledger.Now kept for tests.
//
//	client, err := s.Client(&enqueue.ClientOptions{Metrics: metrics.New(nil), TracerProvider: tp})
func (s Settings) Client(opts *enqueue.ClientOptions) (*enqueue.Client, error) {
	var o enqueue.ClientOptions
	if opts != nil {
		o = *opts
	}
	now := o.Ledger.Now
	o.Ledger = s.LedgerOptions()
	o.Ledger.Now = now
	if o.Far == nil {
		o.Far = s.FarScheduler()
	}
	if o.Queues == nil {
		o.Queues = s.QueueURLs()
	}
	if o.Retention == nil {
		r := s.Retention
		o.Retention = &r
	}
	return enqueue.New(s.AWS, s.Table, s.QueueURL, &o)
}

// HandlerOptions fills base (nil: all defaults) with these settings: the
// DLQ URL, the retention and the ledger's options. base's own Ledger.Now
// is kept (tests inject clocks).
func (s Settings) HandlerOptions(base *handler.Options) *handler.Options {
	var o handler.Options
	if base != nil {
		o = *base
	}
	if o.DLQURL == "" {
		o.DLQURL = s.DLQURL
	}
	r := s.Retention
	o.Retention = &r
	if o.Far == nil {
		o.Far = s.FarScheduler()
	}
	if o.Queues == nil {
		o.Queues = s.QueueURLs()
	}
	if o.GuardAfter == 0 {
		o.GuardAfter = s.GuardAfter // re-armed checks keep the guard's lateness (zero: its default)
	}
	now := o.Ledger.Now
	o.Ledger = s.LedgerOptions()
	o.Ledger.Now = now
	return &o
}
