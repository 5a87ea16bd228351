package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

type signoff struct {
	Month string `json:"month"`
}

func (signoff) Kind() string { return "signoff" }

// The seed's reconciliation that needs a human's sign-off: the job waits
// for its "approval" signal, and `nexjob signal JOB approval JSON` sends
// it; the job resumes with the payload. A payload that is not JSON, and a
// second signal, are refused with nothing written.
func TestSignalCommand(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	by := make(chan string, 1)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[signoff](func(ctx context.Context, j *handler.Job[signoff]) error {
		a, err := handler.WaitForSignal[struct {
			By string `json:"by"`
		}](ctx, "approval", time.Hour)
		if err != nil {
			return err
		}
		by <- a.By
		return nil
	}), nil)
	h := r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := r.e.Client.Enqueue(context.Background(), signoff{Month: "2026-11"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	if rec := r.e.Get(t, res.ID); rec.State != ledger.Scheduled {
		t.Fatalf("the waiting job is %s", rec.State)
	}
	if _, _, err := r.cli(t, "signal", res.ID, "approval", "1Z999"); err == nil || !strings.Contains(err.Error(), "not valid JSON") || !strings.Contains(err.Error(), `'"1Z999"'`) {
		t.Fatalf("a payload that is not JSON: %v; want the error to show how to quote a string", err)
	}
	if out := r.must(t, "signal", res.ID, "approval", `{"by":"ada"}`); !strings.Contains(out, "signalled "+res.ID) {
		t.Fatalf("output %q", out)
	}
	if _, _, err := r.cli(t, "signal", res.ID, "approval", `{"by":"bo"}`); !errors.Is(err, ledger.ErrSignalSent) {
		t.Fatalf("a second signal: %v, want ErrSignalSent", err)
	}
	r.e.Drain(t, h)
	if got := <-by; got != "ada" || r.e.Get(t, res.ID).State != ledger.Succeeded {
		t.Fatalf("signed off by %q, job %s", got, r.e.Get(t, res.ID).State)
	}
	if out := r.must(t, "get", res.ID); strings.Contains(out, "due") {
		t.Fatalf("an ended job shows a due time:\n%s", out)
	}
}
