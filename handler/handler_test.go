package handler_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
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

type email struct{ To string }

func (email) Kind() string { return "email" }

type orphanKind struct{}

func (orphanKind) Kind() string { return "no-worker-for-this" }

// clock is a test clock that the handler's ledger reads; tests move it.
// clock is real time moved on by Advance; a stillClock's moves only by
// Advance, for a test whose path depends on a job not yet being due
// (TestDebouncedBurstCosts: under load, the message came late enough in
// real time for the folded job to be due, and it ran at its old run time).
type clock struct {
	off   atomic.Int64
	still time.Time
}

func stillClock() *clock { return &clock{still: time.Now()} }

// stop makes c a still clock from now on (before the rig it serves runs
// anything).
func (c *clock) stop() { c.still = time.Now() }

func (c *clock) Now() time.Time {
	if !c.still.IsZero() {
		return c.still.Add(time.Duration(c.off.Load()))
	}
	return time.Now().Add(time.Duration(c.off.Load()))
}
func (c *clock) Advance(d time.Duration) { c.off.Add(int64(d)) }

type rig struct {
	e     *awstest.Env
	prod  *enqueue.Client
	h     *handler.Handler
	poll  *poller.Poller
	clock *clock
	calls atomic.Int32
	ft    *faults.Transport // set with rigConfig.faults

	mu     sync.Mutex
	perJob map[string]int // worker runs by job id
}

func (r *rig) runs(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.perJob[id]
}

// newRig builds a handler whose email worker runs work; retries have no
// backoff so tests need not wait.
func newRig(t *testing.T, work func(ctx context.Context, j *handler.Job[email]) error, hopts *handler.Options) *rig {
	return newRigWith(t, work, rigConfig{hopts: hopts})
}

type rigConfig struct {
	hopts *handler.Options
	hook  func(context.Context, ledger.Record, error) error // the email kind's dead-letter hook
	queue *awstest.QueueOptions
	// faults, when set, puts the handler's AWS requests (not the
	// producer's nor the poller's) through a fault transport, r.ft.
	faults bool
}

func newRigWith(t *testing.T, work func(ctx context.Context, j *handler.Job[email]) error, rc rigConfig) *rig {
	t.Helper()
	hopts, hook := rc.hopts, rc.hook
	r := &rig{e: awstest.New(t, rc.queue), clock: &clock{}, perJob: map[string]int{}}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(ctx context.Context, j *handler.Job[email]) error {
		r.calls.Add(1)
		r.mu.Lock()
		r.perJob[j.ID]++
		r.mu.Unlock()
		return work(ctx, j)
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return 0 }, OnDeadLetter: hook})
	var o handler.Options
	if hopts != nil {
		o = *hopts
	}
	o.Ledger.Now = r.clock.Now
	if o.MaxDelay == 0 {
		o.MaxDelay = time.Second // long schedules hop every second; tests move the clock
	}
	var err error
	hcfg := r.e.Cfg
	if rc.faults {
		r.ft, hcfg = r.e.Faulty()
	}
	if r.h, err = handler.New(hcfg, r.e.Table, r.e.QueueURL, reg, &o); err != nil {
		t.Fatal(err)
	}
	if r.prod, err = enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Ledger: o.Ledger, MaxDelay: o.MaxDelay}); err != nil {
		t.Fatal(err)
	}
	r.poll = poller.New(r.e.SQS, r.e.QueueURL, r.h.Handle, &poller.Options{WaitTime: -1})
	return r
}

// drain runs the handler over the queue until it is empty, for a minute
// at most (nexjobtest's Drain).
func (r *rig) drain(t *testing.T) {
	t.Helper()
	r.e.Drain(t, r.h)
}

// deliver hands received messages to the handler as one batch, as often
// as asked (redeliveries), then deletes what the handler acknowledged.
func (r *rig) deliver(t *testing.T, msgs []sqstypes.Message, times int) {
	t.Helper()
	r.deliverCtx(context.Background(), t, msgs, times)
}

// deliverCtx is deliver under ctx (an invocation's deadline).
func (r *rig) deliverCtx(ctx context.Context, t *testing.T, msgs []sqstypes.Message, times int) {
	t.Helper()
	var resp events.SQSEventResponse
	var err error
	for range times {
		if resp, err = r.h.Handle(ctx, poller.Event(r.e.QueueURL, msgs)); err != nil {
			t.Fatal(err)
		}
	}
	failed := map[string]bool{}
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	for _, m := range msgs {
		if !failed[aws.ToString(m.MessageId)] {
			if _, err := r.e.SQS.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(r.e.QueueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// pollFor polls for d of real time, whatever the queue holds.
func (r *rig) pollFor(t *testing.T, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		if n, err := r.poll.Poll(context.Background()); err != nil {
			t.Fatal(err)
		} else if n == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (r *rig) enqueue(t *testing.T, args enqueue.JobArgs, o *enqueue.Opts) string {
	t.Helper()
	res, err := r.prod.Enqueue(context.Background(), args, o)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

func (r *rig) get(t *testing.T, id string) ledger.Record {
	t.Helper()
	rec, err := r.prod.Store().Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func expect(t *testing.T, rec ledger.Record, st ledger.State, attempt int, lastErr string) {
	t.Helper()
	got := rec.LastError
	if st == ledger.Succeeded {
		// A success shows no last error; a retry's error is in the history.
		if rec.LastError != "" {
			t.Fatalf("job %s Succeeded but shows the last error %q", rec.ID, rec.LastError)
		}
		for _, a := range rec.Attempts() {
			got += a.Error + "\n"
		}
	}
	if rec.State != st || rec.Attempt != attempt || !strings.Contains(got, lastErr) {
		t.Fatalf("job %s: state %s attempt %d lastError %q; want %s, %d, containing %q", rec.ID, rec.State, rec.Attempt, got, st, attempt, lastErr)
	}
}

func TestSuccess(t *testing.T) {
	t.Parallel()
	var got email
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error { got = j.Args; return nil }, nil)
	id := r.enqueue(t, email{To: "a@example.com"}, &enqueue.Opts{IdempotencyKey: "welcome-1"})
	r.drain(t)
	rec := r.get(t, id)
	expect(t, rec, ledger.Succeeded, 1, "")
	if got.To != "a@example.com" || r.calls.Load() != 1 {
		t.Fatalf("worker saw %+v, called %d times", got, r.calls.Load())
	}
	if rec.ExpiresAt == 0 || rec.ExpiresAt < r.clock.Now().Add(7*24*time.Hour-time.Minute).Unix() {
		t.Fatalf("Succeeded record's TTL %d, want about 7 days ahead", rec.ExpiresAt)
	}
}

// TestOutcomes: one job per case through real SQS messages, from enqueue
// to its final record.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		work    func(context.Context, *handler.Job[email]) error
		opts    func(c *clock) *enqueue.Opts
		advance time.Duration // moved on the clock before the worker runs
		state   ledger.State
		attempt int
		lastErr string
		calls   int32
	}{
		{name: "error, retry, success", work: func(_ context.Context, j *handler.Job[email]) error {
			if j.Attempt == 1 {
				return errors.New("smtp 451 try later")
			}
			return nil
		}, state: ledger.Succeeded, attempt: 2, lastErr: "smtp 451", calls: 2},
		{name: "attempts exhausted", work: func(context.Context, *handler.Job[email]) error { return errors.New("mailbox unavailable") },
			opts:  func(*clock) *enqueue.Opts { return &enqueue.Opts{MaxAttempts: 3} },
			state: ledger.Failed, attempt: 3, lastErr: "mailbox unavailable", calls: 3},
		{name: "permanent error", work: func(context.Context, *handler.Job[email]) error {
			return handler.Permanent(errors.New("address does not exist"))
		}, state: ledger.Failed, attempt: 1, lastErr: "address does not exist", calls: 1},
		{name: "panic", work: func(context.Context, *handler.Job[email]) error { panic("nil map") },
			opts:  func(*clock) *enqueue.Opts { return &enqueue.Opts{MaxAttempts: 2} },
			state: ledger.Failed, attempt: 2, lastErr: "worker panicked: nil map", calls: 2},
		{name: "deadline passed", work: ok,
			opts:    func(c *clock) *enqueue.Opts { return &enqueue.Opts{Deadline: c.Now().Add(time.Minute)} },
			advance: 2 * time.Minute, state: ledger.Expired, attempt: 1, lastErr: "deadline", calls: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tc.work, nil)
			var opts *enqueue.Opts
			if tc.opts != nil {
				opts = tc.opts(r.clock)
			}
			id := r.enqueue(t, email{To: "b@example.com"}, opts)
			r.clock.Advance(tc.advance)
			r.drain(t)
			expect(t, r.get(t, id), tc.state, tc.attempt, tc.lastErr)
			if n := r.calls.Load(); n != tc.calls {
				t.Fatalf("worker called %d times, want %d", n, tc.calls)
			}
		})
	}
}

func TestUnknownKindAndMalformedBody(t *testing.T) {
	t.Parallel()
	r0 := awstest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { return nil }), nil)
	h, err := handler.New(r0.Cfg, r0.Table, r0.QueueURL, reg, &handler.Options{DLQURL: r0.DLQURL})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := enqueue.New(r0.Cfg, r0.Table, r0.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := prod.Enqueue(context.Background(), orphanKind{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"not json", `{"v":1,"id":"","kind":"x"}`, `{"v":1,"id":"zzzz","kind":"email"}`, `{"v":1,"id":"aaaaaaaaaaaaaaaaaaaaaaaaaa","kind":"email","runAt":32503680000000}`} {
		if _, err := r0.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(r0.QueueURL), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	p := poller.New(r0.SQS, r0.QueueURL, h.Handle, &poller.Options{WaitTime: -1})
	for range 20 {
		if n, _ := p.Poll(context.Background()); n == 0 && r0.QueueDepth(t, r0.QueueURL) == 0 {
			break
		}
	}
	rec, err := prod.Store().Get(context.Background(), res.ID)
	if err != nil {
		t.Fatal(err)
	}
	// No worker for its kind here: retried (with DefaultBackoff), not failed.
	expect(t, rec, ledger.Scheduled, 1, "no worker registered")
	// The body naming a run beyond the longest schedule is carried by the
	// ledger, which has no such job: dropped, not kept (a body anyone can
	// send decides nothing; issue 27 item 26).
	dead := r0.Messages(t, r0.DLQURL)
	if len(dead) != 3 {
		t.Fatalf("DLQ holds %d messages, want the 3 that are not jobs", len(dead))
	}
	// The DLQ consumer keeps each in the ledger with its reason.
	if resp, err := h.HandleDeadLetters(context.Background(), poller.Event(r0.DLQURL, dead)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("dead letters: %+v %v", resp, err)
	}
	failed, _, err := prod.Store().List(context.Background(), ledger.Failed, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, listed := range failed {
		rec, err := prod.Store().Get(context.Background(), listed.ID) // a listing holds no args: the record does
		if err != nil {
			t.Fatal(err)
		}
		if rec.Kind == handler.DeadLetterKind && strings.Contains(rec.Args, `"body"`) && rec.LastError != "" && listed.LastError != "" {
			kept++
		}
	}
	if kept != 3 {
		t.Fatalf("%d non-job messages kept in the ledger, want 3: %+v", kept, failed)
	}
}

func TestMixedBatchReportsExactlyTheFailures(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error { return nil }, nil)
	var ids []string
	for range 3 {
		ids = append(ids, r.enqueue(t, email{To: "f@example.com"}, nil))
	}
	busy := r.enqueue(t, email{To: "busy@example.com"}, nil)
	if _, err := r.prod.Store().Claim(context.Background(), busy, time.Hour); err != nil {
		t.Fatal(err) // another worker holds it under a live lease
	}
	for _, body := range []string{"garbage", `{"v":2}`} {
		if _, err := r.e.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	// SQS delivers at least once: a send the SDK resent (the emulator
	// dropped a connection under load) leaves a second copy. The batch
	// takes one message per body; a copy would race its twin's claim.
	var msgs []sqstypes.Message
	seen := map[string]bool{}
	for _, m := range r.e.Messages(t, r.e.QueueURL) {
		if body := aws.ToString(m.Body); seen[body] {
			t.Logf("a second copy of %s left out", body)
		} else {
			seen[body] = true
			msgs = append(msgs, m)
		}
	}
	if len(msgs) != 6 {
		t.Fatalf("%d distinct messages, want 6", len(msgs))
	}
	var wantFailed []string
	for _, m := range msgs {
		body := aws.ToString(m.Body)
		if !strings.Contains(body, `"id"`) || strings.Contains(body, busy) {
			wantFailed = append(wantFailed, aws.ToString(m.MessageId))
		}
	}
	resp, err := r.h.Handle(context.Background(), poller.Event(r.e.QueueURL, msgs))
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	slices.Sort(failed)
	slices.Sort(wantFailed)
	if !slices.Equal(failed, wantFailed) {
		t.Fatalf("BatchItemFailures = %v, want %v", failed, wantFailed)
	}
	for _, id := range ids {
		expect(t, r.get(t, id), ledger.Succeeded, 1, "")
	}
}

func TestRedeliveredSucceededJobDoesNotRun(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(context.Context, *handler.Job[email]) error { return nil }, nil)
	r.enqueue(t, email{To: "g@example.com"}, nil)
	msgs := r.e.Messages(t, r.e.QueueURL)
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	ev := poller.Event(r.e.QueueURL, msgs)
	for range 3 { // the first delivery, then two redeliveries of the same message
		resp, err := r.h.Handle(context.Background(), ev)
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("handle: %+v %v", resp, err)
		}
	}
	if r.calls.Load() != 1 {
		t.Fatalf("worker ran %d times, want 1", r.calls.Load())
	}
}

// pollOne polls p (a long poll: it returns once a message is there)
// until it has handled a message. A poll that found none, or whose
// receive failed (a busy machine's emulator once answered a cost test's
// 20 short polls with nothing, its errors unread), is tried again, up to
// 20 times; the last error is named when none came.
func pollOne(t testing.TB, p *poller.Poller) {
	t.Helper()
	var last error
	for range 20 {
		n, err := p.Poll(context.Background())
		switch {
		case n > 0 && err != nil:
			t.Fatalf("the handler failed the batch: %v", err)
		case n > 0:
			return
		case err != nil:
			last = err
		}
	}
	t.Fatalf("no message in 20 polls (the last error: %v)", last)
}

// TestJobCost counts the AWS requests of one job enqueued, run once and
// succeeded, keyed and not, and their units: 3 write units and a send
// (the poller's receive and delete are the event source mapping's, not
// ours, and use another client).
func TestJobCost(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { return nil }), nil)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: time.Second})
	step := meterStep(t, meter)
	want := []string{"DynamoDB.PutItem", "SQS.SendMessage", "DynamoDB.UpdateItem", "DynamoDB.UpdateItem"}
	for _, key := range []string{"welcome-h", ""} {
		step("enqueue, run, succeed, key "+strconv.Quote(key), want, awstest.Units{Write: 3, Sends: 1}, func() {
			if _, err := h.Producer().Enqueue(context.Background(), email{To: "h@example.com"}, &enqueue.Opts{IdempotencyKey: key}); err != nil {
				t.Fatal(err)
			}
			pollOne(t, p)
		})
	}
}

// TestBatchRunsConcurrently: ten 200 ms jobs of one batch overlap in time.
func TestBatchRunsConcurrently(t *testing.T) {
	t.Parallel()
	type span struct{ start, end time.Time }
	var mu sync.Mutex
	var spans []span
	r := newRig(t, func(ctx context.Context, j *handler.Job[email]) error {
		s := span{start: time.Now()}
		time.Sleep(200 * time.Millisecond)
		s.end = time.Now()
		mu.Lock()
		spans = append(spans, s)
		mu.Unlock()
		return nil
	}, nil)
	for range 10 {
		r.enqueue(t, email{To: "i@example.com"}, nil)
	}
	msgs := r.e.Messages(t, r.e.QueueURL)
	if _, err := r.h.Handle(context.Background(), poller.Event(r.e.QueueURL, msgs)); err != nil {
		t.Fatal(err)
	}
	if len(spans) != 10 {
		t.Fatalf("%d jobs ran", len(spans))
	}
	// The most jobs running at one instant: at some job's start, count the
	// jobs whose span contains it.
	most := 0
	for _, a := range spans {
		n := 0
		for _, b := range spans {
			if !b.start.After(a.start) && b.end.After(a.start) {
				n++
			}
		}
		most = max(most, n)
	}
	if most < 3 {
		t.Fatalf("at most %d of 10 jobs ran at once; they ran one after another", most)
	}
	t.Logf("up to %d of 10 jobs ran at once", most)
}
