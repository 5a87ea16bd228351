// Package lambdaenv is the shared start of the Lambda mains: a JSON logger,
// the required environment and the SDK configuration. A missing setting
// stops the function at start with a clear log line, not at the first job.
package lambdaenv

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
)

// Env is what every function needs.
type Env struct {
	Log      *slog.Logger
	Cfg      aws.Config
	Table    string // NEXJOB_TABLE
	QueueURL string // NEXJOB_QUEUE_URL
	DLQURL   string // NEXJOB_DLQ_URL, optional
}

// Load reads the environment; needTable says whether NEXJOB_TABLE is
// required. It exits the process on a bad configuration.
func Load(name string, needTable bool) Env {
	e := Env{
		Log:      slog.New(slog.NewJSONHandler(os.Stdout, nil)).With("function", name),
		Table:    os.Getenv("NEXJOB_TABLE"),
		QueueURL: os.Getenv("NEXJOB_QUEUE_URL"),
		DLQURL:   os.Getenv("NEXJOB_DLQ_URL"),
	}
	if e.QueueURL == "" || needTable && e.Table == "" {
		Fail(e.Log, "NEXJOB_QUEUE_URL and NEXJOB_TABLE must be set", nil)
	}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		Fail(e.Log, "AWS configuration", err)
	}
	e.Cfg = cfg
	return e
}

// Fail logs a start-up error and exits.
func Fail(log *slog.Logger, msg string, err error) {
	log.Error("nexjob: bad configuration: "+msg, "err", err)
	os.Exit(1)
}
