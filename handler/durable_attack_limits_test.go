package handler_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type atkResult struct {
	N int `json:"n"`
}

func (atkResult) Kind() string { return "atk.result" }

type atkOut struct {
	Pad string `json:"pad"`
}

// README, Signals: "Signals and waits are kept in the job's steps (under
// names a worker's step cannot take), so they count in the steps'
// limits." Steps, Bounded: "a job at most 100 steps and 64 KB of them,
// and never so much that args and steps pass the record's room."
// Results, Bounded: "The room is reserved in every record ..., so no
// result can push a record over DynamoDB's item limit."
//
// Signals of distinct names, each within MaxStepBytes, are all accepted
// (ledger.Signal checks only the one payload: CheckStep(Record{}, ...)),
// so a job's steps grow far past 64 KB and eat the result's room: the
// worker's 16 KB result then cannot be written and the job never
// succeeds.
func TestAttackSignalsPassTheStepsLimits(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[atkResult, atkOut](func(ctx context.Context, j *handler.Job[atkResult]) (atkOut, error) {
		return atkOut{Pad: strings.Repeat("r", 16_370)}, nil // 16,380 bytes of JSON: under MaxResultBytes
	}), nil)
	var logs bytes.Buffer
	h := e.Handler(t, reg, &handler.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, atkResult{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("p", 16_380) // 16,382 bytes of JSON: under MaxStepBytes
	accepted := 0
	for i := range 24 {
		err := e.Client.Signal(ctx, res.ID, fmt.Sprintf("s%02d", i), payload)
		var se *ledger.StepError
		if errors.As(err, &se) {
			break // the steps' limits, counted with the job's steps (before: all 24 accepted)
		}
		if err != nil {
			t.Fatalf("signal %d: %v", i, err)
		}
		accepted++
	}
	if accepted == 0 || accepted >= 24 {
		t.Fatalf("%d of 24 signals of 16 KB accepted; want those within the 64 KB of steps, then a *ledger.StepError", accepted)
	}
	rec := e.Get(t, res.ID)
	total := 0
	for n, r := range rec.Steps {
		total += len(n) + len(r)
	}
	if total > ledger.MaxStepsBytes || len(rec.Steps) > ledger.MaxSteps {
		t.Errorf("%d signals of %d bytes accepted: the job's steps are %d bytes, over MaxStepsBytes %d", accepted, len(payload)+2, total, ledger.MaxStepsBytes)
	}
	// One delivery, as Lambda makes it: the run claims the job and
	// returns its result.
	if _, err := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1}).Poll(ctx); err != nil {
		t.Fatal(err)
	}
	rec = e.Get(t, res.ID)
	var out atkOut
	if err := e.Client.Result(ctx, res.ID, &out); err != nil || len(out.Pad) != 16_370 {
		// (On AWS the refused write leaves the job Processing; moto
		// applies the update's actions before the one that passes the
		// size and keeps them: Succeeded with no result.)
		t.Fatalf("the job's 16 KB result after signals filled its steps: %s, attempt %d; Result: %v; the handler logged: %s", rec.State, rec.Attempt, err, strings.TrimSpace(logs.String()))
	}
}
