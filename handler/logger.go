package handler

import (
	"context"
	"log/slog"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/nexjob/nexjob-aws/ledger"
)

type loggerKey struct{}

// Logger returns the job's logger inside a worker's Work: the handler's
// Options.Logger (the team's own slog.Handler) with the job's id, kind
// and attempt and, under Lambda, the invocation's request id. It never
// carries the job's args or key. Outside a run it is slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

func withJobLogger(ctx context.Context, base *slog.Logger, rec ledger.Record) context.Context {
	l := base.With("job_id", rec.ID, "kind", rec.Kind, "attempt", rec.Attempt)
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		l = l.With("aws_request_id", lc.AwsRequestID)
	}
	return context.WithValue(ctx, loggerKey{}, l)
}
