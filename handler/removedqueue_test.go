package handler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/onetime"
)

// withoutBulk is NEXJOB_QUEUES after "bulk" was taken out of the
// construct's NamedQueues: a worker deployed since knows payments only,
// while records written before still name bulk.
func withoutBulk(e *nexjobtest.Env) map[string]string {
	return map[string]string{"payments": e.Queues["payments"]}
}

// pollJobQueue polls the job queue alone with h until the job is
// Succeeded, for at most a minute.
func pollJobQueue(t *testing.T, e *nexjobtest.Env, h *handler.Handler, id string) {
	t.Helper()
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1})
	for end := time.Now().Add(time.Minute); e.Get(t, id).State != ledger.Succeeded; {
		if time.Now().After(end) {
			rec := e.Get(t, id)
			t.Fatalf("job %s is %s (attempt %d) after a minute of the job queue", id, rec.State, rec.Attempt)
		}
		if _, err := p.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Issue 27 item 24: a job whose record names a queue the worker no
// longer knows (bulk, taken out of NEXJOB_QUEUES) fails its first run.
// Its retry goes via the job queue, with a warning, and the run's message
// is deleted: before, the retry's send failed on the unknown name and the
// message was kept, to fail again at each return (for good, where the
// removed queue was deleted or its event source gone).
func TestRemovedQueueRetryGoesViaTheJobQueue(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	var runs atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(ctx context.Context, j *handler.Job[charge]) error {
		runs.Add(1)
		if j.Attempt == 1 {
			return errors.New("card network timeout")
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Minute }})
	res, err := e.Client.Enqueue(ctx, charge{Order: "o-1"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet})
	// The bulk queue's event source outlived the change (or a poller
	// still reads it): a source the worker does not know.
	if n, err := pollOnly(e, "bulk", h).Poll(ctx); err != nil || n != 1 {
		t.Fatalf("the bulk message: %d handled, %v", n, err)
	}
	e.WantDepth(t, e.Queues["bulk"], 0, "after the failed run, bulk: the run's message deleted")
	e.WantDepth(t, e.QueueURL, 1, "after the failed run, the job queue: the retry sent via the job queue")
	e.Advance(t, time.Minute)
	pollJobQueue(t, e, h, res.ID)
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
}

// Issue 27 item 24: the continuation of a job on the job queue names
// the removed queue bulk. Its parent's success releases it and sends it
// via the job queue; before, the send failed, the parent's message came
// back for the release again and again, and the child was never sent.
func TestRemovedQueueContinuationGoesViaTheJobQueue(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(context.Context, *handler.Job[charge]) error { return nil }), nil)
	parent, err := e.Client.Enqueue(ctx, charge{Order: "parent"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	child, err := e.Client.ContinueWith(ctx, parent.ID, charge{Order: "child"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet})
	msgs := e.Messages(t, e.QueueURL) // the parent's, hidden here for a minute
	if resp, err := h.Handle(ctx, poller.Event(e.QueueURL, msgs)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the parent's message was kept (%+v, %v): want its child released and sent via the job queue", resp, err)
	}
	if n := e.QueueDepth(t, e.Queues["bulk"]); n != 0 {
		t.Fatalf("%d messages on the removed queue", n)
	}
	pollJobQueue(t, e, h, child.ID)
}

// Issue 27 item 24: a job on the removed queue bulk whose message came
// to the job queue's DLQ before any run (Scheduler's dead letter of a
// far job's schedule that targets the deleted queue lands there) is sent
// back via the job queue; before, the send failed and the dead letter
// came back until the consumer failed the job as never started.
func TestRemovedQueueDeadLetterGoesViaTheJobQueue(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(context.Context, *handler.Job[charge]) error { return nil }), nil)
	res, err := e.Client.Enqueue(ctx, charge{Order: "o-1"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := e.Messages(t, e.Queues["bulk"])
	if len(msgs) != 1 {
		t.Fatalf("%d messages on bulk, want 1", len(msgs))
	}
	h := e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet})
	ev := poller.Event(e.DLQURL, msgs)
	ev.Records[0].Attributes["ApproximateReceiveCount"] = "5"
	if resp, err := h.HandleDeadLetters(ctx, ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the dead letter was kept (%+v, %v): want its job sent back via the job queue", resp, err)
	}
	e.WantDepth(t, e.QueueURL, 1, "the job queue: the job's message")
	pollJobQueue(t, e, h, res.ID)
}

// Issue 27 item 24, a far retry: a job whose record names the removed
// queue bulk asks to run again 40 days on. Its one-time schedule targets
// the job queue (the worker's Far knows no bulk ARN either), and the
// run's message is deleted; before, the send failed on the unknown name,
// and each return of the message failed its carry again until the DLQ.
func TestRemovedQueueFarRetryGoesViaTheJobQueue(t *testing.T) {
	t.Parallel()
	r := newFarRigWith(t, false, addLaterAgain)
	ctx := context.Background()
	// Written while bulk was configured (its URL does not matter here:
	// the first message is the job queue's).
	old, err := enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Queues: map[string]string{"bulk": r.e.QueueURL}, Ledger: ledger.Options{Now: r.clock.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := old.Enqueue(ctx, laterAgain{N: 1}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.poll.Poll(ctx); err != nil || n != 1 {
		t.Fatalf("the job's message: %d handled, %v", n, err)
	}
	rec := r.e.Get(t, res.ID)
	if rec.State != ledger.Scheduled || rec.Attempt != 1 {
		t.Fatalf("after its run: %s attempt %d, want Scheduled 40 days on", rec.State, rec.Attempt)
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n != 0 {
		t.Fatalf("%d messages on the job queue after the run, want none: its retry waits in a schedule", n)
	}
	jobARN, err := onetime.QueueARN(r.e.Cfg.Region, r.e.QueueURL)
	if err != nil {
		t.Fatal(err)
	}
	name := onetime.Name(res.ID, ledger.Millis(rec.RunAt))
	got, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(name), GroupName: aws.String(r.group)})
	if err != nil || aws.ToString(got.Target.Arn) != jobARN {
		t.Fatalf("the retry's schedule %s: %v, want one targeting the job queue %s", name, err, jobARN)
	}
}

// Issue 27 item 24, the dispatch guard: far jobs whose records name a
// queue it does not know (gone, taken out of NEXJOB_QUEUES) get their own
// schedule on the job queue, as its SQS checks go there. Before,
// Scheduler's client refused the unknown name, which the guard took for
// Scheduler refusing: that job and every far job after it in the batch
// got an SQS check instead (here 2, the job queue's own job's too).
func TestRemovedQueueFarGuardCheck(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, false)
	g := guard.New(r.e.SQS, r.e.QueueURL, &guard.Options{Far: r.far, Now: r.clock.Now, Logger: quiet})
	runAt := r.clock.Now().Add(40 * 24 * time.Hour).UnixMilli()
	changes := []guard.Change{
		{ID: "gone-job", Kind: "email", State: ledger.Scheduled, RunAt: runAt, Queue: "gone"},
		{ID: "main-job", Kind: "email", State: ledger.Scheduled, RunAt: runAt},
	}
	if err := g.Check(context.Background(), changes); err != nil {
		t.Fatal(err)
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n != 0 {
		t.Fatalf("%d SQS checks, want none: each far job's own schedule made", n)
	}
	for _, c := range changes {
		if got := r.schedulesFor(t, c.ID); got[onetimeName(c.ID, runAt)] != atOf(runAt) {
			t.Fatalf("job %s's schedules: %v, want its own at %s", c.ID, got, atOf(runAt))
		}
	}
}

// Issue 27 item 24: a worker receives, from a queue it does not know
// (bulk's event source outlived its removal), the message of a job that
// runs elsewhere under a live lease. The message is sent on via the job
// queue, due when the lease ends, and deleted from bulk: a queue on its
// way out holds nothing the job needs. Before, the worker made it
// visible again on the job queue's URL with bulk's receipt handle (a
// failed request) and left it on bulk. When the lease ends with no end
// recorded, the job queue's copy takes the orphan over and runs it.
func TestRemovedQueueMessageOfARunningJobGoesViaTheJobQueue(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	var runs atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(context.Context, *handler.Job[charge]) error { runs.Add(1); return nil }), nil)
	res, err := e.Client.Enqueue(ctx, charge{Order: "o-1"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	// A worker elsewhere claimed it (and will die in it).
	if _, err := e.Client.Store().Claim(ctx, res.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	h := e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet})
	if n, err := pollOnly(e, "bulk", h).Poll(ctx); err != nil || n != 1 {
		t.Fatalf("the bulk message: %d handled, %v", n, err)
	}
	e.WantDepth(t, e.Queues["bulk"], 0, "bulk: the message handled")
	e.WantDepth(t, e.QueueURL, 1, "the job queue: sent on via the job queue")
	e.Advance(t, time.Minute+time.Second)
	pollJobQueue(t, e, h, res.ID)
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// Issue 27 item 24, new enqueues: a client deployed after bulk was taken
// out of NEXJOB_QUEUES refuses a job naming it, by Opts.Queue or by its
// kind's Defaults.Queue, alone, in a batch or as a continuation, with an
// *InputError matching ErrUnknownQueue; nothing is written or sent.
func TestRemovedQueueNewEnqueuesRefused(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	c, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Queues: withoutBulk(e), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	parent, err := c.Enqueue(ctx, charge{Order: "parent"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		var in *enqueue.InputError
		if !errors.As(err, &in) || in.Field != "Queue" || !errors.Is(err, enqueue.ErrUnknownQueue) {
			t.Fatalf("%s: %v, want an *InputError on Queue matching ErrUnknownQueue", what, err)
		}
	}
	_, err = c.Enqueue(ctx, charge{Order: "x"}, &enqueue.Opts{Queue: "bulk"})
	refused("Opts.Queue", err)
	_, err = c.Enqueue(ctx, bulkRow{Row: 1}, nil)
	refused("the kind's Defaults.Queue", err)
	items, err := c.EnqueueMany(ctx, []enqueue.Item{{Args: bulkRow{Row: 2}}, {Args: charge{Order: "y"}, Opts: &enqueue.Opts{Queue: "bulk"}}})
	if err == nil || len(items) != 2 {
		t.Fatalf("EnqueueMany: %v", err)
	}
	refused("EnqueueMany's default", items[0].Err)
	refused("EnqueueMany's Opts.Queue", items[1].Err)
	_, err = c.ContinueWith(ctx, parent.ID, charge{Order: "child"}, &enqueue.Opts{Queue: "bulk"})
	refused("ContinueWith", err)
	if recs := e.Scan(t); len(recs) != 1 {
		t.Fatalf("%d records, want the parent's alone", len(recs))
	}
	e.WantDepth(t, e.QueueURL, 1, "the job queue: the parent's message alone")
	e.WantDepth(t, e.Queues["bulk"], 0, "bulk: nothing")
}

// Issue 27 item 24: a keyed job on bulk, written before bulk was taken
// out, whose send failed; a batch enqueue of its key by a client
// deployed since sends it again, via the job queue. Before, the batch's
// send looked the name up and failed the item with a DispatchError.
func TestRemovedQueueDuplicateResentByEnqueueMany(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	old, err := e.Client.Enqueue(ctx, charge{Order: "o-1"}, &enqueue.Opts{Queue: "bulk", IdempotencyKey: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Its send failed (as a DispatchError leaves it), and the queue went.
	(&awstest.Env{Env: e}).Purge(t, e.Queues["bulk"])
	if err := e.Client.Store().MarkUndispatched(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	c, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Queues: withoutBulk(e), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	items, err := c.EnqueueMany(ctx, []enqueue.Item{{Args: charge{Order: "o-1"}, Opts: &enqueue.Opts{IdempotencyKey: "o-1"}}})
	if err != nil || !items[0].Duplicate || !items[0].Sent {
		t.Fatalf("the batch's duplicate: %+v %v, want it sent again", items, err)
	}
	e.WantDepth(t, e.QueueURL, 1, "the job queue: the duplicate sent again")
	e.WantDepth(t, e.Queues["bulk"], 0, "bulk: nothing")
}
