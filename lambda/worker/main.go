// Command worker is the Lambda function fed by the job queue's SQS event
// source mapping (ReportBatchItemFailures on). Wiring only: configuration
// from the environment, the example jobs, the handler.
//
// Environment: NEXJOB_TABLE, NEXJOB_QUEUE_URL (required), NEXJOB_DLQ_URL
// (optional: where messages that are not jobs go). AWS settings come from
// the Lambda runtime.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/lambdaenv"
)

func main() {
	env := lambdaenv.Load("worker", true)
	reg := handler.NewRegistry()
	seedjobs.Register(reg, &seedjobs.Charges{}, env.Log, nil)
	h, err := handler.New(env.Cfg, env.Table, env.QueueURL, reg, &handler.Options{DLQURL: env.DLQURL, Logger: env.Log})
	if err != nil {
		lambdaenv.Fail(env.Log, "handler", err)
	}
	lambda.Start(h.Handle)
}
