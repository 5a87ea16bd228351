package handler_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
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

// bigRig runs big-job, whose step "report" is Size bytes, then naps a
// minute; its clients' requests go through a fault transport and are
// metered.
func bigRig(t *testing.T, bucket bool) (*nexjobtest.Env, *handler.Handler, *faults.Transport, *awstest.Meter, func() (int, string)) {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: bucket})
	ft := faults.New(nil)
	e.Cfg = faults.Config(e.Cfg, ft)
	meter := awstest.NewMeter(&e.Cfg, e.DB)
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
	return e, h, ft, meter, func() (int, string) { mu.Lock(); defer mu.Unlock(); return calls, got }
}

// A 1 MB step: its value in S3, its item naming it; the woken run reads it
// back; its function ran once. The item's write, applied and its reply
// lost, reads as the value it recorded; the object's write, applied and
// its reply lost, is resent to the same key; the woken run's read of the
// object, throttled past the SDK's retries, fails that run, and the next
// one reads it.
func TestLargeStepGoesToTheBlobBucket(t *testing.T) {
	t.Parallel()
	e, h, ft, _, seen := bigRig(t, true)
	lost := ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), `"blob"`) }, Fault: faults.LostReply})
	lostObject := ft.Add(faults.Rule{Op: "S3.PutObject", Fault: faults.LostReply})
	slowRead := ft.Add(faults.Rule{Op: "S3.GetObject", Fault: faults.Throttle, Times: faults.Attempts})
	res, err := e.Client.Enqueue(context.Background(), bigJob{Size: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.RunToEnd(t, h, res.ID)
	calls, got := seen()
	if rec.State != ledger.Succeeded || calls != 1 || len(got) != 1<<20 || lost.Fired() != 1 || lostObject.Fired() != 1 || slowRead.Fired() != faults.Attempts {
		t.Fatalf("%s (%s), the step's function ran %d times, the replay read %d bytes; faults fired: the item's lost reply %d, the object's %d, the read's throttles %d", rec.State, rec.LastError, calls, len(got), lost.Fired(), lostObject.Fired(), slowRead.Fired())
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
		e, h, _, _, seen := bigRig(t, tc.bucket)
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

// The costs row of a step over 256 KB (docs/costs.md): the run that takes
// the step writes one S3 object (PutObject) and one steps-table item
// that names it, so the job's write units are those of the same job with
// a 100-byte step; each later run reads the object once (GetObject) when
// it loads the job's steps. A 1 MB step and a nap, two runs: one
// PutObject, one GetObject, no other S3 request.
func TestLargeStepRequests(t *testing.T) {
	t.Parallel()
	e, h, _, meter, seen := bigRig(t, true)
	run := func(size int) (awstest.Units, []string) {
		t.Helper()
		res, err := e.Client.Enqueue(context.Background(), bigJob{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		meter.Reset()
		rec := e.RunToEnd(t, h, res.ID)
		if _, got := seen(); rec.State != ledger.Succeeded || len(got) != size {
			t.Fatalf("%d bytes: %s (%s), the replay read %d bytes", size, rec.State, rec.LastError, len(got))
		}
		var s3 []string
		for _, c := range meter.Calls() {
			if strings.HasPrefix(c, "S3.") {
				s3 = append(s3, c)
			}
		}
		return meter.Units(), s3
	}
	small, smallS3 := run(100)
	big, bigS3 := run(1 << 20)
	if len(smallS3) != 0 {
		t.Errorf("a 100-byte step's job made S3 requests: %v", smallS3)
	}
	if got := strings.Join(bigS3, " "); got != "S3.PutObject S3.GetObject" {
		t.Errorf("S3 requests over the 1 MB step's two runs: %q, want one PutObject (the first run's step), one GetObject (the second run's load)", got)
	}
	t.Logf("write units: %d with a 1 MB step, %d with a 100-byte one; S3: %v", big.Write, small.Write, bigS3)
	if big.Write != small.Write || small.Write == 0 {
		t.Errorf("write units: %d with a 1 MB step, %d with a 100-byte one; want the same (the item names the object)", big.Write, small.Write)
	}
}
