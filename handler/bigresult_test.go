package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

type bigQuote struct{ Size int }

func (bigQuote) Kind() string { return "big-quote" }

type bigCaller struct{ Size int }

func (bigCaller) Kind() string { return "big-caller" }

// TestResultsOverTheRecordGoToS3 (issue 39 item 2): with a blob bucket, a
// result over the record's room (16 KB) is kept as an object the record
// names, not on the record: Client.Result and Wait read it whole, the
// operator's timeline shows it, and a caller awaiting the job as its
// child gets it.
// Without a bucket the same result fails the job for good with a
// *ledger.ResultTooLargeError (nothing half-written).
func TestResultsOverTheRecordGoToS3(t *testing.T) {
	t.Parallel()
	reg := func(got *string) *handler.Registry {
		reg := handler.NewRegistry()
		handler.AddWorkerResult(reg, handler.ResultFunc[bigQuote, string](func(_ context.Context, j *handler.Job[bigQuote]) (string, error) {
			return strings.Repeat("q", j.Args.Size), nil
		}), nil)
		handler.AddWorker(reg, handler.WorkFunc[bigCaller](func(ctx context.Context, j *handler.Job[bigCaller]) error {
			v, err := handler.Invoke[string](ctx, "quote", bigQuote{Size: j.Args.Size}, nil)
			if err != nil {
				return err
			}
			*got = v
			return nil
		}), nil)
		return reg
	}
	ctx := context.Background()
	size := 300_000
	t.Run("with a blob bucket", func(t *testing.T) {
		t.Parallel()
		e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: true})
		var got string
		h := e.Handler(t, reg(&got), nil)
		res, err := e.Client.Enqueue(ctx, bigQuote{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		caller, err := e.Client.Enqueue(ctx, bigCaller{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		e.Drain(t, h)
		rec := e.RequireState(t, res.ID, ledger.Succeeded)
		if rec.Result != "" || !strings.HasPrefix(rec.ResultBlob, "results/"+res.ID+"/") {
			t.Fatalf("the record keeps %d bytes of result and names %q; want none, and its object", len(rec.Result), rec.ResultBlob)
		}
		var v string
		if err := e.Client.Result(ctx, res.ID, &v); err != nil || len(v) != size {
			t.Fatalf("Result: %d bytes, %v; want %d", len(v), err, size)
		}
		end, err := e.Client.Wait(ctx, res.ID, nil)
		if err != nil || len(end.Result) != size+2 {
			t.Fatalf("Wait: %d bytes of JSON, %v", len(end.Result), err)
		}
		e.RequireState(t, caller.ID, ledger.Succeeded)
		if len(got) != size {
			t.Fatalf("the caller got %d bytes of its child's result, want %d", len(got), size)
		}
		a, err := admin.New(settings.Settings{AWS: e.Cfg, Table: e.Table, QueueURL: e.QueueURL, StepsTable: e.StepsTable, BlobBucket: e.BlobBucket, Retention: handler.DefaultRetention})
		if err != nil {
			t.Fatal(err)
		}
		shown, _, err := a.Timeline(ctx, res.ID)
		if err != nil || len(shown.SucceededResult()) != size+2 {
			t.Fatalf("the timeline's record holds %d bytes of result, %v", len(shown.SucceededResult()), err)
		}
	})
	t.Run("without", func(t *testing.T) {
		t.Parallel()
		e := nexjobtest.New(t, nil)
		var got string
		h := e.Handler(t, reg(&got), nil)
		res, err := e.Client.Enqueue(ctx, bigQuote{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		e.Drain(t, h)
		rec := e.RequireState(t, res.ID, ledger.Failed)
		var v string
		var nse *enqueue.NotSucceededError
		if !strings.Contains(rec.LastError, "result") || rec.Attempt != 1 || !errors.As(e.Client.Result(ctx, res.ID, &v), &nse) {
			t.Fatalf("without a blob bucket: %s at attempt %d (%s); want Failed for good, its result too large", rec.State, rec.Attempt, rec.LastError)
		}
	})
}
