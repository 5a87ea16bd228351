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
	q.grantBlobs(grantee, []string{"results/"}, "s3:GetObject") // Client.Result and Wait of a result over a record's room
	q.grantBlobs(grantee, []string{"args/"}, "s3:PutObject")    // args over a record's room, written before the record
}

// GrantOperate lets grantee operate the jobs (the nexjob CLI, a
// dashboard with write actions): everything GrantRead allows, and exactly
// what the actions call: requeue, cancel, delete, redrive and move-queue
// (UpdateItem, DeleteItem, SendMessage of a job sent again, the DLQ's
// DeleteMessage once its job is back, a far job's schedule). Not PutItem,
// and UpdateItem only naming OperatorAttributes (IAM's
// dynamodb:Attributes, an allow-list): an operator's update can change
// whether and when a job runs, never what it is, what it did or what it
// returned (its kind, args, steps, result, history, fencing token, key's
// policy, attempt budget: an UpdateItem naming steps made the worker pay a
// forged payee without running its lookup step, one naming result
// changed what Client.Result returns). Signals are not in it: a signal is
// kept in the job's steps (GrantSignal). TestOperatorWritesOnlyItsAttributes
// runs every operator write against OperatorAttributes;
// TestDashboardGrantsExactlyItsCalls runs the write dashboard's actions
// against its policy.
func (q *JobQueue) GrantOperate(grantee awsiam.IGrantable) {
	q.GrantRead(grantee)
	q.grantKeySecret(grantee) // lookups by key (nexjob holder, the dashboard's)
	q.grantUpdate(grantee, OperatorAttributes)
	q.Table.Grant(grantee, jsii.String("dynamodb:DeleteItem"))
	q.grantQueues(grantee, "sqs:SendMessage")
	q.grantDLQs(grantee, "sqs:DeleteMessage")
	q.grantFar(grantee) // a redriven far job is scheduled again; delete removes its schedule
}

// GrantSignal lets grantee send signals to jobs waiting for them (nexjob
// signal, enqueue.Client.Signal and SignalToken, the write dashboard's
// signal action): GetItem, UpdateItem naming only SignalAttributes, and
// SendMessage of the job it wakes. A signal is kept in the job's steps
// (ledger.SignalStep), and IAM cannot tell one key of the steps map from
// another: whoever may signal may write a job's steps. Grant it only to
// who may decide a job's waits; GrantOperate does not include it.
func (q *JobQueue) GrantSignal(grantee awsiam.IGrantable) {
	q.Table.Grant(grantee, jsii.String("dynamodb:GetItem"))
	q.grantUpdate(grantee, SignalAttributes)
	q.grantQueues(grantee, "sqs:SendMessage")
	q.grantKeySecret(grantee) // a callback token's MAC
}

// grantUpdate allows grantee UpdateItem on the table naming only attrs.
func (q *JobQueue) grantUpdate(grantee awsiam.IGrantable, attrs []string) {
	grantee.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:    jsii.Strings("dynamodb:UpdateItem"),
		Resources:  jsii.Strings(*q.Table.TableArn()),
		Conditions: &map[string]any{"ForAllValues:StringEquals": map[string]any{"dynamodb:Attributes": attrs}},
	}))
}

// OperatorAttributes are the only attributes GrantOperate's UpdateItem
// may name (IAM counts the key, the update's targets and, at most, the
// condition's names): what the operator's writes name, no more. They
// decide whether and when a job runs: its state and schedule (state,
// attempt, runAt, deadline, leaseUntil, expiresAt, cancelled, cancelReq,
// queue, undispatched, cutOffs and the DLQ's counters), its reason
// (lastError, listErr), the byState index's keys (listState, listAt; IAM
// wants every index key listed), the write nonces every update shifts
// (nonce, nonce1, nonce2), and what the continuation paths name (parentId,
// parents, children, released) with the conditions' id, keyHash and
// nonJob. None of them lets an operator do more than its actions do
// (cancel, delete, requeue, move a job): see docs/operating.md.
var OperatorAttributes = []string{
	ledger.AttrPK, ledger.AttrID, ledger.AttrState, ledger.AttrAttempt, ledger.AttrUpdatedAt,
	ledger.AttrRunAt, ledger.AttrDeadline, ledger.AttrLeaseUntil, ledger.AttrExpiresAt,
	ledger.AttrCancelled, ledger.AttrCancelReq, ledger.AttrQueue, ledger.AttrUndispatched, ledger.AttrCutOffs,
	ledger.AttrReturns, ledger.AttrReturnOf, ledger.AttrReturnAt,
	ledger.AttrLastError, ledger.AttrListErr, ledger.AttrListState, ledger.AttrListAt,
	ledger.AttrNonce, ledger.AttrNonce1, ledger.AttrNonce2,
	ledger.AttrParentID, ledger.AttrParents, ledger.AttrChildren, ledger.AttrReleased,
	ledger.AttrKeyHash, ledger.AttrNonJob, ledger.AttrReopenWaits,
	ledger.AttrCompensable, // named in Cancel's condition: a compensable job is asked, not withdrawn
}

// SignalAttributes are the only attributes GrantSignal's UpdateItem may
// name: a signal's write (the steps, conditional on the job's state) and
// the wake of the job waiting for it (its run time).
var SignalAttributes = []string{
	ledger.AttrPK, ledger.AttrID, ledger.AttrState, ledger.AttrSteps, ledger.AttrRunAt, ledger.AttrUpdatedAt,
	ledger.AttrNonce, ledger.AttrNonce1, ledger.AttrNonce2,
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

// GrantPowertoolsIdempotency lets fn keep idempotency records in
// Powertools' layout on the nexjob table (package idempotency/powertools
// with KeyAttr "pk" and ExpiryAttr "expiresAt", or Powertools itself in
// Python or TypeScript with key_attr="pk", expiry_attr="expiresAt"),
// under keyPrefix, and nothing else: GetItem, PutItem, UpdateItem and
// DeleteItem of items whose key begins "<keyPrefix>#" (IAM's
// dynamodb:LeadingKeys). Those keys are Powertools' unkeyed hashes: no
// key secret is granted. keyPrefix follows the kinds rule (never "#" or
// "*", which would widen the grant) and is longer than one character
// (the table's own items begin with one letter and "#"): it panics
// otherwise. Give the function the table's name (q.Settings with any
// role, or the table's name as Powertools' table_name).
// TestPowertoolsGrantExactlyItsCalls runs the Go store's every path
// against this policy.
func (q *JobQueue) GrantPowertoolsIdempotency(fn awslambda.Function, keyPrefix string) {
	if !kinds.Valid(keyPrefix) || len(keyPrefix) < 2 {
		panic(fmt.Sprintf("nexjob infra: GrantPowertoolsIdempotency(%s, %q): the key prefix must be %s, and longer than one character", *fn.Node().Path(), keyPrefix, kinds.Rule))
	}
	fn.GrantPrincipal().AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:    jsii.Strings("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
		Resources:  jsii.Strings(*q.Table.TableArn()),
		Conditions: &map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []string{keyPrefix + "#*"}}},
	}))
}

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
	q.Steps.Grant(grantee, jsii.String("dynamodb:Query"))                          // a job's steps (get, the dashboard's job page)
	q.grantBlobs(grantee, []string{"steps/", "results/", "args/"}, "s3:GetObject") // its large values, result and args, read as they are shown (never listed)
	q.grantQueues(grantee, "sqs:GetQueueAttributes")
	q.grantDLQs(grantee, "sqs:ReceiveMessage", "sqs:GetQueueAttributes")
	// Not the key secret: a reader holding it and the table could mint
	// what it guards. Its processes run with NEXJOB_KEY_SECRET_WITHHELD
	// (lookups by key refused: admin.ErrKeySecretWithheld).
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

// grantBlobs grants actions on the blob bucket's objects under prefixes
// alone (steps/: large step values; results/: results over a record's
// room), no list, no delete: the lifecycle removes them.
func (q *JobQueue) grantBlobs(grantee awsiam.IGrantable, prefixes []string, actions ...string) {
	arns := make([]string, len(prefixes))
	for i, p := range prefixes {
		arns[i] = *q.Blobs.ArnForObjects(jsii.String(p + "*"))
	}
	awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
		Grantee: grantee, Actions: jsii.Strings(actions...), ResourceArns: jsii.Strings(arns...),
	})
}
