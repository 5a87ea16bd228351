package handler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestHookRunsAfterACrashBeforeIt: found by the soak (seed 1, 200 jobs):
// a worker SIGKILLed after the write that made a job Failed and before its
// dead-letter hook returned left the job Failed with no hook ever run; the
// message's next delivery found it Failed and was deleted. The Failed
// write now marks the hook due (HookPending); the next delivery runs the
// hook and clears the mark, and a later one runs nothing.
func TestHookRunsAfterACrashBeforeIt(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		return errors.New("smtp down")
	}), &handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "crash@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	failThenCrash(t, h.Producer().Store(), res.ID)
	if !e.Get(t, res.ID).HookPending {
		t.Fatal("the Failed write did not mark the hook due")
	}
	e.Drain(t, h) // the job's message, delivered again
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the hook ran %d times after the crash, want once", n)
	}
	if e.Get(t, res.ID).HookPending {
		t.Fatal("the mark is still set after the hook ran")
	}
	// One more delivery of its message.
	if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: res.ID, Kind: "email"}.Encode())}); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	if n := hooks.Load(); n != 1 {
		t.Fatalf("a later delivery ran the hook again: %d runs", n)
	}

	// The normal path: the hook runs once and the mark is gone.
	res2, err := e.Client.Enqueue(ctx, email{To: "fails@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	got := e.Get(t, res2.ID)
	if got.State != ledger.Failed || got.HookPending || hooks.Load() != 2 {
		t.Fatalf("normal failure: %s, mark %v, %d hook runs in all (want Failed, cleared, 2)", got.State, got.HookPending, hooks.Load())
	}
}

// Seed 2 of the short soak: a worker died between the Failed write and
// the hook, and an operator requeued the job before its message came back
// to run the hook; the message then found the job Enqueued and ran it,
// and that failure's hook never ran. The next claim runs it.
func TestHookDueAtARequeueRunsAtTheNextClaim(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	var hookState atomic.Value
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		return nil // the requeued run succeeds
	}), &handler.KindOptions{OnDeadLetter: func(_ context.Context, rec ledger.Record, cause error) error {
		hooks.Add(1)
		hookState.Store(string(rec.State) + ": " + cause.Error())
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "requeued@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	failThenCrash(t, h.Producer().Store(), res.ID)
	// The enqueue's message goes: either message claims the requeued job,
	// and the second would wait out the first run's visibility timeout.
	if _, err := e.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(e.QueueURL)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Requeue(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	if !e.Get(t, res.ID).HookPending {
		t.Fatal("the requeue dropped the due hook's mark")
	}
	e.Drain(t, h)
	got := e.Get(t, res.ID)
	if got.State != ledger.Succeeded || got.HookPending {
		t.Fatalf("after the requeued run: %s, mark %v (want Succeeded, cleared)", got.State, got.HookPending)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the failure before the requeue had its hook run %d times, want once", n)
	}
	if s := hookState.Load(); s != "Failed: smtp down" {
		t.Fatalf("the hook saw %q, want the record as it failed (Failed: smtp down)", s)
	}
}

// failThenCrash does what a worker that dies before the dead-letter hook
// did: claim, then the Failed write, marked for its hook ("smtp down").
func failThenCrash(t *testing.T, st *ledger.Store, id string) {
	t.Helper()
	ctx := context.Background()
	rec, err := st.Claim(ctx, id, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "smtp down", HookPending: true, Nonce: ledger.NewNonce()}); err != nil {
		t.Fatal(err)
	}
}

// Seed 2 of the short soak, on CI: a worker made a job Failed and was
// running its dead-letter hook when a duplicate delivery of the job's
// message found the hook's mark still set and ran the hook again. The
// Failed write now gives its worker a lease on the hook; a delivery meanwhile
// leaves the hook alone and its message comes back; only once the lease
// ends (its worker died) does another worker take the hook over.
func TestADeliveryLeavesARunningHookAlone(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		return errors.New("smtp down")
	}), &handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error {
		if hooks.Add(1) == 1 {
			close(entered)
			<-release
		}
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "slow-hook@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL) // its messages are handed in below
	delivery := func(n int) events.SQSEvent {
		return events.SQSEvent{Records: []events.SQSMessage{{
			MessageId: fmt.Sprint("m", n), ReceiptHandle: "not-a-receipt",
			Body: enqueue.Message{V: 1, ID: res.ID, Kind: "email"}.Encode(),
		}}}
	}
	first := make(chan events.SQSEventResponse, 1)
	go func() {
		resp, _ := h.Handle(ctx, delivery(1))
		first <- resp
	}()
	<-entered // the first worker is in the hook
	resp, err := h.Handle(ctx, delivery(2))
	if err != nil {
		t.Fatal(err)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("the duplicate delivery ran the hook: %d runs while the first still ran", n)
	}
	if len(resp.BatchItemFailures) != 1 {
		t.Fatal("the duplicate delivery was deleted while the hook it found due had not returned")
	}
	close(release)
	if r := <-first; len(r.BatchItemFailures) != 0 {
		t.Fatalf("the failing delivery was kept: %+v", r)
	}
	if got := e.Get(t, res.ID); got.HookPending || got.HookUntil != 0 {
		t.Fatalf("after the hook: mark %v, lease %d; want both cleared", got.HookPending, got.HookUntil)
	}
	if resp, _ := h.Handle(ctx, delivery(3)); len(resp.BatchItemFailures) != 0 || hooks.Load() != 1 {
		t.Fatalf("a delivery after the hook: kept %v, %d hook runs (want deleted, 1)", resp.BatchItemFailures, hooks.Load())
	}

	// The holder dies in the hook: its lease ends, and the next delivery
	// takes the hook over.
	res2, err := e.Client.Enqueue(ctx, email{To: "died-in-hook@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL)
	st := h.Producer().Store()
	rec, err := st.Claim(ctx, res2.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "smtp down", HookPending: true, HookLease: time.Minute, Nonce: ledger.NewNonce()}); err != nil {
		t.Fatal(err)
	}
	next := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "n1", ReceiptHandle: "not-a-receipt", Body: enqueue.Message{V: 1, ID: res2.ID, Kind: "email"}.Encode()}}}
	if resp, _ := h.Handle(ctx, next); len(resp.BatchItemFailures) != 1 || hooks.Load() != 1 {
		t.Fatalf("within the dead holder's lease: kept %v, %d hook runs (want kept, 1)", resp.BatchItemFailures, hooks.Load())
	}
	e.Advance(t, 2*time.Minute)
	if resp, _ := h.Handle(ctx, next); len(resp.BatchItemFailures) != 0 || hooks.Load() != 2 {
		t.Fatalf("after the lease: kept %v, %d hook runs (want deleted, 2)", resp.BatchItemFailures, hooks.Load())
	}
	if e.Get(t, res2.ID).HookPending {
		t.Fatal("the taken-over hook ran and its mark stayed")
	}
}

// TestRequeuedJobWaitsForAHeldHook (10k soak, seed 1796411833611391690):
// a worker made the job Failed and was killed in its hook, holding the
// hook's lease; an operator requeued the job at once. The requeued run
// waits for the lease (deferred, no attempt spent), takes the hook over,
// then runs: each failure's hook runs once. The run went on without it,
// the mark stayed for the next failure, and one hook was lost.
func TestRequeuedJobWaitsForAHeldHook(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var hooks, runs atomic.Int32
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		runs.Add(1)
		return errors.New("smtp down")
	}), &handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "killed-in-hook@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL)
	st := h.Producer().Store()
	rec, err := st.Claim(ctx, res.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "smtp down", HookPending: true, HookLease: time.Minute, Nonce: ledger.NewNonce()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Requeue(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL) // the requeue's message is handed in below
	msg := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "r1", ReceiptHandle: "not-a-receipt", Body: enqueue.Message{V: 1, ID: res.ID, Kind: "email"}.Encode()}}}
	if resp, _ := h.Handle(ctx, msg); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the deferral was kept: %+v", resp)
	}
	if got := e.Get(t, res.ID); runs.Load() != 0 || hooks.Load() != 0 || got.State != ledger.Scheduled || got.Attempt != 0 || !got.HookPending {
		t.Fatalf("within the killed holder's lease: %d runs, %d hooks, %s attempt %d mark %v; want none, none, Scheduled 0 true",
			runs.Load(), hooks.Load(), got.State, got.Attempt, got.HookPending)
	}
	e.Advance(t, 2*time.Minute)
	e.Drain(t, h)
	if got := e.Get(t, res.ID); runs.Load() != 1 || hooks.Load() != 2 || got.State != ledger.Failed || got.HookPending {
		t.Fatalf("after the lease: %d runs, %d hooks, %s mark %v; want 1 run, 2 hooks (each failure's), Failed, cleared",
			runs.Load(), hooks.Load(), got.State, got.HookPending)
	}
}

// TestHookMarkClearedThroughAThrottle (10k soak, seed
// 1796415236576371073): the write that clears the hook's mark throttled
// past the SDK's retries is tried again while the worker holds the hook:
// the mark is cleared and the hook runs once. It was left, and the next
// delivery ran the hook again.
func TestHookMarkClearedThroughAThrottle(t *testing.T) {
	t.Parallel()
	var hooks atomic.Int32
	r := newRigWith(t, func(context.Context, *handler.Job[email]) error {
		return handler.Permanent(errors.New("mailbox gone"))
	}, rigConfig{faults: true, queue: fastQueue, hook: func(context.Context, ledger.Record, error) error {
		hooks.Add(1)
		return nil
	}})
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts, Match: func(b []byte) bool {
		return bytes.Contains(b, []byte("attribute_exists")) && bytes.Contains(b, []byte(ledger.AttrHookPending))
	}})
	id := r.enqueue(t, email{To: "gone@example.com"}, nil)
	r.drain(t)
	fired(t, h, faults.Attempts)
	got := r.get(t, id)
	if got.State != ledger.Failed || got.HookPending || hooks.Load() != 1 {
		t.Fatalf("%s, mark %v, %d hook runs; want Failed, cleared, 1", got.State, got.HookPending, hooks.Load())
	}
}

// TestHookAtARunsEndGetsTheJobLogger: a dead-letter hook called at the
// end of the run that failed the job logs with the job's logger (its id,
// kind and attempt), as the worker does.
func TestHookAtARunsEndGetsTheJobLogger(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var logs syncBuffer
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		return errors.New("smtp down")
	}), &handler.KindOptions{OnDeadLetter: func(ctx context.Context, _ ledger.Record, _ error) error {
		handler.Logger(ctx).InfoContext(ctx, "dead letter noted")
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	res, err := e.Client.Enqueue(ctx, email{To: "hook-log@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	var line struct {
		Msg, JobID, Kind string
		Attempt          int
	}
	for l := range strings.Lines(logs.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if m["msg"] == "dead letter noted" {
			line.Msg, line.JobID, line.Kind = m["msg"].(string), fmt.Sprint(m["job_id"]), fmt.Sprint(m["kind"])
			if a, ok := m["attempt"].(float64); ok {
				line.Attempt = int(a)
			}
		}
	}
	if line.Msg == "" || line.JobID != res.ID || line.Kind != "email" || line.Attempt != 1 {
		t.Fatalf("the hook's line: %+v, want job %s, kind email, attempt 1\n%s", line, res.ID, logs.String())
	}
}

// The 10k soak, seed 1796535410351433258: a worker died between a job's
// Failed write and its hook; an operator requeued the job; its next
// claims landed after their invocations gave up (no run), and the
// delivery that found it out of attempts failed it as an orphan with its
// own hook's mark, on top of the one still due: one hook ran for two
// failures. The earlier failure's hook now runs first, then the orphan's.
// Before: "2 failures, 1 hook run".
func TestOrphanAfterARequeueRunsBothHooks(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var seen []string
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error {
		t.Error("the orphan ran")
		return nil
	}), &handler.KindOptions{OnDeadLetter: func(_ context.Context, rec ledger.Record, cause error) error {
		mu.Lock()
		seen = append(seen, cause.Error())
		mu.Unlock()
		return nil
	}})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	res, err := e.Client.Enqueue(ctx, email{To: "orphan@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	st := h.Producer().Store()
	failThenCrash(t, st, res.ID)
	if _, err := e.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(e.QueueURL)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Requeue(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	// Its one attempt spent by a claim that never ran, and its lease out.
	if _, err := st.Claim(ctx, res.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	e.Advance(t, time.Minute)
	e.Drain(t, h)
	got := e.Get(t, res.ID)
	mu.Lock()
	defer mu.Unlock()
	if got.State != ledger.Failed || got.HookPending || len(seen) != 2 {
		t.Fatalf("%d failures (%s, mark %v), %d hook runs %q; want 2 failures, 2 hook runs", 2, got.State, got.HookPending, len(seen), seen)
	}
	if seen[0] != "smtp down" || !strings.Contains(seen[1], "orphaned") {
		t.Fatalf("the hooks saw %q; want the first failure's, then the orphan's", seen)
	}
}
