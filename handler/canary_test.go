package handler_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// The canary: a card number the args carry. It must appear nowhere but
// in the record's args.
const canary = "4111111111111111"

// What the producer sends, and what the workers expect (the same kinds,
// other types, so the args do not decode).
type cardWhen struct{ At string }

func (cardWhen) Kind() string { return "card-when" }

type cardWhenIn struct{ At time.Time } // "4111…" does not parse as a time: json quotes it

func (cardWhenIn) Kind() string { return "card-when" }

type cardNumber struct{ Card int64 }

func (cardNumber) Kind() string { return "card-number" }

type cardNumberIn struct{ Card string } // a JSON number into a string: json quotes "number 4111…"

func (cardNumberIn) Kind() string { return "card-number" }

type cardErr struct{ Ref string }

func (cardErr) Kind() string { return "card-err" }

// syncBuf is a buffer the handler's goroutines write to.
type syncBuf = awstest.Buffer

// TestNoArgsInAnyOutput: args that do not decode (json's errors quote the
// value: a time that does not parse, a number into a string) and a worker
// error of 8.5 KB whose tail holds the canary end Failed, and the canary
// is in no log line, EMF line, span (name, attributes, events) or record
// field but the args. Every log line stays under the cap plus its frame.
func TestNoArgsInAnyOutput(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	var logs, emf syncBuf
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reg := handler.NewRegistry()
	never := errors.New("the worker ran on args that did not decode")
	handler.AddWorker(reg, handler.WorkFunc[cardWhenIn](func(context.Context, *handler.Job[cardWhenIn]) error { return never }), nil)
	handler.AddWorker(reg, handler.WorkFunc[cardNumberIn](func(context.Context, *handler.Job[cardNumberIn]) error { return never }), nil)
	handler.AddWorker(reg, handler.WorkFunc[cardErr](func(ctx context.Context, j *handler.Job[cardErr]) error {
		// A worker quoting what it was given, at length: 8.5 KB, the canary last.
		return fmt.Errorf("charge refused for ada@example.com: %s card %s", strings.Repeat("detail ", 1200), canary)
	}), nil)
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &handler.Options{
		Logger:         slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:        metrics.New(&metrics.Options{Out: &emf}),
		TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{TracerProvider: tp, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, args := range []enqueue.JobArgs{cardWhen{At: canary}, cardNumber{Card: 4111111111111111}, cardErr{Ref: "r-1"}} {
		res, err := prod.Enqueue(context.Background(), args, &enqueue.Opts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	e.Drain(t, h)

	for i, id := range ids {
		rec, err := e.Client.Store().Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != ledger.Failed || rec.LastError == "" {
			t.Fatalf("job %d: %s %q, want Failed with a reason", i, rec.State, rec.LastError)
		}
		if i < 2 && !strings.Contains(rec.LastError, "do not decode") {
			t.Fatalf("job %d: last error %q does not say the args do not decode", i, rec.LastError)
		}
		item, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(e.Table), Key: map[string]types.AttributeValue{
			ledger.AttrPK: &types.AttributeValueMemberS{Value: "j#" + id},
		}})
		if err != nil || item.Item == nil {
			t.Fatalf("read job %d's item: %v", i, err)
		}
		for name, v := range item.Item {
			if name != "args" && strings.Contains(fmt.Sprint(v), canary) {
				t.Errorf("job %d: the record's %s holds the canary: %.300v", i, name, v)
			}
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, canary) {
			t.Errorf("a log line holds the canary: %.400s", line)
		}
		if len(line) > ledger.MaxLastError+1000 {
			t.Errorf("a log line of %d bytes: a worker's error is logged uncapped", len(line))
		}
	}
	for _, line := range strings.Split(emf.String(), "\n") {
		if strings.Contains(line, canary) {
			t.Errorf("an EMF line holds the canary: %s", line)
		}
	}
	if len(sr.Ended()) == 0 {
		t.Fatal("no spans recorded")
	}
	for _, s := range sr.Ended() {
		if strings.Contains(fmt.Sprint(s.Name(), s.Attributes(), s.Events(), s.Status()), canary) {
			t.Errorf("span %s holds the canary", s.Name())
		}
		for _, ev := range s.Events() {
			if l := len(fmt.Sprint(ev.Attributes)); l > ledger.MaxLastError+1000 {
				t.Errorf("span %s: an event of %d bytes (uncapped error)", s.Name(), l)
			}
		}
	}
}
