package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

// removedRig is a deployment whose named queue bulk was taken out of the
// construct's NamedQueues while jobs waited on it: the deploy deleted the
// queue and its DLQ (and their messages), and NEXJOB_QUEUES names
// payments alone.
type removedRig struct {
	e    *nexjobtest.Env
	h    *handler.Handler
	env  map[string]string
	mu   sync.Mutex
	runs map[string]int // by report name
}

func newRemovedRig(t *testing.T) *removedRig {
	t.Helper()
	r := &removedRig{e: nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk", "payments"}}), runs: map[string]int{}}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(_ context.Context, j *handler.Job[report]) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.runs[j.Args.Name]++
		return nil
	}), nil)
	payments := map[string]string{"payments": r.e.Queues["payments"]}
	r.h = r.e.Handler(t, reg, &handler.Options{Queues: payments, Logger: quiet})
	qs, _ := json.Marshal(map[string]settings.NamedQueue{"payments": {URL: r.e.Queues["payments"]}})
	r.env = map[string]string{settings.EnvTable: r.e.Table, settings.EnvQueueURL: r.e.QueueURL, settings.EnvDLQURL: r.e.DLQURL, settings.EnvQueues: string(qs)}
	return r
}

// removeBulk deletes the bulk queue and its DLQ, as the deploy that took
// it out of NamedQueues does.
func (r *removedRig) removeBulk(t *testing.T) {
	t.Helper()
	for _, url := range []string{r.e.Queues["bulk"], r.e.QueueDLQs["bulk"]} {
		if _, err := r.e.SQS.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Fatal(err)
		}
	}
	delete(r.e.Queues, "bulk")
	delete(r.e.QueueDLQs, "bulk")
}

func (r *removedRig) cli(args ...string) (string, error) {
	var out bytes.Buffer
	c := &cli{stdout: &out, stderr: &out, getenv: func(k string) string { return r.env[k] }}
	err := c.run(context.Background(), args)
	return out.String(), err
}

// job enqueues the report name on queue q (written while bulk was
// configured) and returns its record.
func (r *removedRig) job(t *testing.T, name, q string, delay time.Duration) ledger.Record {
	t.Helper()
	res, err := r.e.Client.Enqueue(context.Background(), report{Name: name}, &enqueue.Opts{Queue: q, Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	return r.e.Get(t, res.ID)
}

// work polls the job queue and payments (the worker's event sources now)
// for d.
func (r *removedRig) work(t *testing.T, d time.Duration) {
	t.Helper()
	ps := []*poller.Poller{
		poller.New(r.e.SQS, r.e.QueueURL, r.h.Handle, &poller.Options{WaitTime: -1}),
		poller.New(r.e.SQS, r.e.Queues["payments"], r.h.Handle, &poller.Options{WaitTime: -1}),
	}
	for end := time.Now().Add(d); time.Now().Before(end); {
		for _, p := range ps {
			if _, err := p.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Issue 27 item 24: a named queue taken out of the configuration while
// jobs wait on it. Without a move they are stranded: their messages went
// with the queue, and nothing sends them again (the dispatch guard looks
// at state changes only). nexjob move-queue bulk moves each active job
// the ledger lists on bulk onto the job queue: the waiting ones (one
// Scheduled), a continuation still waiting (sent by its parent's
// release), an orphan whose lease ran out (taken over); a job running
// under a live lease is left to its run and reported; an ended one is
// not listed. Run again, it moves nothing and sends nothing. Each job
// runs once.
func TestMoveQueueFreesTheJobsOfARemovedQueue(t *testing.T) {
	t.Parallel()
	r := newRemovedRig(t)
	ctx := context.Background()
	store := r.e.Client.Store()
	waiting := []ledger.Record{r.job(t, "a", "bulk", 0), r.job(t, "b", "bulk", 0), r.job(t, "later", "bulk", 2*time.Second), r.job(t, "parent", "bulk", 0)}
	child, err := r.e.Client.ContinueWith(ctx, waiting[3].ID, report{Name: "child"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	running, orphan, done := r.job(t, "running", "bulk", 0), r.job(t, "orphan", "bulk", 0), r.job(t, "done", "bulk", 0)
	r.job(t, "pay", "payments", 0)
	if running, err = store.Claim(ctx, running.ID, time.Minute); err != nil { // a worker runs it now
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, orphan.ID, time.Millisecond); err != nil { // its worker died
		t.Fatal(err)
	}
	if done, err = store.Claim(ctx, done.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Finish(ctx, done, ledger.Finish{State: ledger.Succeeded}); err != nil {
		t.Fatal(err)
	}
	r.removeBulk(t)

	r.work(t, 3*time.Second)
	for _, rec := range waiting {
		if got := r.e.Get(t, rec.ID); got.State.Terminal() || got.Attempt != 0 {
			t.Fatalf("before the move, job %s ran (%s attempt %d): want it stranded", rec.ID, got.State, got.Attempt)
		}
	}
	out, err := r.cli("move-queue", "bulk", "--yes")
	if err != nil || !strings.Contains(out, "moved 6 of 7 active jobs from queue bulk to the job queue") ||
		!strings.Contains(out, "skipped job "+running.ID+": running under a live lease") {
		t.Fatalf("move-queue bulk: %v\n%s", err, out)
	}
	for _, id := range []string{waiting[0].ID, waiting[2].ID, child.ID, orphan.ID} {
		if q := r.e.Get(t, id).Queue; q != "" {
			t.Fatalf("job %s is on %q after the move, want the job queue", id, q)
		}
	}
	sent := r.e.QueueDepth(t, r.e.QueueURL)
	if out, err := r.cli("move-queue", "bulk", "--yes"); err != nil || !strings.Contains(out, "moved 0 of 1 active jobs") {
		t.Fatalf("move-queue bulk again: %v\n%s", err, out)
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n != sent || sent != 5 {
		t.Fatalf("the job queue holds %d messages after the first move and %d after the second, want 5 both times (no send for the child, none again)", sent, n)
	}
	if _, err := store.Finish(ctx, running, ledger.Finish{State: ledger.Succeeded}); err != nil { // its run ends
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range []string{"a", "b", "later", "parent", "child", "orphan", "pay"} {
		if r.runs[name] != 1 {
			t.Fatalf("runs %v: want each moved job (and the payments one) once", r.runs)
		}
	}
	if r.runs["running"]+r.runs["done"] != 0 {
		t.Fatalf("runs %v: the running and the ended job ran here", r.runs)
	}
}

// move-queue --dry-run lists what it would move and changes nothing; a
// --to that is not among NEXJOB_QUEUES, and a move onto the queue
// itself, are refused before anything is read.
func TestMoveQueueDryRunAndRefusals(t *testing.T) {
	t.Parallel()
	r := newRemovedRig(t)
	a := r.job(t, "a", "bulk", 0)
	r.removeBulk(t)
	out, err := r.cli("move-queue", "bulk", "--dry-run")
	if err != nil || !strings.Contains(out, "would move "+a.ID+" (Enqueued, report) to the job queue") || !strings.Contains(out, "dry run: 1 active jobs on queue bulk, nothing changed") {
		t.Fatalf("--dry-run: %v\n%s", err, out)
	}
	if out, err := r.cli("move-queue", "bulk", "--to", "imports", "--yes"); !errors.Is(err, enqueue.ErrUnknownQueue) {
		t.Fatalf("--to an unknown queue: %v\n%s", err, out)
	}
	var in *enqueue.InputError
	if out, err := r.cli("move-queue", "payments", "--to", "payments", "--yes"); !errors.As(err, &in) {
		t.Fatalf("--to the queue itself: %v\n%s", err, out)
	}
	if got := r.e.Get(t, a.ID); got.Queue != "bulk" || r.e.QueueDepth(t, r.e.QueueURL) != 0 {
		t.Fatalf("after a dry run and two refusals: queue %q, %d messages", got.Queue, r.e.QueueDepth(t, r.e.QueueURL))
	}
}
