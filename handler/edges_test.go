package handler_test

import (
	"context"
	"errors"
	"fmt"
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

// TestUnknownKindRetried (scenario 12): a job whose kind has no worker
// here (the producer deployed first) is retried with backoff and, if it
// finally fails, reported to the handler's dead-letter hook.
func TestUnknownKindRetried(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	var cause error
	r := newRigWith(t, ok, rigConfig{hopts: &handler.Options{
		UnknownKindBackoff: func(int) time.Duration { return 0 },
		OnDeadLetter: func(_ context.Context, _ ledger.Record, err error) error {
			hooks.Add(1)
			cause = err
			return nil
		}}})
	id := r.enqueue(t, orphanKind{}, &enqueue.Opts{MaxAttempts: 3})
	r.drain(t)
	expect(t, r.get(t, id), ledger.Failed, 3, "no worker registered")
	if hooks.Load() != 1 || !errors.Is(cause, handler.ErrUnknownKind) {
		t.Fatalf("hook ran %d times with %v; want once with ErrUnknownKind", hooks.Load(), cause)
	}
}

// TestRequeueDeadLetterRecordRefused (scenario 13): the ledger record that
// keeps a message that was not a job cannot be requeued.
func TestRequeueDeadLetterRecordRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m-1", Body: "not json", Attributes: map[string]string{"ApproximateReceiveCount": "5"}}}}
	if resp, err := r.h.HandleDeadLetters(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter not kept: %+v %v", resp, err)
	}
	recs := r.e.Records(t)
	if len(recs) != 1 || recs[0].Kind != handler.DeadLetterKind {
		t.Fatalf("records %+v", recs)
	}
	_, err := r.prod.Requeue(context.Background(), recs[0].ID)
	if !errors.Is(err, ledger.ErrDeadLetterRecord) {
		t.Fatalf("requeue of a dead-letter record: %v; want ledger.ErrDeadLetterRecord", err)
	}
	if rec := r.get(t, recs[0].ID); rec.State != ledger.Failed || rec.LastError != recs[0].LastError {
		t.Fatalf("record changed: %+v", rec)
	}
}

// TestDeadLetterOfJobThatNeverStarted (scenario 15): a job message reaches
// the DLQ although no run of the job ever started (its claims were
// throttled, or every receive came too near the invocation's end). That is
// not a poison job: the consumer sends it back to run, and says so; only
// when that keeps happening does it fail it, with what happened as the
// reason.
func TestDeadLetterOfJobThatNeverStarted(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	var cause error
	r := newRigWith(t, ok, rigConfig{hook: func(_ context.Context, _ ledger.Record, err error) error { hooks.Add(1); cause = err; return nil }})
	id := r.enqueue(t, email{To: "patient@example.com"}, nil)
	msgs := r.receive(t, 1)
	n := 0
	deadLetter := func() {
		t.Helper()
		m := poller.Event(r.e.DLQURL, msgs).Records[0]
		m.Attributes["ApproximateReceiveCount"] = "5"
		n++
		m.MessageId = fmt.Sprintf("dead-letter-%d", n) // each return's message reached the DLQ in turn
		resp, err := r.h.HandleDeadLetters(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m}})
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("dead letter: %+v %v", resp, err)
		}
	}
	deadLetter()
	rec := r.get(t, id)
	if rec.State != ledger.Enqueued || rec.Attempt != 0 || !strings.Contains(rec.LastError, "never started") {
		t.Fatalf("after one dead letter: %s attempt %d %q; want Enqueued, sent back, saying why", rec.State, rec.Attempt, rec.LastError)
	}
	r.e.WantDepth(t, r.e.QueueURL, 2, "the original (in flight here) and the one sent back")
	for range handler.DefaultMaxReturns {
		deadLetter()
	}
	rec = r.get(t, id)
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "never started") || strings.Contains(rec.LastError, "crashed") {
		t.Fatalf("after %d dead letters: %s %q", handler.DefaultMaxReturns+1, rec.State, rec.LastError)
	}
	if hooks.Load() != 1 || !errors.Is(cause, handler.ErrNeverStarted) {
		t.Fatalf("hook ran %d times with %v; want once with ErrNeverStarted", hooks.Load(), cause)
	}
}

// cutOffTimeout is the function timeout of the tests whose run the
// invocation's deadline cuts off: the run has it less the finish margin
// (2 s) to do what comes before the cut. 3 s left 1 s, which a busy
// machine's slow DynamoDB answer outlasted.
const cutOffTimeout = 6 * time.Second

// TestCutOffsSpendTheAttempt (scenario 11): a job that always outruns the
// invocation. Each cut-off gives the attempt back, but only MaxCutOffs
// times in a row: then the attempt is spent, so MaxAttempts ends the job
// instead of a new message every invocation, forever.
func TestCutOffsSpendTheAttempt(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(ctx context.Context, _ *handler.Job[email]) error {
		<-ctx.Done() // longer than any invocation
		return ctx.Err()
	}, nil)
	id := r.enqueue(t, email{To: "slow@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	for i := 1; i <= handler.DefaultMaxCutOffs; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), cutOffTimeout)
		r.deliverCtx(ctx, t, r.receive(t, 1), 1)
		cancel()
		rec := r.get(t, id)
		if i < handler.DefaultMaxCutOffs {
			expect(t, rec, ledger.Enqueued, 0, "cut off")
			continue
		}
		expect(t, rec, ledger.Failed, 1, "cut off by the invocation deadline 3 times")
	}
	if n := r.runs(id); n != handler.DefaultMaxCutOffs {
		t.Fatalf("ran %d times, want %d", n, handler.DefaultMaxCutOffs)
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n != 0 {
		t.Fatalf("%d messages left for a Failed job", n)
	}
}

// TestKindTimeout: a kind's Timeout ends its run's context, counts as a
// failed attempt, and sizes the claim's lease (a crashed run of it is
// recovered after about the timeout, not the 5-minute default lease).
func TestKindTimeout(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	prod, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	var lease time.Duration
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(ctx context.Context, j *handler.Job[email]) error {
		rec, err := prod.Store().Get(context.Background(), j.ID)
		if err != nil {
			return err
		}
		lease = ledger.Millis(rec.LeaseUntil).Sub(ledger.Millis(rec.UpdatedAt))
		<-ctx.Done()
		return ctx.Err()
	}), &handler.KindOptions{Timeout: timeout})
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := prod.Enqueue(context.Background(), email{To: "bounded@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := h.Handle(context.Background(), poller.Event(e.QueueURL, e.Messages(t, e.QueueURL))); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v %v", resp, err)
	}
	rec, err := prod.Store().Get(context.Background(), res.ID)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, rec, ledger.Failed, 1, "timed out after 300ms")
	if lease <= timeout || lease > timeout+10*time.Second {
		t.Fatalf("lease %s for a kind with a %s timeout; want a little more than the timeout", lease, timeout)
	}
}

// TestClaimThrottledToTheDLQ (scenario 15, through the fault transport):
// every claim of a job is throttled past the SDK's retries until its
// message moves to the DLQ. No run started, so the DLQ consumer sends the
// job back, saying why, and it runs once the table answers again.
func TestClaimThrottledToTheDLQ(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true, queue: &awstest.QueueOptions{VisibilityTimeout: time.Second, MaxReceiveCount: 2}})
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: isClaim, Fault: faults.Throttle, Times: faults.Forever})
	id := r.enqueue(t, email{To: "throttled@example.com"}, nil)
	for end := time.Now().Add(time.Minute); r.e.QueueDepth(t, r.e.DLQURL) == 0; {
		if time.Now().After(end) {
			t.Fatal("the message never reached the DLQ")
		}
		if _, err := r.poll.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	h.Remove()
	if h.Fired() < 2*faults.Attempts { // at least every attempt of the 2 receives
		t.Fatalf("claims throttled %d times, want every attempt of 2 receives", h.Fired())
	}
	dead := r.e.Messages(t, r.e.DLQURL)
	if resp, err := r.h.HandleDeadLetters(context.Background(), poller.Event(r.e.DLQURL, dead)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letters: %+v %v", resp, err)
	}
	expect(t, r.get(t, id), ledger.Enqueued, 0, "never started")
	r.drain(t)
	r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
}

// TestDeadLetterWritesUnderFaults: the DLQ consumer's conditional write
// (sending back a job that never started) applied with its reply lost
// still reads as its own and sends the job; throttled past the SDK's
// retries, the dead letter is reported as a failure and stays in the DLQ.
func TestDeadLetterWritesUnderFaults(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true})
	id := r.enqueue(t, email{To: "dlq-faults@example.com"}, nil)
	m := poller.Event(r.e.DLQURL, r.receive(t, 1)).Records[0]
	m.Attributes["ApproximateReceiveCount"] = "5"
	ev := events.SQSEvent{Records: []events.SQSMessage{m}}

	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts})
	if resp, err := r.h.HandleDeadLetters(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 1 {
		t.Fatalf("throttled: %+v %v; want the dead letter kept back", resp, err)
	}
	fired(t, h, faults.Attempts)
	if rec := r.get(t, id); rec.Returns != 0 || rec.State != ledger.Enqueued {
		t.Fatalf("throttled write left %+v", rec)
	}

	h = r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	if resp, err := r.h.HandleDeadLetters(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("lost reply: %+v %v", resp, err)
	}
	fired(t, h, 1)
	if rec := r.get(t, id); rec.Returns != 1 || rec.State != ledger.Enqueued || !strings.Contains(rec.LastError, "never started") {
		t.Fatalf("after a lost reply: returns %d, %s %q; want one return", rec.Returns, rec.State, rec.LastError)
	}
	r.e.WantDepth(t, r.e.QueueURL, 2, "the original (in flight here) and the one sent back")

	// The return written, its send throttled past the SDK's retries: the
	// dead letter stays in the DLQ, and its redelivery sends the job
	// without counting a second return (before: one dead letter delivered
	// four times failed the job as never started; 10k soak, seed
	// 1796502170212235855).
	m.MessageId = "a-second-dead-letter"
	ev = events.SQSEvent{Records: []events.SQSMessage{m}}
	h = r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
	if resp, err := r.h.HandleDeadLetters(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 1 {
		t.Fatalf("send throttled: %+v %v; want the dead letter kept back", resp, err)
	}
	fired(t, h, faults.Attempts)
	for range handler.DefaultMaxReturns + 1 { // redelivered, more often than returns are allowed
		if resp, err := r.h.HandleDeadLetters(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("redelivered: %+v %v", resp, err)
		}
	}
	if rec := r.get(t, id); rec.Returns != 2 || rec.State != ledger.Enqueued {
		t.Fatalf("one dead letter delivered %d times: returns %d, %s %q; want it counted once (2 returns)", handler.DefaultMaxReturns+2, rec.Returns, rec.State, rec.LastError)
	}
	if n := r.e.QueueDepth(t, r.e.QueueURL); n < 3 {
		t.Fatalf("job queue holds %d messages, want the redelivered dead letter's sends too", n)
	}
}

// moveToDLQ takes m off the job queue, as the redrive policy does after
// its sixth receive, and returns it as the DLQ consumer receives it.
func (r *rig) moveToDLQ(t *testing.T, m sqstypes.Message) events.SQSMessage {
	t.Helper()
	if _, err := r.e.SQS.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(r.e.QueueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	ev := poller.Event(r.e.DLQURL, []sqstypes.Message{m}).Records[0]
	ev.Attributes["ApproximateReceiveCount"] = "6"
	return ev
}

// TestDeadLetterOfAnOrphanWithAttemptsLeft: a job whose worker was lost
// mid-run (Processing, its lease run out) reaches the DLQ with attempts
// left. Receives are spent by more than runs (receives too near an
// invocation's end, claims that failed, processes killed before their
// claim), so the ledger decides: it is sent back and taken over, not
// failed as poison (before: Failed "poison message moved to the
// dead-letter queue after 6 receives" after one lost run; 10k soak, seed
// 1796520246854062976).
func TestDeadLetterOfAnOrphanWithAttemptsLeft(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	id := r.enqueue(t, email{To: "orphan@example.com"}, &enqueue.Opts{MaxAttempts: 2})
	msgs := r.receive(t, 1)
	if _, err := r.e.Client.Store().Claim(context.Background(), id, time.Millisecond); err != nil { // a run whose worker was lost
		t.Fatal(err)
	}
	for rec := r.get(t, id); rec.LeaseUntil >= r.e.Client.Store().Now().UnixMilli(); rec = r.get(t, id) {
		time.Sleep(time.Millisecond) // the 1 ms lease runs out
	}
	m := r.moveToDLQ(t, msgs[0])
	if resp, err := r.h.HandleDeadLetters(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m}}); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter: %+v %v", resp, err)
	}
	if rec := r.get(t, id); rec.State != ledger.Processing || rec.Returns != 1 || !strings.Contains(rec.LastError, "attempts left") {
		t.Fatalf("after the dead letter: %s, returns %d, %q; want sent back with attempts left", rec.State, rec.Returns, rec.LastError)
	}
	r.drain(t)
	r.ranAs(t, id, ledger.Succeeded, 2, "", 1)

	// Out of attempts, the same dead letter fails it as an orphan.
	id = r.enqueue(t, email{To: "orphan-last@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	msgs = r.receive(t, 1)
	if _, err := r.e.Client.Store().Claim(context.Background(), id, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for rec := r.get(t, id); rec.LeaseUntil >= r.e.Client.Store().Now().UnixMilli(); rec = r.get(t, id) {
		time.Sleep(time.Millisecond)
	}
	m = r.moveToDLQ(t, msgs[0])
	if resp, err := r.h.HandleDeadLetters(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m}}); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter: %+v %v", resp, err)
	}
	expect(t, r.get(t, id), ledger.Failed, 1, "no attempts are left")
}

type archive struct{ Doc string }

func (archive) Kind() string { return "archive" }

// TestDeadLetterKeepsTheKindsRetention: a job the DLQ consumer fails is
// kept for its kind's Failed retention (a year here), not the handler's
// (30 days), so a key protected by RejectIfFailed is not freed early.
func TestDeadLetterKeepsTheKindsRetention(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reg := handler.NewRegistry()
	year := 8760 * time.Hour
	handler.AddWorker(reg, handler.WorkFunc[archive](func(context.Context, *handler.Job[archive]) error { return nil }),
		&handler.KindOptions{Retention: &handler.Retention{Failed: year}})
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &handler.Options{MaxReturns: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Client.Enqueue(context.Background(), archive{Doc: "contract"}, &enqueue.Opts{IdempotencyKey: "archive-1", DuplicatePolicy: enqueue.RejectIfFailed})
	if err != nil {
		t.Fatal(err)
	}
	m := poller.Event(e.DLQURL, e.Messages(t, e.QueueURL)).Records[0]
	m.Attributes["ApproximateReceiveCount"] = "5"
	for i := range 2 { // sent back once (MaxReturns 1), then failed as never started
		m.MessageId = fmt.Sprintf("dead-letter-%d", i) // the message sent back reached the DLQ too
		if resp, err := h.HandleDeadLetters(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m}}); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("dead letter: %+v %v", resp, err)
		}
	}
	rec, err := e.Client.Store().Get(context.Background(), res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != ledger.Failed {
		t.Fatalf("state %s, want Failed", rec.State)
	}
	if keep := time.Until(time.Unix(rec.ExpiresAt, 0)); keep < year-time.Hour || keep > year+time.Hour {
		t.Fatalf("kept for %s, want the kind's %s", keep.Round(time.Hour), year)
	}
}

// TestLeaseTooShortRefused: a Lease no longer than the margin kept to
// record a run's result would start every run with its context done; New
// refuses it with a typed error (it was accepted).
func TestLeaseTooShortRefused(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	for _, lease := range []time.Duration{time.Millisecond, time.Second, handler.MinLease} {
		_, err := handler.New(e.Cfg, e.Table, e.QueueURL, handler.NewRegistry(), &handler.Options{Lease: lease})
		var in *enqueue.InputError
		if !errors.As(err, &in) || in.Field != "Options.Lease" {
			t.Errorf("Lease %s: %v; want an *enqueue.InputError on Options.Lease", lease, err)
		}
	}
	if _, err := handler.New(e.Cfg, e.Table, e.QueueURL, handler.NewRegistry(), &handler.Options{Lease: handler.MinLease + time.Second}); err != nil {
		t.Fatalf("a lease just over the minimum: %v", err)
	}
}

type badKind struct{}

func (badKind) Kind() string { return "orders\ncharge" }

// TestAddWorkerRefusesABadKind: a kind outside the documented rule (here
// a newline) is a programming error that fails at registration.
func TestAddWorkerRefusesABadKind(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "not a valid kind") {
			t.Fatalf("AddWorker of a bad kind: %v; want a panic naming the rule", v)
		}
	}()
	handler.AddWorker(handler.NewRegistry(), handler.WorkFunc[badKind](func(context.Context, *handler.Job[badKind]) error { return nil }), nil)
}

// TestDeadLetterStaleCopyIsDropped: copies of a job's message sent before
// its last return (a duplicate delivery, a guard's check) that reach the
// DLQ after it are dropped, not counted: the return sent the job afresh.
// Before, each copy counted a return, and a job whose copies spent their
// receives in one bad stretch failed as never started (10k soak, seed
// 1796526818492146927: three returns in 35 s, then Failed).
func TestDeadLetterStaleCopyIsDropped(t *testing.T) {
	t.Parallel()
	r := newRig(t, ok, nil)
	ctx := context.Background()
	id := r.enqueue(t, email{To: "copies@example.com"}, nil)
	first := r.receive(t, 1)[0]
	if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: first.Body}); err != nil {
		t.Fatal(err) // a copy, sent now
	}
	copyMsg := r.receive(t, 1)[0]
	r.clock.Advance(2 * time.Minute) // the copies spent their receives; the first reaches the DLQ later
	if resp, err := r.h.HandleDeadLetters(ctx, events.SQSEvent{Records: []events.SQSMessage{r.moveToDLQ(t, first)}}); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letter: %+v %v", resp, err)
	}
	if rec := r.get(t, id); rec.Returns != 1 {
		t.Fatalf("after the first dead letter: returns %d, want 1", rec.Returns)
	}
	stale := r.moveToDLQ(t, copyMsg)
	depth := r.e.QueueDepth(t, r.e.QueueURL)
	if resp, err := r.h.HandleDeadLetters(ctx, events.SQSEvent{Records: []events.SQSMessage{stale}}); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the stale copy: %+v %v", resp, err)
	}
	if rec := r.get(t, id); rec.Returns != 1 || rec.State != ledger.Enqueued {
		t.Fatalf("after the stale copy: %s, returns %d; want Enqueued, still 1 return", rec.State, rec.Returns)
	}
	if got := r.e.QueueDepth(t, r.e.QueueURL); got != depth {
		t.Fatalf("the stale copy sent the job again: %d messages, want %d", got, depth)
	}
	r.drain(t)
	r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
}
