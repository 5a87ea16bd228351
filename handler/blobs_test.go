package handler_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Large step values in S3 (issue 39 item 2): a value over the steps
// table's 256 KB goes to the blob bucket and reads back on every replay.

type bigJob struct {
	Size int `json:"size"`
}

func (bigJob) Kind() string { return "big-job" }

func bigRig(t *testing.T, bucket bool) (*nexjobtest.Env, *handler.Handler, *faults.Transport, func() (int, string)) {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: bucket})
	ft := faults.New(nil)
	e.Cfg = faults.Config(e.Cfg, ft)
	var mu sync.Mutex
	calls, got := 0, ""
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[bigJob](func(ctx context.Context, j *handler.Job[bigJob]) error {
		v, err := handler.Step(ctx, "report", func(context.Context) (string, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			return strings.Repeat("r", j.Args.Size), nil
		})
		if err != nil {
			return err
		}
		if err := handler.Sleep(ctx, "nap", time.Minute); err != nil {
			return err // the run after it replays the step
		}
		mu.Lock()
		got = v
		mu.Unlock()
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	return e, h, ft, func() (int, string) { mu.Lock(); defer mu.Unlock(); return calls, got }
}

// A 1 MB step: its value in S3, its item naming it; the woken run reads it
// back; its function ran once; the item's write, applied and its reply
// lost, reads as the value it recorded.
func TestLargeStepGoesToTheBlobBucket(t *testing.T) {
	t.Parallel()
	e, h, ft, seen := bigRig(t, true)
	lost := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), `"blob"`) }, Fault: faults.LostReply})
	res, err := e.Client.Enqueue(context.Background(), bigJob{Size: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.RunToEnd(t, h, res.ID)
	calls, got := seen()
	if rec.State != ledger.Succeeded || calls != 1 || len(got) != (1<<20)+0 || lost.Fired() != 1 {
		t.Fatalf("%s (%s), the step's function ran %d times, the replay read %d bytes, the lost reply fired %d", rec.State, rec.LastError, calls, len(got), lost.Fired())
	}
	if v := rec.Steps["report"]; len(v) != (1<<20)+2 {
		t.Fatalf("the step as the kit reads it: %d bytes", len(v))
	}
}

// Without a blob bucket a value over 256 KB is a typed refusal, the job
// failed for good at once; with one, a value over MaxBlobStepBytes too.
func TestTooLargeStepIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bucket bool
		size   int
	}{{false, 300 << 10}, {true, ledger.MaxBlobStepBytes + 1}} {
		e, h, _, seen := bigRig(t, tc.bucket)
		res, err := e.Client.Enqueue(context.Background(), bigJob{Size: tc.size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := e.RunToEnd(t, h, res.ID)
		calls, _ := seen()
		if rec.State != ledger.Failed || rec.Attempt != 1 || !strings.Contains(rec.LastError, "the limit is") || calls != 1 {
			t.Errorf("bucket %v, %d bytes: %s at attempt %d (%s), called %d times; want Failed at once, refused for its size", tc.bucket, tc.size, rec.State, rec.Attempt, rec.LastError, calls)
		}
	}
}
