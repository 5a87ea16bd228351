// Command payments is the orders app's payments API: a Lambda function
// URL that charges a card once per Idempotency-Key header (see
// orders.PaymentsAPI). Its configuration is the construct's
// Settings(settings.Idempotent): the table and the key secret.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/settings"
)

func main() {
	ctx := context.Background()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	s, err := settings.Load(ctx, settings.Idempotent)
	if err != nil {
		log.Error("payments: bad configuration", "err", err)
		os.Exit(1)
	}
	store, err := idempotency.New(s.AWS, s.Table, &idempotency.Options{
		Ledger:    ledger.Options{KeySecret: s.KeySecret},
		Metrics:   metrics.New(nil), // EMF on stdout: CallRun, CallReplayed, … by function
		Logger:    log,
		CacheSize: 1000,
	})
	if err != nil {
		log.Error("payments: idempotency store", "err", err)
		os.Exit(1)
	}
	api, err := orders.PaymentsAPI(store, orders.LoggedProvider(log), log)
	if err != nil {
		log.Error("payments: API", "err", err)
		os.Exit(1)
	}
	lambda.Start(api)
}
