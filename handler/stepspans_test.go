package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A span per step that runs (issue 39 item 11): the run's child, named
// "step" with the step's name as an attribute, the parent of what its
// function does: a child job's run (its message carries the step's
// context); a failed step's span is an error; a replayed step makes
// none.
func TestStepSpans(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[tlParentJob](func(ctx context.Context, j *handler.Job[tlParentJob]) error {
		if _, err := handler.Step(ctx, "charge", func(context.Context) (int, error) {
			if j.Attempt == 1 {
				return 0, errors.New("declined for now")
			}
			return 1, nil
		}); err != nil {
			return err
		}
		_, err := handler.Invoke[int](ctx, "ship", tlChildJob{}, nil)
		return err
	}), nil)
	handler.AddWorkerResult(reg, handler.ResultFunc[tlChildJob, int](func(context.Context, *handler.Job[tlChildJob]) (int, error) { return 2, nil }), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet, TracerProvider: tp})
	prod, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{TracerProvider: tp, Ledger: ledger.Options{StepsTable: e.StepsTable, Now: e.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := prod.Enqueue(context.Background(), tlParentJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.RunToEnd(t, h, res.ID); rec.State != ledger.Succeeded {
		t.Fatalf("%s (%s)", rec.State, rec.LastError)
	}
	byStep := map[string][]sdktrace.ReadOnlySpan{}
	var runs []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch {
		case s.Name() == "step":
			byStep[spanAttr(s, "nexjob.step")] = append(byStep[spanAttr(s, "nexjob.step")], s)
		case strings.HasPrefix(s.Name(), "process "):
			runs = append(runs, s)
		}
	}
	charge, invoke := byStep["charge"], byStep[ledger.InvokeStep("ship")]
	if len(charge) != 2 || charge[0].Status().Code != codes.Error || charge[1].Status().Code == codes.Error {
		t.Fatalf("charge's spans: %d (want 2: the failed call, an error, and the one that succeeded)", len(charge))
	}
	if len(invoke) != 1 {
		t.Fatalf("the invoke step's spans: %d, want 1 (a replay makes none)", len(invoke))
	}
	found := false
	for _, s := range runs {
		if s.Parent().SpanID() == invoke[0].SpanContext().SpanID() && spanAttr(s, "nexjob.kind") == "span-child" {
			found = true
		}
	}
	if !found {
		t.Fatalf("the child job's run is not the invoke step's child: its trace is not under its step")
	}
}

type tlParentJob struct{}

func (tlParentJob) Kind() string { return "span-parent" }

type tlChildJob struct{}

func (tlChildJob) Kind() string { return "span-child" }
