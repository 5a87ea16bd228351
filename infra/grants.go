package infra

import (
	"fmt"
	"maps"
	"slices"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

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

// GrantIdempotency lets fn use package idempotency on the table as the
// function named function, and nothing else: GetItem, PutItem, UpdateItem
// and DeleteItem of that function's call records only (IAM's
// dynamodb:LeadingKeys limited to ledger.FunctionCallPrefix(function),
// "i#<function>#*": it can read or write neither a job nor another
// function's records), and the key secret, which hashes its keys. It
// tells fn the name (settings.EnvIdempotencyFunction), which idempotency.New
// takes and refuses to differ from. Give the function
// q.Settings(settings.Idempotent) too. function must follow the kinds
// rule (letters, digits, . _ - : /; never "#" or "*", which would widen
// the prefix), and one function has one name: GrantIdempotency panics
// otherwise (granting the same name again changes nothing).
// TestIdempotencyGrantsExactlyItsCalls runs every path of the utility
// against this policy.
func (q *JobQueue) GrantIdempotency(fn awslambda.Function, function string) {
	if !kinds.Valid(function) {
		panic(fmt.Sprintf("nexjob infra: GrantIdempotency(%s, %q): the function's name must be %s", *fn.Node().Path(), function, kinds.Rule))
	}
	path := *fn.Node().Path()
	if q.idempotent == nil {
		q.idempotent = map[string]string{}
	}
	if was, ok := q.idempotent[path]; ok && was != function {
		panic(fmt.Sprintf("nexjob infra: GrantIdempotency(%s, %q): the function was granted as %q; one function has one name (its records are under it)", path, function, was))
	}
	q.idempotent[path] = function
	fn.AddEnvironment(jsii.String(settings.EnvIdempotencyFunction), jsii.String(function), nil)
	fn.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:    jsii.Strings("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
		Resources:  jsii.Strings(*q.Table.TableArn()),
		Conditions: &map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []string{ledger.FunctionCallPrefix(function) + "*"}}},
	}))
	q.grantKeySecret(fn)
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
