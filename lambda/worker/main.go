// Command worker is the Lambda function fed by the job queue's SQS event
// source mapping (ReportBatchItemFailures on). Wiring only: configuration
// from the environment, the example jobs, the handler.
//
// Environment: NEXJOB_TABLE, NEXJOB_QUEUE_URL (required), NEXJOB_DLQ_URL
// (optional). AWS settings come from the Lambda runtime.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	h, err := setup(context.Background(), log)
	if err != nil {
		log.Error("nexjob worker: bad configuration", "err", err)
		os.Exit(1)
	}
	lambda.Start(h.Handle)
}

func setup(ctx context.Context, log *slog.Logger) (*handler.Handler, error) {
	table, queueURL := os.Getenv("NEXJOB_TABLE"), os.Getenv("NEXJOB_QUEUE_URL")
	if table == "" || queueURL == "" {
		return nil, fmt.Errorf("NEXJOB_TABLE and NEXJOB_QUEUE_URL must be set")
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	reg := handler.NewRegistry()
	seedjobs.Register(reg, &seedjobs.Charges{}, log, nil)
	return handler.New(cfg, table, queueURL, reg, &handler.Options{DLQURL: os.Getenv("NEXJOB_DLQ_URL"), Logger: log})
}
