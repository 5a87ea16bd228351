package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

type estimate struct{ Item string }

func (estimate) Kind() string { return "estimate" }

type figure struct {
	Cents int    `json:"cents"`
	Note  string `json:"note"`
}

// TestGetShowsTheResult: get gives a Succeeded job's result size, and the
// result itself with --show-result, made safe to print (a bidi mark in it
// escaped); a job with no result has no result line.
func TestGetShowsTheResult(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[estimate, figure](func(_ context.Context, j *handler.Job[estimate]) (figure, error) {
		return figure{Cents: 990, Note: "quoted\u202e" + j.Args.Item}, nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[report](func(context.Context, *handler.Job[report]) error { return nil }), nil)
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, estimate{Item: "roof"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	none, err := e.Client.Enqueue(ctx, report{Name: "no-result"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, e.Handler(t, reg, &handler.Options{Logger: quiet}))
	e.RequireState(t, res.ID, ledger.Succeeded)
	run := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		env := map[string]string{settings.EnvTable: e.Table, settings.EnvQueueURL: e.QueueURL, settings.EnvDLQURL: e.DLQURL}
		c := &cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
		if err := c.run(ctx, args); err != nil {
			t.Fatalf("nexjob %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
		return out.String()
	}
	if out := run("get", res.ID); !regexpLine(out, `result\s+36 bytes \(--show-result prints it\)`) || strings.Contains(out, "roof") {
		t.Fatalf("get without --show-result:\n%s", out)
	}
	if out := run("get", res.ID, "--show-result"); !regexpLine(out, `result\s+\{"cents":990,"note":"quoted\\u202eroof"\}`) || strings.Contains(out, "\u202e") {
		t.Fatalf("get --show-result:\n%s", out)
	}
	if out := run("get", none.ID, "--show-result"); strings.Contains(out, "result") {
		t.Fatalf("get of a job with no result:\n%s", out)
	}
}
