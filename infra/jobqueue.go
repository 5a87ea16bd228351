// Package infra is the CDK (Go) construct that deploys nexjob-aws: the
// ledger table, the job queue and its DLQ, the worker, DLQ-consumer and
// dispatch-guard Lambda functions, their least-privilege grants and the
// alarms. It is its own Go module: no runtime binary links jsii or the CDK.
//
//	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{CodeDir: "../build/lambda"})
//	q.GrantEnqueue(myProducerFunction)
//
// # How it fails
//
// Synthesis panics (the CDK's way) when CodeDir lacks a function's
// bootstrap; `make lambdas` builds them. Nothing here names resources, so
// two stacks never collide; the table is retained when the stack is
// deleted unless RemovalPolicy says otherwise.
package infra

import (
	"fmt"
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/ledger"
)

const deadLetterTimeoutSeconds = 60

// JobQueueProps configure a JobQueue. Only CodeDir is required.
type JobQueueProps struct {
	// CodeDir holds one directory per function, each with a linux/arm64
	// `bootstrap`: worker/, deadletter/, guard/ (`make lambdas` writes
	// build/lambda/...). Required.
	CodeDir string
	// FunctionTimeout of the worker. The queue's visibility timeout is six
	// times it (AWS's advice for SQS event sources), so a message comes
	// back only after a crashed run's lease (the timeout plus 5 s) is over.
	// Defaults to 30 s.
	FunctionTimeout awscdk.Duration
	// MemorySize of the worker in MB. Defaults to 256.
	MemorySize *float64
	// BatchSize of the worker's SQS event source. Defaults to 10.
	BatchSize *float64
	// MaxConcurrency caps concurrent worker invocations (2 to 1000).
	// Defaults to no cap.
	MaxConcurrency *float64
	// MaxReceiveCount: receives of one message before it moves to the DLQ.
	// Retries are new messages and never count. Defaults to 5.
	MaxReceiveCount *float64
	// GuardAfter: how long past its run time an unsent job waits before
	// the dispatch guard runs it. Defaults to 2 minutes.
	GuardAfter awscdk.Duration
	// OldestMessageAlarm: the job queue alarms when its oldest message is
	// older than this. Defaults to 15 minutes.
	OldestMessageAlarm awscdk.Duration
	// RemovalPolicy of the table. Defaults to RETAIN.
	RemovalPolicy awscdk.RemovalPolicy
	// Environment is added to every function's (e.g. retention settings
	// your own main reads).
	Environment *map[string]*string
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
	Guard              awslambda.Function
	DLQDepthAlarm      awscloudwatch.Alarm
	OldestMessageAlarm awscloudwatch.Alarm
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
	q.Table.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
		IndexName:      jsii.String(ledger.IndexByState),
		PartitionKey:   &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrListState), Type: awsdynamodb.AttributeType_STRING},
		SortKey:        &awsdynamodb.Attribute{Name: jsii.String(ledger.AttrListAt), Type: awsdynamodb.AttributeType_NUMBER},
		ProjectionType: awsdynamodb.ProjectionType_ALL,
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

	env := map[string]*string{
		"NEXJOB_TABLE":       q.Table.TableName(),
		"NEXJOB_QUEUE_URL":   q.Queue.QueueUrl(),
		"NEXJOB_DLQ_URL":     q.DeadLetterQueue.QueueUrl(),
		"NEXJOB_GUARD_AFTER": jsii.String(formatSeconds(p.GuardAfter)),
	}
	if p.Environment != nil {
		for k, v := range *p.Environment {
			env[k] = v
		}
	}
	q.Worker = newFunction(c, "Worker", filepath.Join(p.CodeDir, "worker"), p.FunctionTimeout, p.MemorySize, env)
	q.DeadLetter = newFunction(c, "DeadLetterConsumer", filepath.Join(p.CodeDir, "deadletter"), awscdk.Duration_Seconds(jsii.Number(deadLetterTimeoutSeconds)), jsii.Number(256), env)
	q.Guard = newFunction(c, "DispatchGuard", filepath.Join(p.CodeDir, "guard"), awscdk.Duration_Seconds(jsii.Number(30)), jsii.Number(128), env)

	// The worker: claims, finishes, releases (UpdateItem), reads (GetItem),
	// enqueues and continues from jobs (PutItem; DeleteItem undoes a
	// continuation whose parent ended before its link); re-sends retries
	// and schedules, hides messages of running jobs, moves non-jobs to the
	// DLQ.
	q.Table.Grant(q.Worker, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:UpdateItem"), jsii.String("dynamodb:DeleteItem"))
	q.Queue.Grant(q.Worker, jsii.String("sqs:SendMessage"), jsii.String("sqs:ChangeMessageVisibility"))
	q.DeadLetterQueue.Grant(q.Worker, jsii.String("sqs:SendMessage"))
	q.Worker.AddEventSource(awslambdaeventsources.NewSqsEventSource(q.Queue, &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               p.BatchSize,
		ReportBatchItemFailures: jsii.Bool(true),
		MaxConcurrency:          p.MaxConcurrency,
	}))

	// The DLQ consumer: records why (UpdateItem, PutItem for non-jobs),
	// reads, and releases continuations from hooks (SendMessage).
	q.Table.Grant(q.DeadLetter, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:UpdateItem"))
	q.Queue.Grant(q.DeadLetter, jsii.String("sqs:SendMessage"))
	q.DeadLetter.AddEventSource(awslambdaeventsources.NewSqsEventSource(q.DeadLetterQueue, &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               jsii.Number(10),
		ReportBatchItemFailures: jsii.Bool(true),
	}))

	// The dispatch guard: reads the table's stream (scoped to this stream,
	// not "*", unlike the CDK's stream event source grant) and sends
	// check messages. The filter keeps every other change from invoking it.
	q.Table.GrantStream(q.Guard, jsii.String("dynamodb:DescribeStream"), jsii.String("dynamodb:GetRecords"),
		jsii.String("dynamodb:GetShardIterator"), jsii.String("dynamodb:ListStreams"))
	q.Queue.Grant(q.Guard, jsii.String("sqs:SendMessage"))
	awslambda.NewEventSourceMapping(c, jsii.String("GuardStream"), &awslambda.EventSourceMappingProps{
		Target:             q.Guard,
		EventSourceArn:     q.Table.TableStreamArn(),
		StartingPosition:   awslambda.StartingPosition_TRIM_HORIZON,
		BatchSize:          jsii.Number(100),
		MaxBatchingWindow:  awscdk.Duration_Seconds(jsii.Number(1)),
		BisectBatchOnError: jsii.Bool(true),
		RetryAttempts:      jsii.Number(50),
		Filters: &[]*map[string]interface{}{awslambda.FilterCriteria_Filter(&map[string]interface{}{
			"eventName": awslambda.FilterRule_Or(jsii.String("INSERT"), jsii.String("MODIFY")),
			"dynamodb": map[string]interface{}{"NewImage": map[string]interface{}{
				ledger.AttrState:   map[string]interface{}{"S": awslambda.FilterRule_Or(jsii.String(string(ledger.Enqueued)), jsii.String(string(ledger.Scheduled)))},
				ledger.AttrAttempt: map[string]interface{}{"N": awslambda.FilterRule_IsEqual(jsii.String("0"))},
			}},
		})},
	})

	q.DLQDepthAlarm = q.DeadLetterQueue.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{
		Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum"),
	}).CreateAlarm(c, jsii.String("DLQDepth"), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String("nexjob: messages in the dead-letter queue (poison messages or non-jobs)"),
		Threshold:          jsii.Number(0),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	q.OldestMessageAlarm = q.Queue.MetricApproximateAgeOfOldestMessage(&awscloudwatch.MetricOptions{
		Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum"),
	}).CreateAlarm(c, jsii.String("OldestMessage"), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String("nexjob: the job queue's oldest message is older than expected (workers down or throttled)"),
		Threshold:          p.OldestMessageAlarm.ToSeconds(nil),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	return q
}

// GrantEnqueue lets grantee make every producer call of enqueue.Client:
// Enqueue, ContinueWith, Requeue, Get, Delete (item reads and conditional
// writes; TransactWriteItems, used to re-use a key, is authorised by the
// PutItem of its items; DeleteItem also undoes a continuation whose parent
// ended before its link) and Ping (DescribeTable, GetQueueAttributes), and
// sending to the queue. The README's table lists the actions per call.
func (q *JobQueue) GrantEnqueue(grantee awsiam.IGrantable) {
	q.Table.Grant(grantee, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:PutItem"), jsii.String("dynamodb:UpdateItem"),
		jsii.String("dynamodb:DeleteItem"), jsii.String("dynamodb:DescribeTable"))
	q.Queue.Grant(grantee, jsii.String("sqs:SendMessage"), jsii.String("sqs:GetQueueAttributes"))
}

// GrantRead lets grantee read and list jobs (the CLI, a dashboard).
func (q *JobQueue) GrantRead(grantee awsiam.IGrantable) {
	q.Table.Grant(grantee, jsii.String("dynamodb:GetItem"), jsii.String("dynamodb:Query"))
}

// newFunction builds one arm64 provided.al2023 function with its own role
// and log group: the role may write only to that log group (no
// AWSLambdaBasicExecutionRole, whose logs statement covers "*").
func newFunction(scope constructs.Construct, id, dir string, timeout awscdk.Duration, memory *float64, env map[string]*string) awslambda.Function {
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
		Code:         awslambda.Code_FromAsset(jsii.String(dir), nil),
		Timeout:      timeout,
		MemorySize:   memory,
		Role:         role,
		LogGroup:     logs,
		Environment:  &env,
	})
}

func withDefaults(props *JobQueueProps) JobQueueProps {
	var p JobQueueProps
	if props != nil {
		p = *props
	}
	if p.CodeDir == "" {
		panic("nexjob infra: JobQueueProps.CodeDir is required (make lambdas builds build/lambda)")
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
	if p.RemovalPolicy == "" {
		p.RemovalPolicy = awscdk.RemovalPolicy_RETAIN
	}
	return p
}

func formatSeconds(d awscdk.Duration) string {
	return fmt.Sprintf("%.0fs", *d.ToSeconds(nil))
}
