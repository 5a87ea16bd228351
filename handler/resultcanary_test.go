package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// cardQuote's worker returns a cardResult holding the canary, encoded as
// Mode says.
type cardQuote struct{ Mode string }

func (cardQuote) Kind() string { return "card-quote" }

type cardResult struct{ Mode, Card string }

func (r cardResult) MarshalJSON() ([]byte, error) {
	switch r.Mode {
	case "fails":
		return nil, fmt.Errorf("cannot encode card %s", r.Card)
	case "big":
		return json.Marshal(strings.Repeat(r.Card, 2000)) // 32 KB
	case "not-utf8":
		return []byte(`"` + r.Card + "\xff\""), nil
	}
	return json.Marshal(map[string]string{"card": r.Card})
}

// TestNoResultInAnyOutput: results holding the canary, one kept, one
// that does not encode, one over the limit and one that is not UTF-8:
// the canary is in no log line, EMF line or span, and in no attribute of
// a record but the kept one's result. The three that cannot be kept fail
// at once, each with its typed error.
func TestNoResultInAnyOutput(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var logs, emf syncBuf
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[cardQuote, cardResult](func(_ context.Context, j *handler.Job[cardQuote]) (cardResult, error) {
		return cardResult{Mode: j.Args.Mode, Card: canary}, nil
	}), nil)
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &handler.Options{
		Logger:         slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:        metrics.New(&metrics.Options{Out: &emf}),
		TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	modes := []string{"kept", "fails", "big", "not-utf8"}
	ids := map[string]string{}
	for _, m := range modes {
		ids[m] = enqueueOne(t, e.Client, cardQuote{Mode: m}, &enqueue.Opts{MaxAttempts: 3})
	}
	e.Drain(t, h)

	if rec := e.RequireState(t, ids["kept"], ledger.Succeeded); rec.Result != `{"card":"`+canary+`"}` {
		t.Fatalf("kept result %q", rec.Result)
	}
	for _, m := range modes[1:] {
		rec := e.RequireState(t, ids[m], ledger.Failed)
		if rec.Attempt != 1 || rec.Result != "" {
			t.Errorf("%s: attempt %d, result %q; want a permanent failure keeping nothing", m, rec.Attempt, rec.Result)
		}
		want := map[string]string{"fails": "MarshalJSON method", "big": "32002 bytes", "not-utf8": "not UTF-8"}[m]
		if !strings.Contains(rec.LastError, want) {
			t.Errorf("%s: last error %q does not say %q", m, rec.LastError, want)
		}
	}
	for m, id := range ids {
		item := rawItem(t, e, id)
		for name, v := range item {
			if strings.Contains(fmt.Sprint(v), canary) && (m != "kept" || name != ledger.AttrResult) {
				t.Errorf("job %s: the record's %s holds the canary", m, name)
			}
		}
	}
	noCanary(t, "a log line", logs.String())
	noCanary(t, "an EMF line", emf.String())
	if len(sr.Ended()) == 0 {
		t.Fatal("no spans recorded")
	}
	for _, s := range sr.Ended() {
		noCanary(t, "span "+s.Name(), fmt.Sprint(s.Name(), s.Attributes(), s.Events(), s.Status()))
	}
}

func noCanary(t *testing.T, what, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, canary) {
			t.Errorf("%s holds the canary: %.400s", what, line)
		}
	}
}

// rawItem is the job's item as DynamoDB holds it (unkeyed: under j#id).
func rawItem(t *testing.T, e *awstest.Env, id string) map[string]types.AttributeValue {
	t.Helper()
	out, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(e.Table), Key: map[string]types.AttributeValue{
		ledger.AttrPK: &types.AttributeValueMemberS{Value: "j#" + id},
	}})
	if err != nil || out.Item == nil {
		t.Fatalf("read job %s's item: %v", id, errors.Join(err, errors.New("no item")))
	}
	return out.Item
}
