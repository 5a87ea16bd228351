package handler

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/nexjob/nexjob-aws/ledger"
)

type loggerKey struct{}

// jobLog is a run's logger, made on its first use (most runs never log,
// and With copies the handler's attributes), and the run's start.
type jobLog struct {
	base          *slog.Logger
	id, kind, req string
	attempt       int
	start         time.Time // wall clock: the run's durations
	began         time.Time // the store's clock at the start: an ended job's RunAt (ledger.Finish.Began)
	steps         *steps    // in a worker's run only
	once          sync.Once
	l             *slog.Logger
}

func (j *jobLog) logger() *slog.Logger {
	j.once.Do(func() {
		j.l = j.base.With("job_id", j.id, "kind", j.kind, "attempt", j.attempt)
		if j.req != "" {
			j.l = j.l.With("aws_request_id", j.req)
		}
	})
	return j.l
}

// Logger returns the job's logger inside a worker's Work: the handler's
// Options.Logger (the team's own slog.Handler) with the job's id, kind
// and attempt and, under Lambda, the invocation's request id. It never
// carries the job's args or key. A dead-letter hook called at the end of
// a run gets it too. Outside a run it is slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if j := runOf(ctx); j != nil {
		return j.logger()
	}
	return slog.Default()
}

// runOf is the run ctx is in, nil outside one.
func runOf(ctx context.Context) *jobLog {
	j, _ := ctx.Value(loggerKey{}).(*jobLog)
	return j
}

// withRun is ctx inside a run of rec that started at start: Logger gives
// the job's logger, runStart the start.
func withRun(ctx context.Context, base *slog.Logger, rec ledger.Record, start time.Time) context.Context {
	j := &jobLog{base: base, id: rec.ID, kind: rec.Kind, attempt: rec.Attempt, start: start}
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		j.req = lc.AwsRequestID
	}
	return context.WithValue(ctx, loggerKey{}, j)
}

// runStart is the start of the run ctx is in, if it is in one.
func runStart(ctx context.Context) (time.Time, bool) {
	if j := runOf(ctx); j != nil {
		return j.start, true
	}
	return time.Time{}, false
}
