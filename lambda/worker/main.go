// Command worker is the Lambda function fed by the job queue's SQS event
// source mapping (ReportBatchItemFailures on), running the seed's example
// jobs. Wiring only: lambdamain reads the environment (see package
// settings) and starts the handler.
package main

import (
	"log/slog"

	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/lambdamain"
)

func main() {
	reg := handler.NewRegistry()
	seedjobs.Register(reg, &seedjobs.Charges{}, slog.Default(), nil)
	lambdamain.Worker(reg, nil)
}
