// Command producer is the orders app's API function: invoked with an
// order, it places it. Its configuration is the construct's settings
// (NEXJOB_TABLE, NEXJOB_QUEUE_URL, …, see package settings).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/settings"
)

func main() {
	ctx := context.Background()
	s, err := settings.Load(ctx, settings.Producer)
	if err != nil {
		slog.Error("orders: bad configuration", "err", err)
		os.Exit(1)
	}
	// EMF on stdout: the producer's Enqueued, Deduplicated and Rejected
	// counts reach CloudWatch from its log stream.
	client, err := s.Client(&enqueue.ClientOptions{Metrics: metrics.New(nil)})
	if err != nil {
		slog.Error("orders: enqueue client", "err", err)
		os.Exit(1)
	}
	lambda.Start(func(ctx context.Context, o orders.Order) (orders.Placed, error) {
		return orders.Place(ctx, client, o)
	})
}
