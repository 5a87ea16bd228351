package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// quote is the result tests' job; price its result.
type quote struct{ Item string }

func (quote) Kind() string { return "quote" }

type price struct {
	Amount int    `json:"amount"`
	Note   string `json:"note"`
}

// priceOf is the JSON of a price whose note pads it to n bytes.
func priceOf(n int) price {
	return price{Amount: 7, Note: strings.Repeat("n", n-len(`{"amount":7,"note":""}`))}
}

// resultEnv is a kit Env whose quote kind runs work as a result worker,
// beside the email kind's plain worker.
func resultEnv(t *testing.T, work handler.ResultFunc[quote, price], opts *handler.KindOptions) (*nexjobtest.Env, *handler.Handler) {
	t.Helper()
	e := nexjobtest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, work, opts)
	handler.AddWorker(reg, handler.WorkFunc[email](ok), nil)
	return e, e.Handler(t, reg, &handler.Options{Logger: quiet})
}

func enqueueOne(t *testing.T, c *enqueue.Client, args enqueue.JobArgs, opts *enqueue.Opts) string {
	t.Helper()
	res, err := c.Enqueue(context.Background(), args, opts)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// TestResultKeptWithTheRecord: a result worker's result is the record's
// result, its JSON as returned, once the job Succeeded; a plain worker's
// job keeps none.
func TestResultKeptWithTheRecord(t *testing.T) {
	t.Parallel()
	e, h := resultEnv(t, func(_ context.Context, j *handler.Job[quote]) (price, error) {
		return price{Amount: len(j.Args.Item), Note: "firm <b>&"}, nil
	}, nil)
	id := enqueueOne(t, e.Client, quote{Item: "widget"}, nil)
	plain := enqueueOne(t, e.Client, email{To: "plain@example.com"}, nil)
	e.Drain(t, h)
	rec := e.RequireState(t, id, ledger.Succeeded)
	if want := `{"amount":6,"note":"firm \u003cb\u003e\u0026"}`; rec.Result != want {
		t.Fatalf("result %q, want %q", rec.Result, want)
	}
	if rec := e.RequireState(t, plain, ledger.Succeeded); rec.Result != "" {
		t.Fatalf("a plain worker's job keeps the result %q", rec.Result)
	}
}

// TestFailedAttemptKeepsNoResult: a run that returns a value and an error
// is a failed attempt and keeps no result; the retry that succeeds keeps
// its own.
func TestFailedAttemptKeepsNoResult(t *testing.T) {
	t.Parallel()
	e, h := resultEnv(t, func(_ context.Context, j *handler.Job[quote]) (price, error) {
		if j.Attempt == 1 {
			return price{Amount: 1, Note: "first"}, errors.New("supplier down")
		}
		return price{Amount: 2, Note: "second"}, nil
	}, &handler.KindOptions{Backoff: func(int) time.Duration { return time.Hour }})
	id := enqueueOne(t, e.Client, quote{Item: "retry"}, &enqueue.Opts{MaxAttempts: 3})
	e.DrainNow(t, h)
	if rec := e.RequireState(t, id, ledger.Scheduled); rec.Result != "" || rec.LastError != "supplier down" {
		t.Fatalf("after the failed attempt: result %q, last error %q; want none and the error", rec.Result, rec.LastError)
	}
	e.Advance(t, time.Hour)
	e.Drain(t, h)
	if rec := e.RequireState(t, id, ledger.Succeeded); rec.Result != `{"amount":2,"note":"second"}` {
		t.Fatalf("result %q, want the second attempt's", rec.Result)
	}
}

// TestResultOverTheLimitFailsPermanently: a result one byte over
// ledger.MaxResultBytes fails the job at its first attempt with a
// *ledger.ResultTooLargeError naming the size (the hook gets it), and
// nothing of it is stored; one at the limit is kept whole.
func TestResultOverTheLimitFailsPermanently(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var cause error
	e, h := resultEnv(t, func(_ context.Context, j *handler.Job[quote]) (price, error) {
		if j.Args.Item == "over" {
			return priceOf(ledger.MaxResultBytes + 1), nil
		}
		return priceOf(ledger.MaxResultBytes), nil
	}, &handler.KindOptions{OnDeadLetter: func(_ context.Context, _ ledger.Record, err error) error {
		mu.Lock()
		defer mu.Unlock()
		cause = err
		return nil
	}})
	over := enqueueOne(t, e.Client, quote{Item: "over"}, &enqueue.Opts{MaxAttempts: 5})
	at := enqueueOne(t, e.Client, quote{Item: "at"}, nil)
	e.Drain(t, h)
	rec := e.RequireState(t, over, ledger.Failed)
	if rec.Attempt != 1 || rec.Result != "" {
		t.Fatalf("over the limit: attempt %d, result of %d bytes; want a permanent failure at attempt 1 and no result", rec.Attempt, len(rec.Result))
	}
	if !strings.Contains(rec.LastError, "16385 bytes") || strings.Contains(rec.LastError, "nnnn") {
		t.Fatalf("last error %q: want the size, never the content", rec.LastError)
	}
	mu.Lock()
	var tooLarge *ledger.ResultTooLargeError
	if !errors.As(cause, &tooLarge) || tooLarge.Size != ledger.MaxResultBytes+1 || tooLarge.Limit != ledger.MaxResultBytes {
		t.Errorf("the hook's cause %v: want a *ledger.ResultTooLargeError of %d over %d", cause, ledger.MaxResultBytes+1, ledger.MaxResultBytes)
	}
	mu.Unlock()
	if rec := e.RequireState(t, at, ledger.Succeeded); len(rec.Result) != ledger.MaxResultBytes {
		t.Fatalf("a result at the limit kept %d bytes, want %d", len(rec.Result), ledger.MaxResultBytes)
	}
}

// TestLargestArgsAndResultFit: args at ledger.MaxArgsBytes, a failed
// first run with a 16 KB error and 30 continuations, then a success with
// a result at ledger.MaxResultBytes: the record keeps it all under
// DynamoDB's item limit.
func TestLargestArgsAndResultFit(t *testing.T) {
	t.Parallel()
	e, h := resultEnv(t, func(_ context.Context, j *handler.Job[quote]) (price, error) {
		if j.Attempt == 1 {
			return price{}, errors.New(strings.Repeat("é", 8000))
		}
		return priceOf(ledger.MaxResultBytes), nil
	}, &handler.KindOptions{Backoff: func(int) time.Duration { return time.Hour }})
	id := enqueueOne(t, e.Client, quote{Item: strings.Repeat("x", ledger.MaxArgsBytes-len(`{"Item":""}`))}, &enqueue.Opts{IdempotencyKey: "big", MaxAttempts: 2})
	for range 30 {
		if _, err := e.Client.ContinueWith(context.Background(), id, quote{Item: "child"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.DrainNow(t, h)
	e.RequireState(t, id, ledger.Scheduled)
	e.Advance(t, time.Hour)
	e.Drain(t, h)
	if rec := e.RequireState(t, id, ledger.Succeeded); len(rec.Result) != ledger.MaxResultBytes {
		t.Fatalf("kept %d bytes of result, want %d", len(rec.Result), ledger.MaxResultBytes)
	}
}

// TestFinishLostReplyKeepsTheResult: the write that makes the job
// Succeeded is applied and its reply lost (or timed out): the resend
// meets it, and the record holds exactly the result, the job run once.
func TestFinishLostReplyKeepsTheResult(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.LostReply, faults.Timeout} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			var runs atomic.Int32
			reg := handler.NewRegistry()
			handler.AddWorkerResult(reg, handler.ResultFunc[quote, price](func(context.Context, *handler.Job[quote]) (price, error) {
				runs.Add(1)
				return price{Amount: 99, Note: "once"}, nil
			}), nil)
			ft, cfg := e.Faulty()
			h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet, DLQURL: e.DLQURL})
			if err != nil {
				t.Fatal(err)
			}
			fh := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Succeeded), Fault: fault})
			id := enqueueOne(t, e.Client, quote{Item: "lost"}, nil)
			e.Drain(t, h)
			fired(t, fh, 1)
			if rec := e.RequireState(t, id, ledger.Succeeded); rec.Result != `{"amount":99,"note":"once"}` {
				t.Fatalf("result %q after a %s", rec.Result, fault)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the job ran %d times, want once", n)
			}
		})
	}
}

// TestResultCostsNoRequest pins that a run with a result makes the
// requests of one without: its claim and its finish, UpdateItem ×2, the
// result riding on the finish.
func TestResultCostsNoRequest(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[quote, price](func(context.Context, *handler.Job[quote]) (price, error) {
		return priceOf(ledger.MaxResultBytes), nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[email](ok), nil)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: time.Second})
	step := stepper(t, counter)
	upd := "DynamoDB.UpdateItem"
	for _, args := range []enqueue.JobArgs{email{To: "cost@example.com"}, quote{Item: "cost"}} {
		id := enqueueOne(t, e.Client, args, nil)
		step(args.Kind()+": run", []string{upd, upd}, func() { pollOne(t, p) })
		e.RequireState(t, id, ledger.Succeeded)
	}
}
