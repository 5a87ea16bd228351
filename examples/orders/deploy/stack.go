// Package deploy is the orders app's CDK stack (its own module, so no
// runtime binary of the app links the CDK): the job queue construct
// running the app's own worker binary in all three roles, and the
// producer function allowed to enqueue.
package deploy

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/settings"
)

// Dirs are where the app's bootstraps are built (make orders-lambdas).
type Dirs struct {
	Worker   string // cmd/worker: worker, DLQ consumer and guard
	Producer string // cmd/producer
	Payments string // cmd/payments
}

// Stack builds the orders stack.
func Stack(app awscdk.App, name string, dirs Dirs) awscdk.Stack {
	stack := awscdk.NewStack(app, jsii.String(name), &awscdk.StackProps{
		Description: jsii.String("orders: an example app on nexjob-aws"),
	})
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{
		Code:      infra.BootstrapCode(dirs.Worker),
		Retention: &infra.Retention{Failed: awscdk.Duration_Days(jsii.Number(90))},
	})
	producer := awslambda.NewFunction(stack, jsii.String("PlaceOrder"), &awslambda.FunctionProps{
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: awslambda.Architecture_ARM_64(),
		Handler:      jsii.String("bootstrap"),
		Code:         infra.BootstrapCode(dirs.Producer),
		Timeout:      awscdk.Duration_Seconds(jsii.Number(10)),
		Environment:  q.Settings(settings.Producer),
	})
	q.GrantEnqueue(producer)
	awscdk.NewCfnOutput(stack, jsii.String("PlaceOrderFunction"), &awscdk.CfnOutputProps{Value: producer.FunctionName()})

	// The payments API: a function URL that charges once per
	// Idempotency-Key (package idempotency), on the job table's call
	// records only. IAM-authorised: callers sign with SigV4 (put a
	// CloudFront or API Gateway in front for browsers).
	payments := awslambda.NewFunction(stack, jsii.String("Payments"), &awslambda.FunctionProps{
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: awslambda.Architecture_ARM_64(),
		Handler:      jsii.String("bootstrap"),
		Code:         infra.BootstrapCode(dirs.Payments),
		Timeout:      awscdk.Duration_Seconds(jsii.Number(10)), // the hold ends with the invocation: a timed-out charge's retry runs right after
		Environment:  q.Settings(settings.Idempotent),
	})
	q.GrantIdempotency(payments, "payments") // its records: i#payments#* only
	url := payments.AddFunctionUrl(&awslambda.FunctionUrlOptions{AuthType: awslambda.FunctionUrlAuthType_AWS_IAM})
	awscdk.NewCfnOutput(stack, jsii.String("PaymentsURL"), &awscdk.CfnOutputProps{Value: url.Url()})
	return stack
}
