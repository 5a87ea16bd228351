// Command guard is the Lambda function fed by the ledger table's DynamoDB
// stream (filtered to jobs becoming Enqueued or Scheduled with attempt 0).
// It sends the delayed check messages that recover jobs written but never
// sent. Wiring only.
//
// Environment: NEXJOB_QUEUE_URL (required), NEXJOB_GUARD_AFTER (a Go
// duration, optional; default 2m).
package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/handler/guard"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	queueURL := os.Getenv("NEXJOB_QUEUE_URL")
	after, err := time.ParseDuration(os.Getenv("NEXJOB_GUARD_AFTER"))
	if queueURL == "" || (err != nil && os.Getenv("NEXJOB_GUARD_AFTER") != "") {
		log.Error("nexjob guard: NEXJOB_QUEUE_URL must be set; NEXJOB_GUARD_AFTER must be a duration")
		os.Exit(1)
	}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		log.Error("nexjob guard: AWS config", "err", err)
		os.Exit(1)
	}
	g := guard.New(sqs.NewFromConfig(cfg), queueURL, &guard.Options{After: after, Logger: log})
	lambda.Start(g.HandleStream)
}
