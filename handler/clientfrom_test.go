package handler_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Invoice is a month's invoice; its worker enqueues the invoice's email.
type Invoice struct {
	Month string `json:"month"`
}

func (Invoice) Kind() string { return "invoice" }

// InvoiceEmail is the follow-up job.
type InvoiceEmail struct {
	Month string `json:"month"`
}

func (InvoiceEmail) Kind() string { return "invoice.email" }

// A worker enqueues a follow-up job with the client of the handler that
// runs it (ClientFrom), keyed so a retry of the invoice sends one email.
func ExampleClientFrom() {
	var mu sync.Mutex
	var sent []string
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[Invoice](func(ctx context.Context, j *handler.Job[Invoice]) error {
		client, err := handler.ClientFrom(ctx)
		if err != nil {
			return err
		}
		_, err = client.Enqueue(ctx, InvoiceEmail(j.Args), &enqueue.Opts{IdempotencyKey: "invoice-email/" + j.Args.Month})
		return err
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[InvoiceEmail](func(_ context.Context, j *handler.Job[InvoiceEmail]) error {
		mu.Lock()
		sent = append(sent, j.Args.Month)
		mu.Unlock()
		return nil
	}), nil)
	exampleRun("clientfrom", reg, []enqueue.JobArgs{Invoice{Month: "2026-11"}}, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sent) > 0 // the email ran too
	})
	mu.Lock()
	fmt.Println("emails sent:", sent)
	mu.Unlock()
	// Output: emails sent: [2026-11]
}

// TestClientFrom: a worker and a dead-letter hook get the handler's own
// client; outside Handle and HandleDeadLetters it is ErrNotInRun.
func TestClientFrom(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	var got, hooked *enqueue.Client
	handler.AddWorker(reg, handler.WorkFunc[Invoice](func(ctx context.Context, _ *handler.Job[Invoice]) error {
		c, err := handler.ClientFrom(ctx)
		got = c
		if err != nil {
			return err
		}
		return handler.Permanent(errors.New("bounced"))
	}), &handler.KindOptions{OnDeadLetter: func(ctx context.Context, _ ledger.Record, _ error) error {
		hooked, _ = handler.ClientFrom(ctx)
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(context.Background(), Invoice{Month: "2026-11"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, res.ID, ledger.Failed)
	if got == nil || got != h.Producer() || hooked != h.Producer() {
		t.Fatalf("worker's client %p, hook's %p; want the handler's %p", got, hooked, h.Producer())
	}
	if _, err := handler.ClientFrom(context.Background()); !errors.Is(err, handler.ErrNotInRun) {
		t.Fatalf("outside a run: %v, want ErrNotInRun", err)
	}
}
