package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Request matchers for the ledger's UpdateItems, read from their JSON
// body: a claim SETs the state to Processing; a run's end SETs its new
// state under a condition on the fencing token.
type updateBody struct {
	ConditionExpression       string
	UpdateExpression          string
	ExpressionAttributeNames  map[string]string
	ExpressionAttributeValues map[string]map[string]any
}

func parseUpdate(b []byte) (u updateBody) {
	_ = json.Unmarshal(b, &u)
	return u
}

// placeholder returns the #name standing for attribute attr.
func (u updateBody) placeholder(attr string) string {
	for k, v := range u.ExpressionAttributeNames {
		if v == attr {
			return k
		}
	}
	return "\x00"
}

// setsState returns the state the update SETs, or "".
func (u updateBody) setsState() ledger.State {
	m := regexp.MustCompile(regexp.QuoteMeta(u.placeholder(ledger.AttrState)) + ` = (:[A-Za-z0-9_]+)`).FindStringSubmatch(u.UpdateExpression)
	if m == nil {
		return ""
	}
	v, _ := u.ExpressionAttributeValues[m[1]]["S"].(string)
	return ledger.State(v)
}

func finishTo(st ledger.State) func([]byte) bool {
	return func(b []byte) bool {
		u := parseUpdate(b)
		return u.setsState() == st && strings.Contains(u.ConditionExpression, u.placeholder(ledger.AttrToken)+" = ")
	}
}

func isClaim(b []byte) bool { return parseUpdate(b).setsState() == ledger.Processing }

// fastQueue redelivers a message a second after a failed receive.
var fastQueue = &awstest.QueueOptions{VisibilityTimeout: time.Second}

// fired fails the test unless the fault fired n times.
func fired(t *testing.T, h faults.Handle, n int) {
	t.Helper()
	if got := h.Fired(); got != n {
		t.Fatalf("fault fired %d times, want %d", got, n)
	}
}

// ranAs checks the job's record (see expect) and that it ran n times.
func (r *rig) ranAs(t *testing.T, id string, st ledger.State, attempt int, lastErr string, n int) {
	t.Helper()
	expect(t, r.get(t, id), st, attempt, lastErr)
	if got := r.runs(id); got != n {
		t.Fatalf("job %s ran %d times, want %d", id, got, n)
	}
}

// receiveAll waits (long poll, 2 s at most a receive) for at least n
// messages on the job queue and returns what it got.
func (r *rig) receive(t *testing.T, n int) []sqstypes.Message {
	t.Helper()
	var out []sqstypes.Message
	for end := time.Now().Add(30 * time.Second); len(out) < n && time.Now().Before(end); {
		got, err := r.e.SQS.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(r.e.QueueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 2, VisibilityTimeout: 60,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got.Messages...)
	}
	if len(out) < n {
		t.Fatalf("received %d messages, want %d", len(out), n)
	}
	return out
}

// TestFinishRetryWhenReplyIsLost (scenario 3): the write that schedules a
// retry is applied and its reply lost. Its resend meets our own write: the
// retry must still be dispatched and run.
func TestFinishRetryWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Attempt == 1 {
			return errors.New("smtp 451 try later")
		}
		return nil
	}, rigConfig{faults: true})
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Scheduled), Fault: faults.LostReply})
	id := r.enqueue(t, email{To: "retry@example.com"}, &enqueue.Opts{IdempotencyKey: "retry-1"})
	r.drain(t)
	fired(t, h, 1)
	r.ranAs(t, id, ledger.Succeeded, 2, "smtp 451", 2)
}

// TestFinishSucceededWhenReplyIsLost (scenario 4): the parent's completing
// write is applied and its reply lost: its children are still released
// and run once each.
func TestFinishSucceededWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true})
	parent := r.enqueue(t, email{To: "parent@example.com"}, nil)
	var kids []string
	for _, to := range []string{"a@example.com", "b@example.com"} {
		res, err := r.prod.ContinueWith(context.Background(), parent, email{To: to}, nil)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, res.ID)
	}
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Succeeded), Fault: faults.LostReply})
	r.drain(t)
	fired(t, h, 1)
	for _, id := range append([]string{parent}, kids...) {
		r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
	}
}

// TestFinishFailedWhenReplyIsLost (scenario 4): the write that fails the
// job is applied and its reply lost: the dead-letter hook still runs, once.
func TestFinishFailedWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	r := newRigWith(t, func(context.Context, *handler.Job[email]) error {
		return handler.Permanent(errors.New("address does not exist"))
	}, rigConfig{faults: true, hook: func(context.Context, ledger.Record, error) error { hooks.Add(1); return nil }})
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Failed), Fault: faults.LostReply})
	id := r.enqueue(t, email{To: "nobody@example.com"}, nil)
	r.drain(t)
	fired(t, h, 1)
	expect(t, r.get(t, id), ledger.Failed, 1, "address does not exist")
	if n := hooks.Load(); n != 1 {
		t.Fatalf("dead-letter hook ran %d times, want 1", n)
	}
}

// TestClaimWhenReplyIsLost (scenario 5): the claim is applied, its reply
// lost; the resend finds the job Processing under our own claim. On its
// last attempt the job must run, not end orphaned.
func TestClaimWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Timeout} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			r := newRigWith(t, ok, rigConfig{faults: true})
			h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isClaim, Fault: f})
			id := r.enqueue(t, email{To: "once@example.com"}, &enqueue.Opts{MaxAttempts: 1})
			r.deliver(t, r.receive(t, 1), 1)
			fired(t, h, 1)
			r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
		})
	}
}

// TestFinishThrottledPastTheRetries (scenario 6): after the job succeeded,
// its completing write is throttled through the SDK's whole retry budget.
// The result must be recorded within the lease: Succeeded, run once.
func TestFinishThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true})
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: finishTo(ledger.Succeeded), Fault: faults.Throttle, Times: 2 * faults.Attempts})
	id := r.enqueue(t, email{To: "slow-table@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	r.deliver(t, r.receive(t, 1), 1)
	fired(t, h, 2*faults.Attempts)
	r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
}

// TestGuardCheckThrottled (scenario 7): the dispatch guard's check for a
// job whose producer died before the send; the check's read is throttled
// past the retries. The check must come back, and the job run.
func TestGuardCheckThrottled(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true, queue: fastQueue})
	// The producer "died" after its write: a record, no message.
	rec, _, err := r.prod.Store().Insert(context.Background(), ledger.Record{Kind: email{}.Kind(), Args: `{"To":"lost@example.com"}`, State: ledger.Enqueued, MaxAttempts: 3}, "", ledger.AllowAfterFailed, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Throttle, Times: faults.Attempts})
	check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: r.clock.Now().UnixMilli(), Check: true}
	if err := r.prod.Send(context.Background(), check, 0); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	fired(t, h, faults.Attempts)
	expect(t, r.get(t, rec.ID), ledger.Succeeded, 1, "")
}

// TestRequeueClearsDeadline (scenario 9): requeueing an Expired job, or a
// Failed one past its deadline, runs it; the old deadline is gone.
func TestRequeueClearsDeadline(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	fail.Store(true)
	r := newRig(t, func(context.Context, *handler.Job[email]) error {
		if fail.Load() {
			return handler.Permanent(errors.New("mailbox full"))
		}
		return nil
	}, nil)
	expired := r.enqueue(t, email{To: "late@example.com"}, &enqueue.Opts{Deadline: r.clock.Now().Add(time.Minute)})
	r.clock.Advance(2 * time.Minute)
	r.drain(t)
	expect(t, r.get(t, expired), ledger.Expired, 1, "deadline")
	failed := r.enqueue(t, email{To: "full@example.com"}, &enqueue.Opts{Deadline: r.clock.Now().Add(time.Minute)})
	r.drain(t)
	expect(t, r.get(t, failed), ledger.Failed, 1, "mailbox full")
	r.clock.Advance(2 * time.Minute)
	fail.Store(false)
	for _, id := range []string{expired, failed} {
		if _, err := r.prod.Requeue(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	r.drain(t)
	for _, id := range []string{expired, failed} {
		rec := r.get(t, id)
		expect(t, rec, ledger.Succeeded, 1, "")
		if rec.Deadline != 0 {
			t.Fatalf("requeued job %s kept its deadline %d", id, rec.Deadline)
		}
	}
}

// TestContinueWithEndedParent (scenario 10): a continuation of a Failed or
// Expired parent is refused with a typed error and nothing written; the
// children of a parent that fails end as it did, so their keys do not hold
// a re-placed order's continuation.
func TestContinueWithEndedParent(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error {
		if strings.HasPrefix(j.Args.To, "charge-fails") {
			return handler.Permanent(errors.New("card declined"))
		}
		return nil
	}, nil)
	ctx := context.Background()
	// Order 1003: the charge fails; its receipt waits on it.
	charge, err := r.prod.Enqueue(ctx, email{To: "charge-fails-1003"}, &enqueue.Opts{IdempotencyKey: "charge-1003"})
	if err != nil {
		t.Fatal(err)
	}
	receipt, err := r.prod.ContinueWith(ctx, charge.ID, email{To: "receipt-1003"}, &enqueue.Opts{IdempotencyKey: "receipt-1003"})
	if err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, charge.ID), ledger.Failed, 1, "card declined")
	if rec := r.get(t, receipt.ID); rec.State != ledger.Failed || !strings.Contains(rec.LastError, charge.ID) {
		t.Fatalf("receipt of the failed charge: %s %q; want Failed naming the parent", rec.State, rec.LastError)
	}
	// Continuing the failed charge now: a typed error, nothing written.
	before := len(r.e.Records(t))
	_, err = r.prod.ContinueWith(ctx, charge.ID, email{To: "late-receipt"}, nil)
	var pe *enqueue.ParentEndedError
	if !errors.As(err, &pe) || pe.ParentID != charge.ID || pe.State != ledger.Failed {
		t.Fatalf("ContinueWith on a Failed parent: %v; want *enqueue.ParentEndedError", err)
	}
	if after := len(r.e.Records(t)); after != before {
		t.Fatalf("%d records written by a refused continuation", after-before)
	}
	// The order is placed again: a new charge, and its receipt with the same
	// key is a new job that runs.
	charge2, err := r.prod.Enqueue(ctx, email{To: "charge-ok-1003"}, &enqueue.Opts{IdempotencyKey: "charge-1003"})
	if err != nil || charge2.Duplicate {
		t.Fatalf("re-placed charge: %+v, %v", charge2, err)
	}
	receipt2, err := r.prod.ContinueWith(ctx, charge2.ID, email{To: "receipt-1003"}, &enqueue.Opts{IdempotencyKey: "receipt-1003"})
	if err != nil || receipt2.Duplicate {
		t.Fatalf("re-placed order's receipt: %+v, %v; the failed order's receipt must not hold its key", receipt2, err)
	}
	r.drain(t)
	r.ranAs(t, receipt2.ID, ledger.Succeeded, 1, "", 1)
}

// TestRetryAfterBeyondLongestSchedule (scenario 17): a RetryAfter longer
// than the longest schedule is clamped to it; the retry is a job, carried
// forward, never a "not a job" dead letter.
func TestRetryAfterBeyondLongestSchedule(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error {
		return handler.RetryAfter(10*enqueue.MaxScheduleAhead, errors.New("come back much later"))
	}, nil)
	id := r.enqueue(t, email{To: "later@example.com"}, nil)
	r.deliver(t, r.receive(t, 1), 1)
	rec := r.get(t, id)
	if rec.State != ledger.Scheduled || ledger.Millis(rec.RunAt).After(r.clock.Now().Add(enqueue.MaxScheduleAhead)) {
		t.Fatalf("retry %s at %s; want Scheduled within %s", rec.State, ledger.Millis(rec.RunAt), enqueue.MaxScheduleAhead)
	}
	// The retry's message is carried forward, not dead-lettered.
	r.deliver(t, r.receive(t, 1), 1)
	if n := r.e.QueueDepth(t, r.e.DLQURL); n != 0 {
		t.Fatalf("%d messages in the DLQ", n)
	}
	r.e.WantDepth(t, r.e.QueueURL, 1, "the job queue: the carried-forward message")
}

// TestWorkerIgnoringItsContext (scenario 16): a worker that never returns
// must not keep the batch response past the invocation: Handle returns at
// the finish margin, the straggler reported as a failure, the rest acked.
func TestWorkerIgnoringItsContext(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	defer close(hang)
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Args.To == "hang" {
			<-hang // ignores ctx
		}
		return nil
	}, nil)
	stuck := r.enqueue(t, email{To: "hang"}, nil)
	fine := r.enqueue(t, email{To: "fine"}, nil)
	msgs := r.receive(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan events.SQSEventResponse, 1)
	go func() {
		resp, _ := r.h.Handle(ctx, poller.Event(r.e.QueueURL, msgs))
		done <- resp
	}()
	var resp events.SQSEventResponse
	select {
	case resp = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Handle did not return while a worker ignored its context")
	}
	if ctx.Err() != nil {
		t.Fatalf("Handle returned after the invocation's deadline")
	}
	want := ""
	for _, m := range msgs {
		if strings.Contains(aws.ToString(m.Body), stuck) {
			want = aws.ToString(m.MessageId)
		}
	}
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != want {
		t.Fatalf("failures %+v, want only the straggler %s", resp.BatchItemFailures, want)
	}
	expect(t, r.get(t, fine), ledger.Succeeded, 1, "")
}

// TestGuardCheckRunsARetryLeftUnsent (10k soak, seed
// 1796411833611391690): a job never sent is started by the guard's check;
// its first run fails and the retry's send is throttled past the SDK's
// retries, so the check message, the job's only one, comes back. It runs
// the retry; it was deleted, and the job left Scheduled for good.
func TestGuardCheckRunsARetryLeftUnsent(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	r := newRigWith(t, func(context.Context, *handler.Job[email]) error {
		if runs.Add(1) == 1 {
			return errors.New("first run fails")
		}
		return nil
	}, rigConfig{faults: true, queue: fastQueue})
	// The producer "died" after its write: a record, no message.
	rec, _, err := r.prod.Store().Insert(context.Background(), ledger.Record{Kind: email{}.Kind(), Args: `{"To":"lost@example.com"}`, State: ledger.Enqueued, MaxAttempts: 3}, "", ledger.AllowAfterFailed, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
	check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: r.clock.Now().UnixMilli(), Check: true}
	if err := r.prod.Send(context.Background(), check, 0); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	fired(t, h, faults.Attempts)
	expect(t, r.get(t, rec.ID), ledger.Succeeded, 2, "")
}

// TestGuardCheckResumesAJobItStarted (10k soak, seed
// 1796415236576371073): the guard's check started a job that was never
// sent, and the worker was killed mid-run. The check message, the job's
// only one, comes back after the lease: it takes the orphan over as the
// job's own message would. It was deleted (the job was not "waiting"),
// and the job stayed Processing for good.
func TestGuardCheckResumesAJobItStarted(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{queue: fastQueue})
	ctx := context.Background()
	rec, _, err := r.prod.Store().Insert(ctx, ledger.Record{Kind: email{}.Kind(), Args: `{"To":"lost@example.com"}`, State: ledger.Enqueued, MaxAttempts: 3}, "", ledger.AllowAfterFailed, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The check's claim, by a worker killed before the run ended.
	if _, err := r.prod.Store().ClaimByCheck(ctx, rec.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(2 * time.Minute)
	check := enqueue.Message{V: 1, ID: rec.ID, Kind: rec.Kind, RunAt: r.clock.Now().UnixMilli(), Check: true}
	if err := r.prod.Send(ctx, check, 0); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	expect(t, r.get(t, rec.ID), ledger.Succeeded, 2, "")
}
