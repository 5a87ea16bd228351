// Command deadletter is the Lambda function fed by the job queue's DLQ. It
// records in the ledger why each message ended there and calls the job
// kind's dead-letter hook. Wiring only.
//
// Environment: NEXJOB_TABLE, NEXJOB_QUEUE_URL (required).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	table, queueURL := os.Getenv("NEXJOB_TABLE"), os.Getenv("NEXJOB_QUEUE_URL")
	if table == "" || queueURL == "" {
		log.Error("nexjob deadletter: NEXJOB_TABLE and NEXJOB_QUEUE_URL must be set")
		os.Exit(1)
	}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		log.Error("nexjob deadletter: AWS config", "err", err)
		os.Exit(1)
	}
	reg := handler.NewRegistry() // the same kinds, for their dead-letter hooks
	seedjobs.Register(reg, &seedjobs.Charges{}, log, nil)
	h, err := handler.New(cfg, table, queueURL, reg, &handler.Options{Logger: log})
	if err != nil {
		log.Error("nexjob deadletter: setup", "err", err)
		os.Exit(1)
	}
	lambda.Start(h.HandleDeadLetters)
}
