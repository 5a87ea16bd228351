// Command serve is the seed jobs' one binary for every role
// (lambdamain.Serve: NEXJOB_ROLE picks the worker, the DLQ consumer, the
// guard, the dashboard, the recurring target or the completion events),
// the README's recommendation; make sizes compares it with
// lambda/worker, which links the worker alone.
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
	lambdamain.Serve(reg, nil)
}
