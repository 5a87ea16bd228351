// Command local runs the orders app's jobs on this machine: the worker
// and the DLQ consumer, against the queues and table the environment
// names (NEXJOB_TABLE, NEXJOB_QUEUE_URL, NEXJOB_DLQ_URL; AWS_ENDPOINT_URL
// for the emulator or LocalStack), until Ctrl-C. Wiring only.
//
//	eval "$(go run github.com/nexjob/nexjob-aws/cmd/nexjob provision orders)"
//	go run ./cmd/local
package main

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/lambdamain"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := lambdamain.Local(ctx, orders.Registry(), nil)
	stop() // before log.Fatal, which runs no deferred call
	if err != nil {
		log.Fatal(err)
	}
}
