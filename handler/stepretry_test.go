package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// A step's own retry policy (issue 39 item 8): a failing call is retried
// under the step's policy without failing the run or spending the job's
// attempts; a short pause waits in the run, a long one sleeps durably;
// once the step's attempts are spent its error is the run's.

type retried struct {
	Fails   int           `json:"fails"`   // calls of charge that fail before one succeeds
	Tries   int           `json:"tries"`   // the step's MaxAttempts
	Pause   time.Duration `json:"pause"`   // its backoff
	Decline bool          `json:"decline"` // fail with errDeclined (not retryable)
	Hang    bool          `json:"hang"`    // calls outlast the step's timeout
}

func (retried) Kind() string { return "retried" }

var errDeclined = errors.New("card declined")

type retryRig struct {
	e     *nexjobtest.Env
	meter *awstest.Meter
	h     *handler.Handler
	mu    sync.Mutex
	calls map[string]int
}

func newRetryRig(t *testing.T) *retryRig {
	t.Helper()
	r := &retryRig{e: nexjobtest.New(t, &nexjobtest.Options{StepsOnRecord: true}), calls: map[string]int{}} // the record's layout: its writes pinned
	cfg := r.e.Cfg
	r.meter = awstest.NewMeter(&cfg, r.e.DB)
	r.e.Cfg = cfg
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[retried](func(ctx context.Context, j *handler.Job[retried]) error {
		o := &handler.StepOptions{MaxAttempts: j.Args.Tries, Backoff: func(int) time.Duration { return j.Args.Pause },
			Retryable: func(err error) bool { return !errors.Is(err, errDeclined) }}
		if j.Args.Hang {
			o.Timeout = 20 * time.Millisecond
		}
		_, err := handler.StepWith(ctx, "charge", o, func(ctx context.Context) (string, error) {
			r.mu.Lock()
			r.calls[j.ID]++
			n := r.calls[j.ID]
			r.mu.Unlock()
			switch {
			case j.Args.Hang:
				<-ctx.Done()
				return "", ctx.Err()
			case j.Args.Decline:
				return "", errDeclined
			case n <= j.Args.Fails:
				return "", errors.New("the provider timed out")
			}
			return "ch_1", nil
		})
		return err
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

func (r *retryRig) enqueue(t *testing.T, a retried, attempts int) string {
	t.Helper()
	res, err := r.e.Client.Enqueue(context.Background(), a, &enqueue.Opts{MaxAttempts: attempts})
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

func (r *retryRig) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[id]
}

func tries(rec ledger.Record) int {
	n := 0
	for k := range rec.Steps {
		if strings.HasPrefix(k, "nexjob:try:") {
			n++
		}
	}
	return n
}

func TestStepRetriesInTheRun(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	id := r.enqueue(t, retried{Fails: 2, Tries: 3, Pause: 10 * time.Millisecond}, 1)
	r.meter.Reset()
	r.e.DrainNow(t, r.h)
	// Cost (docs/durable-jobs.md): Step's, and one UpdateItem per retry.
	if got, want := strings.Join(dynamoAndSQS(r.meter), " "), "DynamoDB.UpdateItem DynamoDB.UpdateItem DynamoDB.UpdateItem DynamoDB.UpdateItem DynamoDB.UpdateItem"; got != want {
		t.Errorf("the run: %s, want %s (its claim, 2 failures, the step, its end)", got, want)
	}
	rec := r.e.Get(t, id)
	if rec.State != ledger.Succeeded || rec.Attempt != 1 || r.count(id) != 3 || tries(rec) != 2 {
		t.Fatalf("a step failing twice under 3 tries: %s at attempt %d (%s), %d calls, %d failures recorded; want Succeeded at the job's first attempt, 3 calls, 2 recorded", rec.State, rec.Attempt, rec.LastError, r.count(id), tries(rec))
	}
}

func TestStepRetryAfterALongPauseSleepsDurably(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	id := r.enqueue(t, retried{Fails: 1, Tries: 2, Pause: time.Hour}, 1)
	r.e.DrainNow(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Scheduled || rec.Attempt != 0 || r.count(id) != 1 {
		t.Fatalf("after the first failure: %s at attempt %d, %d calls; want Scheduled in the pause, no attempt spent, 1 call", rec.State, rec.Attempt, r.count(id))
	}
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded || rec.Attempt != 1 || r.count(id) != 2 || tries(rec) != 1 {
		t.Fatalf("after the pause: %s at attempt %d (%s), %d calls, %d failures recorded; want Succeeded at the first attempt, 2 calls", rec.State, rec.Attempt, rec.LastError, r.count(id), tries(rec))
	}
}

func TestStepRetryPolicyEnds(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	declined := r.enqueue(t, retried{Decline: true, Tries: 5, Pause: time.Millisecond}, 1)
	spent := r.enqueue(t, retried{Fails: 100, Tries: 2, Pause: time.Millisecond}, 2)
	hung := r.enqueue(t, retried{Hang: true, Tries: 2, Pause: time.Millisecond}, 1)
	for range 3 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, 2*time.Second)
	}
	if rec := r.e.Get(t, declined); rec.State != ledger.Failed || r.count(declined) != 1 || !strings.Contains(rec.LastError, "declined") {
		t.Errorf("a step whose error is not retryable: %s (%s), %d calls; want Failed after 1 call", rec.State, rec.LastError, r.count(declined))
	}
	// Spent: 2 calls in each of the job's 2 attempts.
	if rec := r.e.Get(t, spent); rec.State != ledger.Failed || rec.Attempt != 2 || r.count(spent) != 4 {
		t.Errorf("a step failing for good: %s at attempt %d, %d calls; want Failed after 2 attempts of 2 calls", rec.State, rec.Attempt, r.count(spent))
	}
	if rec := r.e.Get(t, hung); rec.State != ledger.Failed || r.count(hung) != 2 || !strings.Contains(rec.LastError, "outlasted its timeout") {
		t.Errorf("a step whose calls outlast its timeout: %s (%s), %d calls; want Failed after 2 timed-out calls", rec.State, rec.LastError, r.count(hung))
	}
}
