// Command deadletter is the Lambda function fed by the job queue's DLQ. It
// records in the ledger why each message ended there and calls the job
// kind's dead-letter hook, so it registers the same kinds as the worker.
// Wiring only.
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
	lambdamain.DeadLetter(reg, nil)
}
