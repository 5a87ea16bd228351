// Command deadletter is the Lambda function fed by the job queue's DLQ. It
// records in the ledger why each message ended there and calls the job
// kind's dead-letter hook. Wiring only.
//
// Environment: NEXJOB_TABLE, NEXJOB_QUEUE_URL (required).
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/lambdaenv"
)

func main() {
	env := lambdaenv.Load("deadletter", true)
	reg := handler.NewRegistry() // the same kinds, for their dead-letter hooks
	seedjobs.Register(reg, &seedjobs.Charges{}, env.Log, nil)
	h, err := handler.New(env.Cfg, env.Table, env.QueueURL, reg, &handler.Options{Logger: env.Log})
	if err != nil {
		lambdaenv.Fail(env.Log, "handler", err)
	}
	lambda.Start(h.HandleDeadLetters)
}
