package handler_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/onetime"
)

// countingCharges is a registry whose charge worker counts its runs by
// order, and the counts.
func countingCharges() (*handler.Registry, func() map[string]int) {
	var mu sync.Mutex
	runs := map[string]int{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(_ context.Context, j *handler.Job[charge]) error {
		mu.Lock()
		defer mu.Unlock()
		runs[j.Args.Order]++
		return nil
	}), nil)
	return reg, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return runs
	}
}

// movingClient is a client deployed after bulk was taken out of
// NEXJOB_QUEUES, through the fault transport ft.
func movingClient(t *testing.T, e *nexjobtest.Env) (*enqueue.Client, *faults.Transport) {
	t.Helper()
	ft, fcfg := (&awstest.Env{Env: e}).Faulty()
	c, err := enqueue.New(fcfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Queues: withoutBulk(e), Logger: quiet, Ledger: ledger.Options{Now: e.Now}})
	if err != nil {
		t.Fatal(err)
	}
	return c, ft
}

// Issue 27 item 24: the messages a moved job left on the removed queue
// are harmless. Bulk still holds them, and a worker reads it (an event
// source that outlived the queue's removal) as well as the job queue,
// where the move sent each job again: each job runs once, whichever of
// its two messages comes first (the other finds it claimed or ended).
func TestMoveQueueLeftoverMessagesRunEachJobOnce(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	c, _ := movingClient(t, e)
	var ids []string
	for _, o := range []string{"o-1", "o-2", "o-3", "o-4"} {
		res, err := e.Client.Enqueue(ctx, charge{Order: o}, &enqueue.Opts{Queue: "bulk"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for _, id := range ids {
		if rec, err := c.MoveQueue(ctx, id, "bulk", ""); err != nil || rec.Queue != "" {
			t.Fatalf("move %s: %v (queue %q)", id, err, rec.Queue)
		}
	}
	e.WantDepth(t, e.Queues["bulk"], 4, "bulk: each job's first message")
	e.WantDepth(t, e.QueueURL, 4, "the job queue: each move's message")
	reg, runs := countingCharges()
	e.Drain(t, e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet})) // bulk too
	for _, o := range []string{"o-1", "o-2", "o-3", "o-4"} {
		if runs()[o] != 1 {
			t.Fatalf("runs %v, want each job once", runs())
		}
	}
}

// Issue 27 item 24, the fence: a worker claims the job while the move's
// send is on its way (it read the job's old message). The move's write,
// conditional on the state and fencing token it read, is refused, and
// the job, read again, is running: a *NotMovedError, nothing written, the
// run left alone. The move's message finds the job running, then ended:
// the job runs once, the claimant's run.
func TestMoveQueueFencedAgainstAClaim(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	c, ft := movingClient(t, e)
	res, err := e.Client.Enqueue(ctx, charge{Order: "o-1"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	var claimed ledger.Record
	var claimErr error
	ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Pass, Before: func(*http.Request, []byte) {
		claimed, claimErr = e.Client.Store().Claim(ctx, res.ID, time.Minute)
	}})
	_, err = c.MoveQueue(ctx, res.ID, "bulk", "")
	var nm *enqueue.NotMovedError
	if claimErr != nil || !errors.As(err, &nm) || nm.Why != "running" {
		t.Fatalf("the move of a job claimed meanwhile: %v (claim: %v), want a *NotMovedError, running", err, claimErr)
	}
	if rec := e.Get(t, res.ID); rec.Queue != "bulk" || rec.State != ledger.Processing || rec.Token != claimed.Token || rec.UpdatedAt != claimed.UpdatedAt {
		t.Fatalf("after the refused move: queue %q, %s, token %d, want the claim's record untouched", rec.Queue, rec.State, rec.Token)
	}
	if _, err := e.Client.Store().Finish(ctx, claimed, ledger.Finish{State: ledger.Succeeded}); err != nil {
		t.Fatal(err)
	}
	reg, runs := countingCharges()
	e.Drain(t, e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet}))
	if len(runs()) != 0 {
		t.Fatalf("runs %v here: the move's message ran the job again", runs())
	}
}

// Issue 27 item 24: the move's write applied with its reply lost (the
// SDK resends it, and the resend's condition meets the write) reads as
// moved; moving it again is a *NotMovedError (on the job queue now),
// nothing sent, and the job runs once.
func TestMoveQueueWriteReplyLost(t *testing.T) {
	t.Parallel()
	e := queuesEnv(t)
	ctx := context.Background()
	c, ft := movingClient(t, e)
	res, err := e.Client.Enqueue(ctx, charge{Order: "o-1"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	lost := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	if rec, err := c.MoveQueue(ctx, res.ID, "bulk", ""); err != nil || rec.Queue != "" || lost.Fired() != 1 {
		t.Fatalf("the move with its write's reply lost: %v (queue %q, fired %d), want moved", err, rec.Queue, lost.Fired())
	}
	_, err = c.MoveQueue(ctx, res.ID, "bulk", "")
	var nm *enqueue.NotMovedError
	if !errors.As(err, &nm) || nm.Why != "not on it" || nm.Queue != "" {
		t.Fatalf("moved again: %v, want a *NotMovedError, on the job queue now", err)
	}
	e.WantDepth(t, e.QueueURL, 1, "the job queue: the first move's message alone")
	reg, runs := countingCharges()
	e.Drain(t, e.Handler(t, reg, &handler.Options{Queues: withoutBulk(e), Logger: quiet}))
	if runs()["o-1"] != 1 {
		t.Fatalf("runs %v, want the job once", runs())
	}
}

// Issue 27 item 24: a far job's one-time schedule, made while bulk was
// configured, targets bulk's queue (deleted with it: Scheduler would
// retry its send for 24 hours, then dead-letter it). The move sends the
// job again, which updates its schedule, of the same name, to target the
// job queue.
func TestMoveQueueRetargetsAFarSchedule(t *testing.T) {
	t.Parallel()
	r := newFarRig(t, false)
	ctx := context.Background()
	const bulkARN = "arn:aws:sqs:us-east-1:123456789012:removed-bulk"
	jobARN, err := onetime.QueueARN(r.e.Cfg.Region, r.e.QueueURL)
	if err != nil {
		t.Fatal(err)
	}
	oldFar, err := onetime.New(scheduler.NewFromConfig(r.e.Cfg), onetime.Options{Group: r.group, QueueARN: jobARN, QueueARNs: map[string]string{"bulk": bulkARN}, RoleARN: "arn:aws:iam::123456789012:role/nexjob-scheduler"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Queues: map[string]string{"bulk": r.e.QueueURL}, Far: oldFar, Ledger: ledger.Options{Now: r.clock.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := old.Enqueue(ctx, email{To: "far@example.com"}, &enqueue.Opts{Queue: "bulk", Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rec := r.e.Get(t, res.ID)
	target := func() string {
		t.Helper()
		got, err := r.sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(onetime.Name(res.ID, ledger.Millis(rec.RunAt))), GroupName: aws.String(r.group)})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(got.Target.Arn)
	}
	if got := target(); got != bulkARN {
		t.Fatalf("the far job's schedule targets %s, want bulk's", got)
	}
	if _, err := r.h.Producer().MoveQueue(ctx, res.ID, "bulk", ""); err != nil {
		t.Fatal(err)
	}
	if got := target(); got != jobARN {
		t.Fatalf("after the move the far job's schedule targets %s, want the job queue %s", got, jobARN)
	}
	if got := r.e.Get(t, res.ID); got.Queue != "" || got.State != ledger.Scheduled || got.RunAt != rec.RunAt {
		t.Fatalf("after the move: queue %q, %s at %d, want the job queue, Scheduled at %d", got.Queue, got.State, got.RunAt, rec.RunAt)
	}
}
