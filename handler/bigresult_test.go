package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
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

type bigArgs struct{ Text string }

func (bigArgs) Kind() string { return "big-args" }

// TestArgsOverTheRecordGoToS3 (issue 39 item 2): with a blob bucket, args
// over ledger.MaxInlineArgsBytes (16 KB), up to 32 MB, are an object the
// record names, not on the record: the worker gets them whole, the
// operator's timeline shows them; an object whose content someone
// replaced (anyone who may enqueue may write args/) is refused by the
// record's hash of its args, the run failed and retried, never run with
// them. Without a bucket args over what a record holds are an
// *enqueue.InputError, and 20 KB stay on the record.
func TestArgsOverTheRecordGoToS3(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := func(got chan<- int) *handler.Registry {
		reg := handler.NewRegistry()
		handler.AddWorker(reg, handler.WorkFunc[bigArgs](func(_ context.Context, j *handler.Job[bigArgs]) error {
			got <- len(j.Args.Text)
			return nil
		}), nil)
		return reg
	}
	t.Run("with a blob bucket", func(t *testing.T) {
		t.Parallel()
		e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: true})
		got := make(chan int, 4)
		h := e.Handler(t, reg(got), nil)
		size := 1 << 20
		res, err := e.Client.Enqueue(ctx, bigArgs{Text: strings.Repeat("a", size)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := e.Get(t, res.ID)
		if rec.Args != "" || !strings.HasPrefix(rec.ArgsBlob, "args/") {
			t.Fatalf("the record keeps %d bytes of args and names %q", len(rec.Args), rec.ArgsBlob)
		}
		e.Drain(t, h)
		e.RequireState(t, res.ID, ledger.Succeeded)
		if n := <-got; n != size {
			t.Fatalf("the worker got %d bytes of args, want %d", n, size)
		}
		a, err := admin.New(settings.Settings{AWS: e.Cfg, Table: e.Table, QueueURL: e.QueueURL, StepsTable: e.StepsTable, BlobBucket: e.BlobBucket, Retention: handler.DefaultRetention})
		if err != nil {
			t.Fatal(err)
		}
		if shown, _, err := a.Timeline(ctx, res.ID); err != nil || len(shown.Args) != size+len(`{"Text":""}`) {
			t.Fatalf("the timeline's record holds %d bytes of args, %v", len(shown.Args), err)
		}
		// A forged object under a job's key: refused, the job not run.
		forged, err := e.Client.Enqueue(ctx, bigArgs{Text: strings.Repeat("b", size)}, &enqueue.Opts{Delay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		key := e.Get(t, forged.ID).ArgsBlob
		body := `{"Text":"` + strings.Repeat("x", size) + `"}`
		if _, err := provision.S3(e.Cfg).PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(e.BlobBucket), Key: aws.String(key), Body: strings.NewReader(body)}); err != nil {
			t.Fatal(err)
		}
		e.RunNow(t, forged.ID)
		e.DrainNow(t, h)
		if rec := e.Get(t, forged.ID); rec.State != ledger.Scheduled || !strings.Contains(rec.LastError, "does not hold job") {
			t.Fatalf("a forged args object: job %s (%s); want its run failed and retried", rec.State, rec.LastError)
		}
		select {
		case n := <-got:
			t.Fatalf("the worker ran with %d bytes of forged args", n)
		default:
		}
	})
	t.Run("without", func(t *testing.T) {
		t.Parallel()
		e := nexjobtest.New(t, nil)
		_, err := e.Client.Enqueue(ctx, bigArgs{Text: strings.Repeat("a", ledger.MaxArgsBytes)}, nil)
		var in *enqueue.InputError
		if !errors.As(err, &in) || in.Field != "args" {
			t.Fatalf("args over a record's room without a bucket: %v, want an *InputError on args", err)
		}
		res, err := e.Client.Enqueue(ctx, bigArgs{Text: strings.Repeat("a", 20<<10)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rec := e.Get(t, res.ID); rec.ArgsBlob != "" || len(rec.Args) < 20<<10 {
			t.Fatalf("20 KB of args without a bucket: on the record %d bytes, object %q", len(rec.Args), rec.ArgsBlob)
		}
	})
}
