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
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"math"
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsscheduler"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsssm"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

const deadLetterTimeoutSeconds = 60

// JobQueue is the deployed job system. Its fields let a stack wire and
// grant more (GrantEnqueue covers producers).
type JobQueue struct {
	constructs.Construct
	Table awsdynamodb.Table
	// Steps is the steps table (ledger.Options.StepsTable): each of a
	// durable job's steps an item, written by the worker, read by the
	// worker and the readers (the CLI's get, the dashboard).
	Steps awsdynamodb.Table
	// Blobs is the blob bucket (ledger.Options.BlobBucket): step values
	// over 256 KB as objects, encrypted, never public, TLS only, expired
	// by a lifecycle rule as the steps' items are (ledger.StepLife);
	// written and read by the worker, read by the readers.
	Blobs              awss3.Bucket
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
	Events             awslambda.Function         // the completion events' publisher (nil without CompletionEvents)
	EventBus           awsevents.IEventBus        // the bus it puts the ends on: the construct's own unless CompletionEvents.Bus names one
	EventsFailures     awssqs.Queue               // stream batches it gave up on
	EventsFailureAlarm awscloudwatch.Alarm        // on EventsFailures' depth
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
	eventBus           *string           // the completion events' bus name (nil: no completion events)
	idempotent         map[string]string // GrantIdempotency's names, by the function's construct path
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
	case settings.Idempotent:
		// The table and the key secret's parameter, nothing of the jobs.
		e = map[string]*string{settings.EnvTable: q.env[settings.EnvTable], settings.EnvRole: jsii.String(string(role))}
		if p := q.env[settings.EnvKeySecretParameter]; p != nil {
			e[settings.EnvKeySecretParameter] = p
		}
	case settings.Events:
		// Only the bus (and the team's own variables).
		for _, v := range settings.Vars(settings.Worker) {
			delete(e, v)
		}
		for _, v := range []string{settings.EnvScheduleTarget, settings.EnvSchedulerRole} {
			delete(e, v)
		}
		e[settings.EnvRole] = jsii.String(string(role))
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
	q.Steps = awsdynamodb.NewTable(c, jsii.String("Steps"), &awsdynamodb.TableProps{
		PartitionKey:        &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrPK), Type: awsdynamodb.AttributeType_STRING},
		SortKey:             &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrStepKey), Type: awsdynamodb.AttributeType_STRING},
		BillingMode:         awsdynamodb.BillingMode_PAY_PER_REQUEST,
		TimeToLiveAttribute: jsii.String(ledger.TTLAttribute),
		Encryption:          awsdynamodb.TableEncryption_AWS_MANAGED,
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		RemovalPolicy: p.RemovalPolicy,
	})
	q.Blobs = awss3.NewBucket(c, jsii.String("Blobs"), &awss3.BucketProps{
		Encryption:        awss3.BucketEncryption_S3_MANAGED,
		BlockPublicAccess: awss3.BlockPublicAccess_BLOCK_ALL(),
		EnforceSSL:        jsii.Bool(true),
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Id: jsii.String("steps-expire"), Prefix: jsii.String("steps/"),
			Expiration: awscdk.Duration_Days(jsii.Number(ledger.StepLife.Hours()/24 + 1)),
		}, {
			// Args over a record's room: as long as steps (a run writes
			// an object a year old again).
			Id: jsii.String("args-expire"), Prefix: jsii.String("args/"),
			Expiration: awscdk.Duration_Days(jsii.Number(ledger.StepLife.Hours()/24 + 1)),
		}, {
			// A result over a record's room lives as long as its record.
			Id: jsii.String("results-expire"), Prefix: jsii.String("results/"),
			Expiration: awscdk.Duration_Days(jsii.Number(math.Ceil(p.succeededRetention().Hours()/24) + 1)),
		}},
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
		settings.EnvStepsTable:     q.Steps.TableName(),
		settings.EnvBlobBucket:     q.Blobs.BucketName(),
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
	// Its steps: written once (PutItem), read back (Query), kept (UpdateItem of the expiry).
	q.Steps.Grant(q.Worker, jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:Query"), jsii.String("dynamodb:UpdateItem"))
	// Large step values: written once, read back (no delete, no list).
	q.grantBlobs(q.Worker, []string{"steps/", "results/", "args/"}, "s3:PutObject", "s3:GetObject") // args/: read, and written again when a year old
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
		// The dispatch guard: reads the table's stream and sends check
		// messages.
		q.grantStream(q.Guard)
		q.grantQueues(q.Guard, "sqs:SendMessage")
		q.grantFarActions(q.Guard, "scheduler:CreateSchedule") // far jobs' checks: their own schedule, made if missing
		// A batch given up on: those jobs lost their recovery check; look
		// them up and Dispatch. Ten seconds of changes per batch: a job
		// claimed within them (the usual case) needs no check message
		// (see package guard).
		q.GuardFailures, q.GuardFailureAlarm = q.streamConsumer(c, q.Guard, "Guard", "nexjob: the dispatch guard gave up on stream records (their jobs' recovery checks were not sent)",
			awslambda.StartingPosition_TRIM_HORIZON, 10, awslambda.FilterCriteria_Filter(&map[string]interface{}{
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
			}))
	}
	if p.CompletionEvents != nil {
		q.completionEvents(c, p, roleEnv(settings.Events))
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

// completionEvents adds the completion events' publisher: a function of
// role events on the table's stream (a second consumer beside the
// guard's), its mapping filtered to a job's end (a MODIFY from an active
// state to a terminal one: every other change never invokes it), granted
// the stream's reads and events:PutEvents on the one bus. The bus is the
// construct's own unless the props name another: only the publisher may
// put events on it (its resource policy denies every other principal,
// whatever its IAM allows), and only its rules see the ends. A batch that
// fails all its retries keeps its stream position in a queue of its own,
// with an alarm, as the guard's does.
func (q *JobQueue) completionEvents(c constructs.Construct, p JobQueueProps, env map[string]*string) {
	bus := p.CompletionEvents.Bus
	var own awsevents.EventBus
	if bus == nil {
		own = awsevents.NewEventBus(c, jsii.String("CompletionBus"), &awsevents.EventBusProps{
			Description: jsii.String("nexjob: each job's end (Succeeded, Failed, Expired), put by the construct's publisher alone"),
		})
		bus = own
	}
	q.EventBus = bus
	q.eventBus = bus.EventBusName()
	env[settings.EnvEventBus] = q.eventBus
	q.Events = newFunction(c, p, "CompletionEvents", p.code(settings.Events), awscdk.Duration_Seconds(jsii.Number(30)), jsii.Number(128), env)
	q.grantStream(q.Events)
	bus.GrantPutEventsTo(q.Events, nil)
	if own != nil {
		// No one else puts events on it, an account admin's events:* on
		// "*" included: a plain PutEvents would reach every rule with an
		// end the ledger never held.
		own.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("OnlyTheNexjobPublisherPutsEvents"),
			Effect:     awsiam.Effect_DENY,
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings("events:PutEvents"),
			Resources:  jsii.Strings(*own.EventBusArn()),
			Conditions: &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": q.Events.Role().RoleArn()}},
		}))
	}
	active := []*string{}
	for _, st := range []ledger.State{ledger.Enqueued, ledger.Scheduled, ledger.Processing, ledger.AwaitingContinuation} {
		active = append(active, jsii.String(string(st)))
	}
	ended := []*string{}
	for _, st := range []ledger.State{ledger.Succeeded, ledger.Failed, ledger.Expired} {
		ended = append(ended, jsii.String(string(st)))
	}
	q.EventsFailures, q.EventsFailureAlarm = q.streamConsumer(c, q.Events, "Events", "nexjob: the completion events' publisher gave up on stream records (their jobs' end events were not published)",
		awslambda.StartingPosition_LATEST, 1, awslambda.FilterCriteria_Filter(&map[string]interface{}{
			"eventName": awslambda.FilterRule_IsEqual(jsii.String("MODIFY")),
			"dynamodb": map[string]interface{}{
				"NewImage": map[string]interface{}{ledger.AttrState: map[string]interface{}{"S": awslambda.FilterRule_Or(ended...)}},
				"OldImage": map[string]interface{}{ledger.AttrState: map[string]interface{}{"S": awslambda.FilterRule_Or(active...)}},
			},
		}))
}

// streamConsumer feeds fn the table's stream (name+"Stream": up to 100
// records over window seconds, the filters keeping every other change
// from invoking it, a failing batch bisected and retried 50 times); fn
// needs grantStream. A batch that fails all its retries is not dropped
// silently: its stream position goes to a queue of its own
// (name+"Failures"), and an alarm (name+"Failed") says so.
func (q *JobQueue) streamConsumer(c constructs.Construct, fn awslambda.Function, name, alarm string, start awslambda.StartingPosition, window float64, filters ...*map[string]interface{}) (awssqs.Queue, awscloudwatch.Alarm) {
	failures := awssqs.NewQueue(c, jsii.String(name+"Failures"), &awssqs.QueueProps{
		Encryption: awssqs.QueueEncryption_SQS_MANAGED, EnforceSSL: jsii.Bool(true),
		RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
	})
	awslambda.NewEventSourceMapping(c, jsii.String(name+"Stream"), &awslambda.EventSourceMappingProps{
		OnFailure:          awslambdaeventsources.NewSqsDlq(failures),
		Target:             fn,
		EventSourceArn:     q.Table.TableStreamArn(),
		StartingPosition:   start,
		BatchSize:          jsii.Number(100),
		MaxBatchingWindow:  awscdk.Duration_Seconds(jsii.Number(window)),
		BisectBatchOnError: jsii.Bool(true),
		RetryAttempts:      jsii.Number(50),
		Filters:            &filters,
	})
	return failures, depthAlarm(c, failures, name+"Failed", alarm)
}

// grantStream grants fn the table's stream's reads, scoped to this
// stream (not "*", unlike the CDK's stream event source grant).
func (q *JobQueue) grantStream(fn awslambda.Function) {
	q.Table.GrantStream(fn, jsii.String("dynamodb:DescribeStream"), jsii.String("dynamodb:GetRecords"),
		jsii.String("dynamodb:GetShardIterator"), jsii.String("dynamodb:ListStreams"))
}
