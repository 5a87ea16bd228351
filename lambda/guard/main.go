// Command guard is the Lambda function fed by the ledger table's DynamoDB
// stream (filtered to jobs becoming Enqueued or Scheduled with attempt 0).
// It sends the delayed check messages that recover jobs written but never
// sent. Wiring only.
//
// Environment: NEXJOB_QUEUE_URL (required), NEXJOB_GUARD_AFTER (a Go
// duration, optional; default 2m).
package main

import (
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/internal/lambdaenv"
)

func main() {
	env := lambdaenv.Load("guard", false)
	var after time.Duration
	if s := os.Getenv("NEXJOB_GUARD_AFTER"); s != "" {
		var err error
		if after, err = time.ParseDuration(s); err != nil {
			lambdaenv.Fail(env.Log, "NEXJOB_GUARD_AFTER", err)
		}
	}
	g := guard.New(sqs.NewFromConfig(env.Cfg), env.QueueURL, &guard.Options{After: after, Logger: env.Log})
	lambda.Start(g.HandleStream)
}
