// Command app synthesises one stack with a JobQueue: `go run ./app` from
// infra/ writes cdk.out (no CDK CLI needed to synthesise); `cdk deploy`
// (cdk.json runs this) or `cdklocal deploy` deploys it.
//
// Environment: NEXJOB_CODE_DIR (default ../build/lambda), NEXJOB_STACK
// (default NexJob).
package main

import (
	"os"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
)

func main() {
	defer jsii.Close()
	props := &awscdk.AppProps{}
	if os.Getenv("CDK_OUTDIR") == "" { // run by `go run`, not by the CDK CLI
		props.Outdir = jsii.String("cdk.out")
	}
	app := awscdk.NewApp(props)
	Stack(app, envOr("NEXJOB_STACK", "NexJob"), envOr("NEXJOB_CODE_DIR", "../build/lambda"))
	app.Synth(nil)
}

// Stack builds the demo stack: a JobQueue and its outputs.
func Stack(app awscdk.App, name, codeDir string) awscdk.Stack {
	stack := awscdk.NewStack(app, jsii.String(name), &awscdk.StackProps{
		Description: jsii.String("nexjob-aws: background jobs on DynamoDB, SQS and Lambda"),
	})
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{CodeDir: codeDir})
	awscdk.NewCfnOutput(stack, jsii.String("TableName"), &awscdk.CfnOutputProps{Value: q.Table.TableName()})
	awscdk.NewCfnOutput(stack, jsii.String("QueueURL"), &awscdk.CfnOutputProps{Value: q.Queue.QueueUrl()})
	awscdk.NewCfnOutput(stack, jsii.String("DLQURL"), &awscdk.CfnOutputProps{Value: q.DeadLetterQueue.QueueUrl()})
	awscdk.NewCfnOutput(stack, jsii.String("WorkerFunction"), &awscdk.CfnOutputProps{Value: q.Worker.FunctionName()})
	return stack
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
