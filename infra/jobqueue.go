// Package infra is the CDK (Go) construct that deploys nexjob-aws: the
// ledger table, the job queue and its DLQ, the worker, DLQ-consumer and
// dispatch-guard Lambda functions, their least-privilege grants and the
// alarms. It is its own Go module: no runtime binary links jsii or the CDK.
//
// The functions run a team's own code: one binary whose main is
// lambdamain.Serve (the construct tells each function its role in
// NEXJOB_ROLE), or one binary per role.
//
//	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{
//		Code: infra.BootstrapCode("../build/jobs"), // a dir holding a linux/arm64 `bootstrap`
//	})
//	q.GrantEnqueue(myProducerFunction)
//
// Every function gets the same settings (see package settings): table,
// queues, retention, IndexAllStates, the key secret's SSM parameter.
//
// # How it fails
//
// Synthesis panics (the CDK's way) with a message naming the prop when no
// code is given, and BootstrapCode panics naming the path when it holds no
// bootstrap. Nothing here names resources, so two stacks never collide;
// the table is retained when the stack is deleted unless RemovalPolicy
// says otherwise.
package infra

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsscheduler"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsssm"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/settings"
)

const deadLetterTimeoutSeconds = 60

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
	// Defaults to none.
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
	// Write turns the requeue, cancel, delete and redrive actions on (and
	// grants them). Defaults to false: read-only, read grants only.
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
// (GOOS=linux GOARCH=arm64 go build -tags lambda.norpc -o dir/bootstrap).
// It panics with a message naming dir when it does not, instead of the
// CDK's error at deployment.
func BootstrapCode(dir string) awslambda.Code {
	if fi, err := os.Stat(filepath.Join(dir, "bootstrap")); err != nil || fi.IsDir() {
		panic(fmt.Sprintf("nexjob infra: %s has no bootstrap: build your main there with GOOS=linux GOARCH=arm64 go build -tags lambda.norpc -o %s", dir, filepath.Join(dir, "bootstrap")))
	}
	return awslambda.Code_FromAsset(jsii.String(dir), nil)
}

// JobQueue is the deployed job system. Its fields let a stack wire and
// grant more (GrantEnqueue covers producers).
type JobQueue struct {
	constructs.Construct
	Table              awsdynamodb.Table
	Queue              awssqs.Queue
	DeadLetterQueue    awssqs.Queue
	Worker             awslambda.Function
	DeadLetter         awslambda.Function
	Guard              awslambda.Function // nil with NoGuard
	DLQDepthAlarm      awscloudwatch.Alarm
	OldestMessageAlarm awscloudwatch.Alarm
	FailureRateAlarm   awscloudwatch.Alarm // over the functions' EMF metrics
	Dashboard          awscloudwatch.Dashboard
	WebDashboard       awslambda.Function         // nil without the WebDashboard prop
	WebDashboardURL    awslambda.FunctionUrl      // its IAM-authenticated URL
	GuardFailures      awssqs.Queue               // stream batches the guard gave up on (nil with NoGuard)
	GuardFailureAlarm  awscloudwatch.Alarm        // on GuardFailures' depth
	ScheduleGroup      awsscheduler.ScheduleGroup // recurring jobs' schedules; nil without the Recurring prop
	FarScheduleGroup   awsscheduler.ScheduleGroup // far jobs' one-time schedules, apart (nil with NoFarSchedules)
	RecurringTarget    awslambda.Function         // Scheduler's target: enqueues a firing
	SchedulerRole      awsiam.Role                // assumed by Scheduler to invoke the target
	FarRole            awsiam.Role                // assumed by Scheduler to send far jobs' messages (nil with NoFarSchedules)
	NamedQueues        map[string]*NamedQueue     // by name (JobQueueProps.NamedQueues)
	keySecret          awsssm.IStringParameter
	keySecretKey       awskms.IKey
	env                map[string]*string // every function's settings
	guardAfter         string
}

// Settings returns the environment a function of this role needs (see
// package settings): what the construct sets on its own functions, for a
// team's producer function (settings.Producer) to read with
// settings.Load. Grant it GrantEnqueue too.
func (q *JobQueue) Settings(role settings.Role) *map[string]*string {
	e := map[string]*string{}
	for k, v := range q.env {
		e[k] = v
	}
	if !settings.NeedsKeySecret(role) {
		delete(e, settings.EnvKeySecretParameter)
	}
	switch role {
	case settings.Producer:
		delete(e, settings.EnvDLQURL)
	case settings.Guard:
		// Only what the guard reads (and the team's own variables).
		for _, v := range []string{settings.EnvTable, settings.EnvDLQURL, settings.EnvRetention, settings.EnvIndexAllStates,
			settings.EnvScheduleTarget, settings.EnvSchedulerRole} {
			delete(e, v)
		}
		fallthrough
	default:
		e[settings.EnvRole] = jsii.String(string(role))
	}
	if role == settings.Guard || role == settings.Worker {
		e[settings.EnvGuardAfter] = jsii.String(q.guardAfter) // the worker's re-armed checks keep the guard's lateness
	}
	return &e
}

// NewJobQueue adds the job system to scope.
func NewJobQueue(scope constructs.Construct, id string, props *JobQueueProps) *JobQueue {
	p := withDefaults(props)
	c := constructs.NewConstruct(scope, jsii.String(id))
	q := &JobQueue{Construct: c}

	q.Table = awsdynamodb.NewTable(c, jsii.String("Ledger"), &awsdynamodb.TableProps{
		PartitionKey:        &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrPK), Type: awsdynamodb.AttributeType_STRING},
		BillingMode:         awsdynamodb.BillingMode_PAY_PER_REQUEST,
		TimeToLiveAttribute: jsii.String(ledger.TTLAttribute),
		Encryption:          awsdynamodb.TableEncryption_AWS_MANAGED,
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		Stream:        awsdynamodb.StreamViewType_NEW_AND_OLD_IMAGES,
		RemovalPolicy: p.RemovalPolicy,
	})
	// Only what a listing shows: an index write is one write unit
	// whatever a job's args weigh (ledger.IndexProjection).
	q.Table.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
		IndexName:        jsii.String(ledger.IndexByState),
		PartitionKey:     &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrListState), Type: awsdynamodb.AttributeType_STRING},
		SortKey:          &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrListAt), Type: awsdynamodb.AttributeType_NUMBER},
		ProjectionType:   awsdynamodb.ProjectionType_INCLUDE,
		NonKeyAttributes: jsii.Strings(ledger.IndexProjection...),
	})

	q.DeadLetterQueue = awssqs.NewQueue(c, jsii.String("DLQ"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
		// Six times the DLQ consumer's timeout, as for the job queue.
		VisibilityTimeout: awscdk.Duration_Seconds(jsii.Number(6 * deadLetterTimeoutSeconds)),
	})
	q.Queue = awssqs.NewQueue(c, jsii.String("Queue"), &awssqs.QueueProps{
		Encryption:        awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		VisibilityTimeout: awscdk.Duration_Seconds(jsii.Number(6 * *p.FunctionTimeout.ToSeconds(nil))),
		DeadLetterQueue:   &awssqs.DeadLetterQueue{Queue: q.DeadLetterQueue, MaxReceiveCount: p.MaxReceiveCount},
	})

	named := q.namedQueues(c, p)
	env := map[string]*string{
		settings.EnvTable:          q.Table.TableName(),
		settings.EnvQueueURL:       q.Queue.QueueUrl(),
		settings.EnvDLQURL:         q.DeadLetterQueue.QueueUrl(),
		settings.EnvRetention:      jsii.String(p.retention()),
		settings.EnvIndexAllStates: jsii.String(strconv.FormatBool(*p.IndexAllStates)),
		settings.EnvIndexShards:    jsii.String(strconv.Itoa(int(*p.IndexShards))),
	}
	if p.KeySecretParameter != nil {
		env[settings.EnvKeySecretParameter] = p.KeySecretParameter
		q.keySecret = awsssm.StringParameter_FromStringParameterName(c, jsii.String("KeySecret"), p.KeySecretParameter)
		q.keySecretKey = p.KeySecretKey
	}
	env[settings.EnvQueues] = named
	q.scheduleGroups(c, p, env)
	if p.Environment != nil {
		for k, v := range *p.Environment {
			env[k] = v
		}
	}
	q.env, q.guardAfter = env, formatSeconds(p.GuardAfter)
	roleEnv := func(role settings.Role) map[string]*string { return *q.Settings(role) }
	q.Worker = newFunction(c, p, "Worker", p.code(settings.Worker), p.FunctionTimeout, p.MemorySize, roleEnv(settings.Worker))
	if p.ReservedConcurrency != nil {
		q.Worker.Node().DefaultChild().(awslambda.CfnFunction).SetReservedConcurrentExecutions(p.ReservedConcurrency)
	}
	q.DeadLetter = newFunction(c, p, "DeadLetterConsumer", p.code(settings.DeadLetter), awscdk.Duration_Seconds(jsii.Number(deadLetterTimeoutSeconds)), jsii.Number(256), roleEnv(settings.DeadLetter))
	if !*p.NoGuard {
		q.Guard = newFunction(c, p, "DispatchGuard", p.code(settings.Guard), awscdk.Duration_Seconds(jsii.Number(30)), jsii.Number(128), roleEnv(settings.Guard))
	}
	q.grantKeySecret(q.Worker)
	q.grantKeySecret(q.DeadLetter)
	q.grantFar(q.Worker)     // long retries, carried checks
	q.grantFar(q.DeadLetter) // far jobs sent back from the DLQ

	// The worker: claims, finishes, releases (UpdateItem), reads (GetItem),
	// enqueues and continues from jobs (PutItem; a continuation's
	// transaction is authorised as PutItem and UpdateItem; DeleteItem for
	// a job's Delete and ReleaseKey); re-sends retries and schedules, hides
	// messages of running jobs, moves non-jobs to the DLQ.
	q.Table.Grant(q.Worker, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:UpdateItem"), jsii.String("dynamodb:DeleteItem"))
	q.grantQueues(q.Worker, "sqs:SendMessage", "sqs:ChangeMessageVisibility")
	q.DeadLetterQueue.Grant(q.Worker, jsii.String("sqs:SendMessage"))
	q.Worker.AddEventSource(awslambdaeventsources.NewSqsEventSource(q.Queue, &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               p.BatchSize,
		ReportBatchItemFailures: jsii.Bool(true),
		MaxConcurrency:          p.MaxConcurrency,
		MaxBatchingWindow:       p.MaxBatchingWindow,
		ProvisionedPollerConfig: p.ProvisionedPollers,
	}))
	for _, np := range p.NamedQueues {
		nq := q.NamedQueues[*np.Name]
		batch := np.BatchSize
		if batch == nil {
			batch = p.BatchSize
		}
		q.Worker.AddEventSource(awslambdaeventsources.NewSqsEventSource(nq.Queue, &awslambdaeventsources.SqsEventSourceProps{
			BatchSize:               batch,
			ReportBatchItemFailures: jsii.Bool(true),
			MaxConcurrency:          np.MaxConcurrency,
			MaxBatchingWindow:       np.MaxBatchingWindow,
		}))
	}

	// The DLQ consumer: records why (UpdateItem, PutItem for non-jobs),
	// reads, and releases continuations from hooks (SendMessage).
	q.Table.Grant(q.DeadLetter, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:UpdateItem"))
	q.grantQueues(q.DeadLetter, "sqs:SendMessage")
	for _, dlq := range q.deadLetterQueues() {
		q.DeadLetter.AddEventSource(awslambdaeventsources.NewSqsEventSource(dlq, &awslambdaeventsources.SqsEventSourceProps{
			BatchSize:               jsii.Number(10),
			ReportBatchItemFailures: jsii.Bool(true),
		}))
	}

	if q.Guard != nil {
		// The dispatch guard: reads the table's stream (scoped to this stream,
		// not "*", unlike the CDK's stream event source grant) and sends
		// check messages. The filter keeps every other change from invoking it.
		q.Table.GrantStream(q.Guard, jsii.String("dynamodb:DescribeStream"), jsii.String("dynamodb:GetRecords"),
			jsii.String("dynamodb:GetShardIterator"), jsii.String("dynamodb:ListStreams"))
		q.grantQueues(q.Guard, "sqs:SendMessage")
		q.grantFarActions(q.Guard, "scheduler:CreateSchedule") // far jobs' checks: their own schedule, made if missing
		// A batch that fails all its retries is not dropped silently: its
		// stream position goes to a queue of its own, and an alarm says so
		// (those jobs lost their recovery check; look them up and Dispatch).
		q.GuardFailures = awssqs.NewQueue(c, jsii.String("GuardFailures"), &awssqs.QueueProps{
			Encryption: awssqs.QueueEncryption_SQS_MANAGED, EnforceSSL: jsii.Bool(true),
			RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
		})
		q.GuardFailureAlarm = depthAlarm(c, q.GuardFailures, "GuardFailed", "nexjob: the dispatch guard gave up on stream records (their jobs' recovery checks were not sent)")
		awslambda.NewEventSourceMapping(c, jsii.String("GuardStream"), &awslambda.EventSourceMappingProps{
			OnFailure:        awslambdaeventsources.NewSqsDlq(q.GuardFailures),
			Target:           q.Guard,
			EventSourceArn:   q.Table.TableStreamArn(),
			StartingPosition: awslambda.StartingPosition_TRIM_HORIZON,
			BatchSize:        jsii.Number(100),
			// Ten seconds of changes per batch: a job claimed within them
			// (the usual case) needs no check message (see package guard).
			MaxBatchingWindow:  awscdk.Duration_Seconds(jsii.Number(10)),
			BisectBatchOnError: jsii.Bool(true),
			RetryAttempts:      jsii.Number(50),
			Filters: &[]*map[string]interface{}{awslambda.FilterCriteria_Filter(&map[string]interface{}{
				"eventName": awslambda.FilterRule_Or(jsii.String("INSERT"), jsii.String("MODIFY")),
				"dynamodb": map[string]interface{}{"NewImage": map[string]interface{}{
					ledger.AttrState:   map[string]interface{}{"S": awslambda.FilterRule_Or(jsii.String(string(ledger.Enqueued)), jsii.String(string(ledger.Scheduled)))},
					ledger.AttrAttempt: map[string]interface{}{"N": awslambda.FilterRule_IsEqual(jsii.String("0"))},
				}},
			}), awslambda.FilterCriteria_Filter(&map[string]interface{}{
				// A job's first claim, so the guard can skip its check.
				"eventName": awslambda.FilterRule_IsEqual(jsii.String("MODIFY")),
				"dynamodb": map[string]interface{}{"NewImage": map[string]interface{}{
					ledger.AttrState:   map[string]interface{}{"S": awslambda.FilterRule_IsEqual(jsii.String(string(ledger.Processing)))},
					ledger.AttrAttempt: map[string]interface{}{"N": awslambda.FilterRule_IsEqual(jsii.String("1"))},
				}},
			})},
		})
	}

	// Recurring first: the dashboard lists its schedules.
	if p.Recurring != nil && *p.Recurring {
		q.recurring(c, p, roleEnv(settings.Recurring))
	}
	if p.WebDashboard != nil {
		q.webDashboard(c, p, roleEnv(settings.Dashboard))
	}

	q.DLQDepthAlarm = depthAlarm(c, q.DeadLetterQueue, "DLQDepth", "nexjob: messages in the dead-letter queue (poison messages or non-jobs)")
	q.OldestMessageAlarm = q.Queue.MetricApproximateAgeOfOldestMessage(&awscloudwatch.MetricOptions{
		Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum"),
	}).CreateAlarm(c, jsii.String("OldestMessage"), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String("nexjob: the job queue's oldest message is older than expected (workers down or throttled)"),
		Threshold:          p.OldestMessageAlarm.ToSeconds(nil),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	q.metricsViews(c, p)
	return q
}

// depthAlarm alarms as soon as the queue holds a visible message.
func depthAlarm(c constructs.Construct, queue awssqs.Queue, id, why string) awscloudwatch.Alarm {
	return queue.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{
		Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum"),
	}).CreateAlarm(c, jsii.String(id), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String(why),
		Threshold:          jsii.Number(0),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

// metricsViews adds the alarm on the failure rate and the dashboard, over
// the EMF metrics the functions write (package metrics).
func (q *JobQueue) metricsViews(c constructs.Construct, p JobQueueProps) {
	sum := func(name string) awscloudwatch.Metric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace: jsii.String(metrics.DefaultNamespace), MetricName: jsii.String(name),
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		})
	}
	rate := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("100 * f / (s + f)"), Label: jsii.String("failed %"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{"f": sum(metrics.Failed), "s": sum(metrics.Succeeded)},
		Period:       awscdk.Duration_Minutes(jsii.Number(5)),
	})
	q.FailureRateAlarm = rate.CreateAlarm(c, jsii.String("FailureRate"), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String("nexjob: more than the threshold's percent of finished jobs Failed (all kinds, 5 minutes)"),
		Threshold:          p.FailureRateAlarm,
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(2),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	perKind := func(name, stat string) awscloudwatch.MathExpression {
		return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String(fmt.Sprintf("SEARCH('{%s,Kind} MetricName=\"%s\"', '%s', 300)", metrics.DefaultNamespace, name, stat)),
			Label:      jsii.String(name), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		})
	}
	graph := func(title string, ms ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{Title: jsii.String(title), Left: &ms, Width: jsii.Number(12)})
	}
	q.Dashboard = awscloudwatch.NewDashboard(c, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		Widgets: &[]*[]awscloudwatch.IWidget{
			{graph("Succeeded by kind", perKind(metrics.Succeeded, "Sum")), graph("Failed by kind", perKind(metrics.Failed, "Sum"))},
			{graph("Retried by kind", perKind(metrics.Retried, "Sum")), graph("Run duration p95 (ms) by kind", perKind(metrics.RunDuration, "p95"))},
			{graph("Failure rate (%)", rate), graph("Queue age (s), DLQ depth",
				q.Queue.MetricApproximateAgeOfOldestMessage(nil), q.DeadLetterQueue.MetricApproximateNumberOfMessagesVisible(nil))},
		},
	})
}

// webDashboard adds the dashboard's function and its IAM-authenticated URL
// (response streaming, as lambdaurl answers).
func (q *JobQueue) webDashboard(c constructs.Construct, p JobQueueProps, env map[string]*string) {
	wp := p.WebDashboard
	code := wp.Code
	if code == nil {
		code = p.code(settings.Dashboard)
	}
	write := wp.Write != nil && *wp.Write
	env[settings.EnvDashboardWrite] = jsii.String(strconv.FormatBool(write))
	q.WebDashboard = newFunction(c, p, "WebDashboard", code, awscdk.Duration_Seconds(jsii.Number(30)), jsii.Number(256), env)
	if write {
		q.GrantOperate(q.WebDashboard)
	} else {
		q.GrantRead(q.WebDashboard)
	}
	q.WebDashboardURL = q.WebDashboard.AddFunctionUrl(&awslambda.FunctionUrlOptions{
		AuthType:   awslambda.FunctionUrlAuthType_AWS_IAM,
		InvokeMode: awslambda.InvokeMode_RESPONSE_STREAM,
	})
	awscdk.NewCfnOutput(c, jsii.String("WebDashboardUrl"), &awscdk.CfnOutputProps{Value: q.WebDashboardURL.Url()})
}

// GrantEnqueue lets grantee make every producer call of enqueue.Client:
// Enqueue, ContinueWith, Requeue, Get, Delete (item reads and conditional
// writes; TransactWriteItems, used to re-use a key and to write a
// continuation with its links, is authorised by the PutItem and
// UpdateItem of its items) and Ping (DescribeTable, GetQueueAttributes),
// and sending to the queue. The README's table lists the actions per call.
func (q *JobQueue) GrantEnqueue(grantee awsiam.IGrantable) {
	q.Table.Grant(grantee, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:UpdateItem"),
		jsii.String("dynamodb:DeleteItem"), jsii.String("dynamodb:DescribeTable"))
	q.grantQueues(grantee, "sqs:SendMessage", "sqs:GetQueueAttributes")
	q.grantKeySecret(grantee)
	q.grantFar(grantee)
}

// GrantOperate lets grantee operate the jobs (the nexjob CLI, a
// dashboard with write actions): everything GrantRead allows, and exactly
// what the actions call: requeue and cancel (UpdateItem, and SendMessage
// of a requeued job), delete (DeleteItem) and redrive (the DLQ's
// DeleteMessage, once its job is back). Not PutItem, and an UpdateItem
// that names a record's kind or args is denied (dynamodb:Attributes):
// UpdateItem creates a missing item, and with SendMessage it made a job
// of any kind and args that the worker ran. No operator action names
// either (TestDashboardGrantsExactlyItsCalls checks the attributes too);
// TestDashboardGrantsExactlyItsCalls runs every action through a
// recording proxy against this policy.
func (q *JobQueue) GrantOperate(grantee awsiam.IGrantable) {
	q.GrantRead(grantee)
	q.Table.Grant(grantee, jsii.String("dynamodb:UpdateItem"), jsii.String("dynamodb:DeleteItem"))
	grantee.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Effect:     awsiam.Effect_DENY,
		Actions:    jsii.Strings("dynamodb:UpdateItem"),
		Resources:  jsii.Strings(*q.Table.TableArn()),
		Conditions: &map[string]any{"ForAnyValue:StringEquals": map[string]any{"dynamodb:Attributes": OperatorDeniedAttributes}},
	}))
	q.grantQueues(grantee, "sqs:SendMessage")
	q.grantDLQs(grantee, "sqs:DeleteMessage")
	q.grantFar(grantee) // a redriven far job is scheduled again; delete removes its schedule
}

// OperatorDeniedAttributes are the record attributes GrantOperate's
// UpdateItem may not name: what makes a record a runnable job.
var OperatorDeniedAttributes = []string{ledger.AttrKind, ledger.AttrArgs}

// grantKeySecret lets grantee read the key secret's parameter: exactly
// ssm:GetParameter on it (the CDK's GrantRead adds DescribeParameters,
// GetParameters and GetParameterHistory, none of which settings.Load
// calls), and kms:Decrypt on a customer-managed key, through SSM only.
func (q *JobQueue) grantKeySecret(grantee awsiam.IGrantable) {
	if q.keySecret == nil {
		return
	}
	awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
		Grantee: grantee, Actions: jsii.Strings("ssm:GetParameter"), ResourceArns: jsii.Strings(*q.keySecret.ParameterArn()),
	})
	if q.keySecretKey != nil {
		grantee.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:    jsii.Strings("kms:Decrypt"),
			Resources:  jsii.Strings(*q.keySecretKey.KeyArn()),
			Conditions: &map[string]any{"StringEquals": map[string]any{"kms:ViaService": awscdk.Fn_Join(jsii.String(""), jsii.Strings("ssm.", *awscdk.Aws_REGION(), ".amazonaws.com"))}},
		}))
	}
}

// GrantRead lets grantee look at the jobs (the CLI's list, get and stats,
// a read-only dashboard): item reads, Query of the index, Scan (stats, and
// listing states the index does not hold), the queues' depths, and
// peeking at the DLQ (ReceiveMessage with no delete).
func (q *JobQueue) GrantRead(grantee awsiam.IGrantable) {
	if q.ScheduleGroup != nil {
		// The recurring jobs' list (nexjob schedules, the dashboard's page):
		// ListSchedules (no resource narrower than "*" exists for it) and
		// GetSchedule in the group.
		awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
			Grantee: grantee, Actions: jsii.Strings("scheduler:ListSchedules"), ResourceArns: jsii.Strings("*"),
		})
		awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
			Grantee: grantee, Actions: jsii.Strings("scheduler:GetSchedule"),
			ResourceArns: jsii.Strings(*awscdk.Fn_Join(jsii.String(""), jsii.Strings("arn:", *awscdk.Aws_PARTITION(), ":scheduler:", *awscdk.Aws_REGION(), ":", *awscdk.Aws_ACCOUNT_ID(), ":schedule/", *q.ScheduleGroup.ScheduleGroupName(), "/*"))),
		})
	}
	q.Table.Grant(grantee, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:Query"), jsii.String("dynamodb:Scan"))
	q.grantQueues(grantee, "sqs:GetQueueAttributes")
	q.grantDLQs(grantee, "sqs:ReceiveMessage", "sqs:GetQueueAttributes")
	q.grantKeySecret(grantee)
}

// namedQueues makes the named queues, each with its DLQ and its DLQ's
// alarm, and returns NEXJOB_QUEUES ("{}" with none: every function gets
// every variable its role reads).
func (q *JobQueue) namedQueues(c constructs.Construct, p JobQueueProps) *string {
	if len(p.NamedQueues) == 0 {
		return jsii.String("{}")
	}
	q.NamedQueues = map[string]*NamedQueue{}
	doc := map[string]any{}
	for _, np := range p.NamedQueues {
		name := ""
		if np.Name != nil {
			name = *np.Name
		}
		if !kinds.Valid(name) {
			panic(fmt.Sprintf("nexjob infra: named queue %q: the name must be %s", name, kinds.Rule))
		}
		if _, dup := q.NamedQueues[name]; dup {
			panic(fmt.Sprintf("nexjob infra: named queue %q twice", name))
		}
		id := "Queue-" + name
		dlq := awssqs.NewQueue(c, jsii.String(id+"-DLQ"), &awssqs.QueueProps{
			Encryption: awssqs.QueueEncryption_SQS_MANAGED, EnforceSSL: jsii.Bool(true),
			RetentionPeriod:   awscdk.Duration_Days(jsii.Number(14)),
			VisibilityTimeout: awscdk.Duration_Seconds(jsii.Number(6 * deadLetterTimeoutSeconds)),
		})
		nq := &NamedQueue{DeadLetterQueue: dlq, Queue: awssqs.NewQueue(c, jsii.String(id), &awssqs.QueueProps{
			Encryption: awssqs.QueueEncryption_SQS_MANAGED, EnforceSSL: jsii.Bool(true),
			VisibilityTimeout: awscdk.Duration_Seconds(jsii.Number(6 * *p.FunctionTimeout.ToSeconds(nil))),
			DeadLetterQueue:   &awssqs.DeadLetterQueue{Queue: dlq, MaxReceiveCount: p.MaxReceiveCount},
		})}
		nq.DLQDepthAlarm = depthAlarm(c, dlq, id+"-DLQDepth", "nexjob: messages in the dead-letter queue of the named queue "+name)
		q.NamedQueues[name] = nq
		doc[name] = map[string]any{"url": nq.Queue.QueueUrl(), "arn": nq.Queue.QueueArn(), "dlq": dlq.QueueUrl()}
	}
	return awscdk.Stack_Of(c).ToJsonString(doc, nil)
}

// grantQueues grants actions on the job queue and every named queue.
func (q *JobQueue) grantQueues(grantee awsiam.IGrantable, actions ...string) {
	q.Queue.Grant(grantee, *jsii.Strings(actions...)...)
	for _, name := range slices.Sorted(maps.Keys(q.NamedQueues)) {
		q.NamedQueues[name].Queue.Grant(grantee, *jsii.Strings(actions...)...)
	}
}

// grantDLQs grants actions on the job queue's DLQ and every named
// queue's.
func (q *JobQueue) grantDLQs(grantee awsiam.IGrantable, actions ...string) {
	for _, dlq := range q.deadLetterQueues() {
		dlq.Grant(grantee, *jsii.Strings(actions...)...)
	}
}

// deadLetterQueues are the job queue's DLQ and the named queues', in name
// order.
func (q *JobQueue) deadLetterQueues() []awssqs.Queue {
	dlqs := []awssqs.Queue{q.DeadLetterQueue}
	for _, name := range slices.Sorted(maps.Keys(q.NamedQueues)) {
		dlqs = append(dlqs, q.NamedQueues[name].DeadLetterQueue)
	}
	return dlqs
}

// newFunction builds one arm64 provided.al2023 function with its own role
// and log group: the role may write only to that log group (no
// AWSLambdaBasicExecutionRole, whose logs statement covers "*").
func newFunction(scope constructs.Construct, p JobQueueProps, id string, code awslambda.Code, timeout awscdk.Duration, memory *float64, env map[string]*string) awslambda.Function {
	tracing := awslambda.Tracing_DISABLED
	if p.ActiveTracing != nil && *p.ActiveTracing {
		tracing = awslambda.Tracing_ACTIVE
	}
	logs := awslogs.NewLogGroup(scope, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		Retention:     awslogs.RetentionDays_ONE_MONTH,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	role := awsiam.NewRole(scope, jsii.String(id+"Role"), &awsiam.RoleProps{
		AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
	})
	logs.Grant(role, jsii.String("logs:CreateLogStream"), jsii.String("logs:PutLogEvents"))
	return awslambda.NewFunction(scope, jsii.String(id), &awslambda.FunctionProps{
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: awslambda.Architecture_ARM_64(),
		Handler:      jsii.String("bootstrap"),
		Code:         code,
		Timeout:      timeout,
		MemorySize:   memory,
		Role:         role,
		LogGroup:     logs,
		Environment:  &env,
		Tracing:      tracing,
	})
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
