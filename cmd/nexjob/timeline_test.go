package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

type tlOrder struct{}

func (tlOrder) Kind() string { return "tl-order" }

type tlShip struct{}

func (tlShip) Kind() string { return "tl-ship" }

// TestGetShowsTheTimeline (issue 39 item 11): get shows a durable job's
// steps in order (name, when, size, where), its child with its state and
// end, its signal's wait and its compensation; values only with
// --show-steps, escaped (a bidi mark in a step's value never reaches the
// terminal).
func TestGetShowsTheTimeline(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[tlOrder](func(ctx context.Context, j *handler.Job[tlOrder]) error {
		if _, err := handler.Step(ctx, "charge.card[0]", func(context.Context) (string, error) { return "ch_1\u202eevil", nil }); err != nil {
			return err
		}
		if err := handler.Compensate(ctx, "refund", func(context.Context) error { return nil }); err != nil {
			return err
		}
		if _, err := handler.Invoke[int](ctx, "ship", tlShip{}, nil); err != nil {
			return err
		}
		return handler.Permanent(errors.New("the customer cancelled"))
	}), nil)
	handler.AddWorkerResult(reg, handler.ResultFunc[tlShip, int](func(context.Context, *handler.Job[tlShip]) (int, error) { return 42, nil }), nil)
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, tlOrder{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, e.Handler(t, reg, &handler.Options{Logger: quiet}))
	e.RequireState(t, res.ID, ledger.Failed)
	run := func(args ...string) string {
		t.Helper()
		out, errOut, err := runCLI(e, args...)
		if err != nil {
			t.Fatalf("nexjob %s: %v\n%s", strings.Join(args, " "), err, errOut)
		}
		return out
	}
	out := run("get", res.ID)
	order := []string{`step "charge.card[0]" (`, `child "ship" started: job `, `(Succeeded)`, ` ended Succeeded`, `compensation "refund" ran`}
	at := 0
	for _, want := range order {
		i := strings.Index(out[at:], want)
		if i < 0 {
			t.Fatalf("get: %q missing, or out of order:\n%s", want, out)
		}
		at += i
	}
	if strings.Contains(out, "ch_1") || !strings.Contains(out, "steps table") {
		t.Fatalf("get without --show-steps shows a value, or no place:\n%s", out)
	}
	out = run("get", res.ID, "--show-steps")
	if !strings.Contains(out, `ch_1\u202eevil`) || strings.Contains(out, "\u202e") {
		t.Fatalf("get --show-steps: the value is missing or not escaped:\n%s", out)
	}
}
