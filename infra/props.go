package infra

import (
	"fmt"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

// JobQueueProps configure a JobQueue. The functions' code is required:
// Code, or WorkerCode and DeadLetterCode (and GuardCode unless NoGuard),
// or CodeDir.
type JobQueueProps struct {
	// Code of every function: one linux/arm64 binary whose main is
	// lambdamain.Serve; each function's NEXJOB_ROLE says which role it
	// serves. WorkerCode, DeadLetterCode and GuardCode override it.
	Code awslambda.Code
	// WorkerCode runs lambdamain.Worker with the team's kinds.
	WorkerCode awslambda.Code
	// DeadLetterCode runs lambdamain.DeadLetter with the same kinds (for
	// their dead-letter hooks).
	DeadLetterCode awslambda.Code
	// GuardCode runs lambdamain.Guard (no kinds needed).
	GuardCode awslambda.Code
	// CodeDir holds one directory per function, each with a `bootstrap`:
	// worker/, deadletter/, guard/ (`make lambdas` writes build/lambda/
	// for the seed's example jobs). Used for the roles no Code covers.
	CodeDir string
	// NoGuard leaves the dispatch guard out: no stream consumer, no
	// function, no check message per job (a third of an SQS request and
	// half a read unit each, plus their share of a worker invocation). A
	// job whose producer died between its write and its send then runs
	// only when a caller retries its key. Defaults to false.
	NoGuard *bool
	// ActiveTracing turns on Lambda's X-Ray active tracing on every
	// function (and grants it xray:PutTraceSegments): SQS then carries the
	// trace in each message's AWSTraceHeader, which the worker reads with
	// handler.Options.XRay. Defaults to false.
	ActiveTracing *bool
	// Retention of terminal records, passed to every function. Zero fields
	// keep handler.DefaultRetention's (7, 30, 7 days).
	Retention *Retention
	// IndexAllStates lists every state in the byState index (every
	// function must agree, so it is set here). Defaults to false.
	IndexAllStates *bool
	// IndexShards spreads each state's index entries over this many
	// partition key values (ledger.Options.IndexShards): each takes 1,000
	// index write units a second, about 500 retries a second (a retry
	// writes the index twice). Take the peak rate of Scheduled and Failed
	// writes over 500, rounded up; listing reads every shard. Every
	// function must agree, so it is set here. Defaults to 16 (8,000
	// retries a second).
	IndexShards *float64
	// KeySecretParameter names an SSM SecureString parameter holding the
	// key secret (HMAC for idempotency keys). Every function that hashes
	// keys (all but the dispatch guard, see settings.NeedsKeySecret) reads
	// it at start and is granted ssm:GetParameter on it and nothing more,
	// as GrantEnqueue, GrantRead and GrantOperate grantees are. Defaults
	// to none: plain SHA-256.
	KeySecretParameter *string
	// KeySecretKey is the customer-managed KMS key the parameter is
	// encrypted with, if it is not the account's aws/ssm key: the same
	// readers are granted kms:Decrypt on it (through SSM only).
	KeySecretKey awskms.IKey
	// FunctionTimeout of the worker. The queue's visibility timeout is six
	// times it (AWS's advice for SQS event sources), so a message comes
	// back only after a crashed run's lease (the timeout plus 5 s) is over.
	// Defaults to 30 s.
	FunctionTimeout awscdk.Duration
	// MemorySize of the worker in MB. Defaults to 256.
	MemorySize *float64
	// BatchSize of the worker's SQS event source. Defaults to 10.
	BatchSize *float64
	// MaxConcurrency caps concurrent worker invocations of the SQS event
	// source (2 to 1000). Defaults to no cap: the mapping scales as SQS's
	// own Lambda scaling allows (AWS documents up to 300 more concurrent
	// invocations a minute, to 1,000 batches at once per mapping in
	// standard mode; ProvisionedPollers goes further).
	MaxConcurrency *float64
	// ReservedConcurrency reserves (and caps) the worker function's
	// concurrent executions, so other functions of the account cannot
	// starve it nor it them. Defaults to none (the account's unreserved
	// pool).
	ReservedConcurrency *float64
	// MaxBatchingWindow lets the event source wait up to this long to
	// fill a batch (fewer, fuller invocations at high rates; up to that
	// much latency at low ones). Defaults to none: a batch goes as soon as
	// a message is there.
	MaxBatchingWindow awscdk.Duration
	// ProvisionedPollers, when set, provisions the event source's pollers
	// (SQS: minimum 2 to 200, maximum 2 to 2,000): they scale faster and
	// further than the default mapping's, billed while provisioned (AWS's
	// event poller units). It and MaxConcurrency exclude each other (cap
	// the pollers with its MaximumPollers instead). Defaults to none.
	ProvisionedPollers *awslambda.ProvisionedPollerConfig
	// MaxReceiveCount: receives of one message before it moves to the DLQ.
	// Retries are new messages and never count. Defaults to 5.
	MaxReceiveCount *float64
	// GuardAfter: how long past its run time an unsent job waits before
	// the dispatch guard runs it. Defaults to 2 minutes.
	GuardAfter awscdk.Duration
	// OldestMessageAlarm: the job queue alarms when its oldest message is
	// older than this. Defaults to 15 minutes.
	OldestMessageAlarm awscdk.Duration
	// FailureRateAlarm: percent of finished jobs (Succeeded + Failed, all
	// kinds, 5 minutes) that Failed, above which the alarm fires twice in
	// a row. Defaults to 10.
	FailureRateAlarm *float64
	// RemovalPolicy of the table. Defaults to RETAIN.
	RemovalPolicy awscdk.RemovalPolicy
	// WebDashboard adds the web dashboard (package dashboard) as a
	// function behind a Lambda function URL with IAM auth: only principals
	// allowed lambda:InvokeFunctionUrl on it (grant with
	// JobQueue.WebDashboard.GrantInvokeUrl) can open it, through a
	// SigV4-signing proxy. Defaults to nil: no dashboard function.
	WebDashboard *WebDashboardProps
	// Recurring adds what recurring jobs (package recurring) need: an
	// EventBridge Scheduler schedule group (theirs alone: far jobs'
	// schedules have FarScheduleGroup), the target function (role
	// recurring; it enqueues each firing), and the role Scheduler assumes
	// to invoke it (and to put an undelivered firing in the DLQ), and
	// sets NEXJOB_SCHEDULE_* in Settings(Producer). Grant GrantSchedule to
	// whoever creates schedules. Defaults to false.
	Recurring *bool
	// CompletionEvents publishes each job's end (Succeeded, Failed,
	// Expired) to an EventBridge bus (package completion): a function
	// of role events on the table's stream, filtered to ends, granted
	// events:PutEvents on that bus alone; the bus is the construct's own
	// (JobQueue.EventBus) unless CompletionEventsProps.Bus names another.
	// Defaults to nil: none.
	CompletionEvents *CompletionEventsProps
	// NoFarSchedules leaves out far jobs' one-time schedules: a job due
	// more than 15 minutes ahead then hops through SQS delays of 900 s
	// (2,880 hops for 30 days). By default the construct makes their
	// schedule group (FarScheduleGroup: their own, apart from the
	// recurring jobs'), FarRole, the role Scheduler assumes to send a far
	// job's message to the queue (and, after 24 h of refusals, to the
	// DLQ), and grants producers, the worker, the DLQ consumer and
	// operators the schedule actions on that group's nj-… schedules, the
	// guard CreateSchedule there. Defaults to false.
	NoFarSchedules *bool
	// Environment is added to every function's (settings of your own).
	Environment *map[string]*string
	// NamedQueues adds queues that jobs choose by name (enqueue.Opts.Queue,
	// a kind's Defaults.Queue), each with its own DLQ, its own event
	// source on the worker with its own MaxConcurrency, batch size and
	// batching window, and a DLQ alarm: a bulk import on one cannot take
	// the concurrency that payments on another need. Every function and
	// Settings(role) get NEXJOB_QUEUES; the grants cover every queue.
	// Taking one out deletes its queue, DLQ and event sources with their
	// messages: jobs that waited on it are stranded until `nexjob
	// move-queue NAME` moves them (see the README). Defaults to none.
	NamedQueues []NamedQueueProps
}

// NamedQueueProps configure one named queue.
type NamedQueueProps struct {
	// Name, as jobs name it (letters, digits, "-", "_", ".", ":"; at most
	// 64). Required.
	Name *string
	// MaxConcurrency caps the worker invocations this queue's event
	// source runs at once (2 to 1000). Defaults to no cap (the queue then
	// isolates only its backlog, not its share of the worker's
	// concurrency).
	MaxConcurrency *float64
	// BatchSize of its event source. Defaults to JobQueueProps.BatchSize.
	BatchSize *float64
	// MaxBatchingWindow of its event source. Defaults to none.
	MaxBatchingWindow awscdk.Duration
}

// NamedQueue is one named queue as deployed.
type NamedQueue struct {
	Queue           awssqs.Queue
	DeadLetterQueue awssqs.Queue
	DLQDepthAlarm   awscloudwatch.Alarm
}

// WebDashboardProps configure the dashboard function.
type WebDashboardProps struct {
	// Write turns the requeue, cancel, delete, redrive and signal actions
	// on (and grants them: GrantOperate and GrantSignal). Defaults to
	// false: read-only, read grants only.
	Write *bool
	// Code runs lambdamain.Dashboard (or lambdamain.Serve). Defaults to
	// JobQueueProps.Code, else CodeDir/dashboard.
	Code awslambda.Code
}

// Retention of terminal records; nil fields keep the default.
type Retention struct {
	Succeeded, Failed, Expired awscdk.Duration
}

// BootstrapCode is the code in dir, which must hold a `bootstrap`
// (GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc
// -trimpath -ldflags=-s -o dir/bootstrap: stripped, as make sizes
// measures them; without -ldflags=-s the binary is about 40 % larger).
// It panics with a message naming dir when it does not, instead of the
// CDK's error at deployment.
func BootstrapCode(dir string) awslambda.Code {
	if fi, err := os.Stat(filepath.Join(dir, "bootstrap")); err != nil || fi.IsDir() {
		panic(fmt.Sprintf("nexjob infra: %s has no bootstrap: build your main there with GOOS=linux GOARCH=arm64 go build -tags lambda.norpc -o %s", dir, filepath.Join(dir, "bootstrap")))
	}
	return awslambda.Code_FromAsset(jsii.String(dir), nil)
}

func withDefaults(props *JobQueueProps) JobQueueProps {
	var p JobQueueProps
	if props != nil {
		p = *props
	}
	for _, r := range []settings.Role{settings.Worker, settings.DeadLetter, settings.Guard} {
		if r == settings.Guard && p.NoGuard != nil && *p.NoGuard {
			continue
		}
		if p.roleCode(r) == nil && p.CodeDir == "" {
			panic(fmt.Sprintf("nexjob infra: no code for the %s: set JobQueueProps.Code (one binary running lambdamain.Serve), or %s, or CodeDir", r, codeProp(r)))
		}
	}
	if p.NoGuard == nil {
		p.NoGuard = jsii.Bool(false)
	}
	if p.IndexAllStates == nil {
		p.IndexAllStates = jsii.Bool(false)
	}
	if p.ProvisionedPollers != nil && p.MaxConcurrency != nil {
		panic("nexjob infra: ProvisionedPollers and MaxConcurrency exclude each other: cap the pollers with MaximumPollers")
	}
	if p.IndexShards == nil {
		p.IndexShards = jsii.Number(ledger.DefaultIndexShards)
	}
	if n := *p.IndexShards; n < 1 || n > ledger.MaxIndexShards || n != float64(int(n)) {
		panic(fmt.Sprintf("nexjob infra: IndexShards %v: want a whole number from 1 to %d", n, ledger.MaxIndexShards))
	}
	if p.FunctionTimeout == nil {
		p.FunctionTimeout = awscdk.Duration_Seconds(jsii.Number(30))
	}
	if p.MemorySize == nil {
		p.MemorySize = jsii.Number(256)
	}
	if p.BatchSize == nil {
		p.BatchSize = jsii.Number(10)
	}
	if p.MaxReceiveCount == nil {
		p.MaxReceiveCount = jsii.Number(5)
	}
	if p.GuardAfter == nil {
		p.GuardAfter = awscdk.Duration_Minutes(jsii.Number(2))
	}
	if p.OldestMessageAlarm == nil {
		p.OldestMessageAlarm = awscdk.Duration_Minutes(jsii.Number(15))
	}
	if p.FailureRateAlarm == nil {
		p.FailureRateAlarm = jsii.Number(10)
	}
	if p.RemovalPolicy == "" {
		p.RemovalPolicy = awscdk.RemovalPolicy_RETAIN
	}
	return p
}

func codeProp(r settings.Role) string {
	switch r {
	case settings.Worker:
		return "WorkerCode"
	case settings.DeadLetter:
		return "DeadLetterCode"
	case settings.Dashboard:
		return "WebDashboard.Code"
	case settings.Recurring:
		return "Code (or CodeDir/recurring)"
	case settings.Events:
		return "Code (or CodeDir/events)"
	}
	return "GuardCode (or NoGuard)"
}

// roleCode is the Code given for role, or nil.
func (p *JobQueueProps) roleCode(r settings.Role) awslambda.Code {
	var c awslambda.Code
	switch r {
	case settings.Worker:
		c = p.WorkerCode
	case settings.DeadLetter:
		c = p.DeadLetterCode
	case settings.Guard:
		c = p.GuardCode
	}
	if c == nil {
		c = p.Code
	}
	return c
}

// code is the role's function code: its own, the shared one, or the
// bootstrap under CodeDir (checked).
func (p *JobQueueProps) code(r settings.Role) awslambda.Code {
	if c := p.roleCode(r); c != nil {
		return c
	}
	return BootstrapCode(filepath.Join(p.CodeDir, string(r)))
}

// retention is NEXJOB_RETENTION's value.
// succeededRetention is how long a Succeeded record is kept.
func (p *JobQueueProps) succeededRetention() time.Duration {
	if p.Retention != nil && p.Retention.Succeeded != nil {
		return time.Duration(*p.Retention.Succeeded.ToSeconds(nil)) * time.Second
	}
	return handler.DefaultRetention.Succeeded
}

func (p *JobQueueProps) retention() string {
	r := handler.DefaultRetention
	if p.Retention != nil {
		for _, f := range []struct {
			d   awscdk.Duration
			out *time.Duration
		}{{p.Retention.Succeeded, &r.Succeeded}, {p.Retention.Failed, &r.Failed}, {p.Retention.Expired, &r.Expired}} {
			if f.d != nil {
				*f.out = time.Duration(*f.d.ToSeconds(nil)) * time.Second
			}
		}
	}
	return settings.FormatRetention(r)
}

func formatSeconds(d awscdk.Duration) string {
	return fmt.Sprintf("%.0fs", *d.ToSeconds(nil))
}

// CompletionEventsProps configure the completion events.
type CompletionEventsProps struct {
	// Bus receives the events. Defaults to a bus of the construct's own
	// (JobQueue.EventBus): its resource policy denies events:PutEvents to
	// every principal but the publisher's role, so no one else can put an
	// end the ledger never held, and only rules made on it (grant
	// events:PutRule on its rules to the teams that consume the ends) see
	// the jobs' ends and errors. Another bus (the account's default one,
	// a shared bus) takes the ends of whoever may PutEvents there, and
	// every rule owner there reads them: consumers then confirm each
	// event against the ledger (completion.Confirm, docs/writing-jobs.md).
	Bus awsevents.IEventBus
}
