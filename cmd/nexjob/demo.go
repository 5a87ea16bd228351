package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/provision"
)

// demo provisions its own resources, prints the DuplicatePolicy matrix as
// real enqueues decide it, then runs the seed's jobs through the worker and
// prints how each ended.
func demo(ctx context.Context, cfg aws.Config, w io.Writer) (demoRun, error) {
	name := fmt.Sprintf("nexjob-demo-%d", time.Now().Unix())
	db, q := dynamodb.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	if err := provision.Table(ctx, db, name); err != nil {
		return demoRun{}, err
	}
	queueURL, dlqURL, err := provision.Queues(ctx, q, provision.QueueSpec{Name: name, VisibilityTimeout: 30 * time.Second})
	if err != nil {
		return demoRun{}, err
	}
	matrixURL, _, err := provision.Queues(ctx, q, provision.QueueSpec{Name: name + "-matrix"})
	if err != nil {
		return demoRun{}, err
	}
	run := demoRun{table: name, queueURL: queueURL, dlqURL: dlqURL}
	fmt.Fprintf(w, "nexjob-aws demo: table %s, queue %s\n\n", name, queueURL)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := matrix(ctx, cfg, name, matrixURL, quiet, w); err != nil {
		return run, err
	}
	return run, runSeedJobs(ctx, cfg, name, queueURL, dlqURL, quiet, w)
}

// demoRun names the demo's table and queues.
type demoRun struct{ table, queueURL, dlqURL string }

// seedWorker is the worker of the seed's jobs (retries one second apart).
func seedWorker(cfg aws.Config, run demoRun, log *slog.Logger) (*handler.Handler, error) {
	reg := handler.NewRegistry()
	seedjobs.Register(reg, &seedjobs.Charges{}, log, func(int) time.Duration { return time.Second })
	return handler.New(cfg, run.table, run.queueURL, reg, &handler.Options{DLQURL: run.dlqURL, Logger: log})
}

// startWorker polls the queue into h until the returned stop is called.
func startWorker(ctx context.Context, cfg aws.Config, h *handler.Handler, queueURL string, log *slog.Logger) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = poller.New(sqs.NewFromConfig(cfg), queueURL, h.Handle, &poller.Options{FunctionTimeout: 25 * time.Second, Logger: log}).Run(wctx)
	}()
	return func() { cancel(); <-done }
}

// matrix stages an existing job in every state with the ledger's own
// transitions (the ones the worker uses), on a queue no worker reads, and
// prints what a second enqueue with the same key does under each policy.
func matrix(ctx context.Context, cfg aws.Config, table, queueURL string, log *slog.Logger, w io.Writer) error {
	c, err := enqueue.New(cfg, table, queueURL, &enqueue.ClientOptions{Logger: log})
	if err != nil {
		return err
	}
	s := c.Store()
	finish := func(id string, f ledger.Finish) error {
		rec, err := s.Claim(ctx, id, time.Minute)
		if err != nil {
			return err
		}
		_, err = s.Finish(ctx, rec, f)
		return err
	}
	stage := map[string]func(key string) error{
		"Enqueued": func(key string) error {
			_, err := c.Enqueue(ctx, seedjobs.Payment{OrderID: key}, &enqueue.Opts{IdempotencyKey: key})
			return err
		},
		"Scheduled": func(key string) error {
			_, err := c.Enqueue(ctx, seedjobs.Payment{OrderID: key}, &enqueue.Opts{IdempotencyKey: key, Delay: time.Hour})
			return err
		},
		"Processing": func(key string) error {
			return enqueueThen(ctx, c, key, func(id string) error { _, err := s.Claim(ctx, id, time.Hour); return err })
		},
		"AwaitingContinuation": func(key string) error {
			parent, err := c.Enqueue(ctx, seedjobs.Payment{OrderID: key + "-parent"}, nil)
			if err != nil {
				return err
			}
			_, err = c.ContinueWith(ctx, parent.ID, seedjobs.Payment{OrderID: key}, &enqueue.Opts{IdempotencyKey: key})
			return err
		},
		"Succeeded": func(key string) error {
			return enqueueThen(ctx, c, key, func(id string) error { return finish(id, ledger.Finish{State: ledger.Succeeded}) })
		},
		"Failed": func(key string) error {
			return enqueueThen(ctx, c, key, func(id string) error { return finish(id, ledger.Finish{State: ledger.Failed, LastError: "boom"}) })
		},
		"Expired": func(key string) error {
			return enqueueThen(ctx, c, key, func(id string) error { return finish(id, ledger.Finish{State: ledger.Expired}) })
		},
		"no record": func(string) error { return nil },
		"record past its TTL": func(key string) error {
			return enqueueThen(ctx, c, key, func(id string) error {
				return finish(id, ledger.Finish{State: ledger.Failed, ExpiresAt: time.Now().Add(-time.Second)})
			})
		},
	}
	rows := []string{"Enqueued", "Scheduled", "Processing", "AwaitingContinuation", "Succeeded", "Failed", "Expired", "no record", "record past its TTL"}
	policies := []ledger.DuplicatePolicy{enqueue.AllowAfterFailed, enqueue.RejectIfFailed, enqueue.RejectAlways}
	fmt.Fprintln(w, "(a) A second enqueue with the same idempotency key, by the existing job's state and the DuplicatePolicy:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "existing job\tAllowAfterFailed\tRejectIfFailed\tRejectAlways")
	for i, row := range rows {
		cells := []string{row}
		for j, p := range policies {
			key := fmt.Sprintf("matrix-%d-%d", i, j)
			if err := stage[row](key); err != nil {
				return fmt.Errorf("stage %s: %w", row, err)
			}
			res, err := c.Enqueue(ctx, seedjobs.Payment{OrderID: key}, &enqueue.Opts{IdempotencyKey: key, DuplicatePolicy: p})
			var dup *enqueue.DuplicateJobError
			switch {
			case errors.As(err, &dup):
				cells = append(cells, "rejected (DuplicateJobError)")
			case err != nil:
				return err
			case res.Duplicate:
				cells = append(cells, "existing id")
			default:
				cells = append(cells, "new job")
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return nil
}

func enqueueThen(ctx context.Context, c *enqueue.Client, key string, then func(id string) error) error {
	res, err := c.Enqueue(ctx, seedjobs.Payment{OrderID: key}, &enqueue.Opts{IdempotencyKey: key})
	if err != nil {
		return err
	}
	return then(res.ID)
}

type demoJob struct {
	label string
	args  enqueue.JobArgs
	opts  enqueue.Opts
	id    string
}

// runSeedJobs runs the worker (the local poller standing in for Lambda's
// event source mapping) and the seed's three cases.
func runSeedJobs(ctx context.Context, cfg aws.Config, table, queueURL, dlqURL string, log *slog.Logger, w io.Writer) error {
	h, err := seedWorker(cfg, demoRun{table, queueURL, dlqURL}, log)
	if err != nil {
		return err
	}
	if err := h.Producer().Ping(ctx); err != nil {
		return err
	}
	stop := startWorker(ctx, cfg, h, queueURL, log)
	defer stop()

	c := h.Producer()
	jobs := []*demoJob{
		{label: "payment-1001 (provider times out once)", args: seedjobs.Payment{OrderID: "1001", AmountCents: 4999, SimulateFailures: 1},
			opts: enqueue.Opts{IdempotencyKey: "payment-1001", DuplicatePolicy: enqueue.AllowAfterFailed}},
		{label: "welcome-42", args: seedjobs.WelcomeEmail{UserID: "42", Email: "ada@example.com"},
			opts: enqueue.Opts{IdempotencyKey: "welcome-42", DuplicatePolicy: enqueue.RejectAlways}},
		{label: "webhook-evt-7 (subscriber unreachable)", args: seedjobs.Webhook{URL: "https://hooks.unreachable.invalid/in", EventID: "evt-7"},
			opts: enqueue.Opts{IdempotencyKey: "webhook-evt-7", MaxAttempts: 3}},
	}
	fmt.Fprintln(w, "(b) The seed's jobs, run by the worker:")
	for _, j := range jobs {
		res, err := c.Enqueue(ctx, j.args, &j.opts)
		if err != nil {
			return err
		}
		j.id = res.ID
		again, err := c.Enqueue(ctx, j.args, &j.opts) // the caller retries: deduplicated
		if err != nil {
			return fmt.Errorf("retry of %s: %w", j.label, err)
		}
		if !again.Duplicate || again.ID != res.ID {
			return fmt.Errorf("retry of %s was not deduplicated: %+v", j.label, again)
		}
	}
	if err := waitTerminal(ctx, c.Store(), jobs, time.Minute); err != nil {
		return err
	}
	// The welcome email must never be sent twice, even after it succeeded.
	_, err = c.Enqueue(ctx, jobs[1].args, &jobs[1].opts)
	var dup *enqueue.DuplicateJobError
	if !errors.As(err, &dup) {
		return fmt.Errorf("welcome-42 again: want DuplicateJobError, got %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "job\tkind\tstate\tattempts\tlast error")
	for _, j := range jobs {
		rec, err := c.Store().Get(ctx, j.id)
		if err != nil {
			return err
		}
		last := rec.LastError
		if last == "" {
			last = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", j.label, rec.Kind, rec.State, rec.Attempt, rec.MaxAttempts, last)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nwelcome-42 enqueued again after it succeeded: %v\n", dup)
	return nil
}

func waitTerminal(ctx context.Context, s *ledger.Store, jobs []*demoJob, limit time.Duration) error {
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		all := true
		for _, j := range jobs {
			rec, err := s.Get(ctx, j.id)
			if err != nil {
				return err
			}
			all = all && rec.State.Terminal()
		}
		if all {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("jobs not finished after %s", limit)
}

// demo runs the demo; with --dashboard it then keeps a worker running and
// serves the dashboard on the demo's table until Ctrl-C.
func (c *cli) demo(ctx context.Context, cfg aws.Config, f *flags) error {
	run, err := demo(ctx, cfg, c.stdout)
	if err != nil {
		return err
	}
	if f.dashboard == "" {
		fmt.Fprintf(c.stdout, "\nTo look at these jobs in the web dashboard: make dashboard\n"+
			"  (it runs this demo in an emulator it keeps up, then serves http://127.0.0.1:8080/ until Ctrl-C;\n"+
			"   make dashboard WRITE=1 turns on requeue, cancel, delete and redrive)\n")
		return nil
	}
	log := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h, err := seedWorker(cfg, run, log)
	if err != nil {
		return err
	}
	stop := startWorker(ctx, cfg, h, run.queueURL, log)
	defer stop()
	s, err := c.settings(ctx, cfg, &flags{table: run.table, queue: run.queueURL, dlq: run.dlqURL})
	if err != nil {
		return err
	}
	op, err := newOps(c, s)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.stdout)
	return op.serve(ctx, f.dashboard, f)
}
