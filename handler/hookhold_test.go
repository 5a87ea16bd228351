package handler_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// hookRig: a kind whose dead-letter hook counts its runs and blocks until
// its handler's gate is closed (a hook that runs long, or a consumer
// killed inside it: its gate never closes).
type hookRig struct {
	e       *nexjobtest.Env
	hooks   atomic.Int32
	started chan struct{}
}

func newHookRig(t *testing.T) *hookRig {
	return &hookRig{e: nexjobtest.New(t, nil), started: make(chan struct{}, 4)}
}

// handler returns a handler whose hook waits for gate (nil: returns at once).
func (r *hookRig) handler(t *testing.T, opts *handler.Options, gate chan struct{}) *handler.Handler {
	if gate == nil {
		gate = make(chan struct{})
		close(gate)
	} else {
		t.Cleanup(func() { close(gate) })
	}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { return nil }),
		&handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error {
			r.hooks.Add(1)
			r.started <- struct{}{}
			<-gate
			return nil
		}})
	return r.e.Handler(t, reg, opts)
}

// poison makes a job whose worker died in its last attempt (a claim
// whose lease ran out) and returns its message as the DLQ consumer
// receives it.
func (r *hookRig) poison(t *testing.T) (string, events.SQSEvent) {
	ctx := context.Background()
	res, err := r.e.Client.Enqueue(ctx, email{To: "poison@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.e.Client.Store().Claim(ctx, res.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	r.e.Advance(t, 2*time.Minute)
	body := enqueue.Message{V: 1, ID: res.ID, Kind: "email"}.Encode()
	return res.ID, events.SQSEvent{Records: []events.SQSMessage{{MessageId: "dl-" + res.ID, ReceiptHandle: "rh", Body: body,
		Attributes: map[string]string{"ApproximateReceiveCount": "5"}}}}
}

// Item 17: the DLQ consumer's write that makes a poison job Failed marks
// its hook due. A consumer killed inside the hook (here: its hook never
// returns) leaves the mark, and the dead letter's next delivery, once the
// killed consumer's lease on the hook ends, runs it. The Failed write set
// no mark, and the redelivery found the job Failed, unmarked, and dropped
// it: the hook never completed.
func TestDeadLetterConsumerKilledInTheHook(t *testing.T) {
	t.Parallel()
	r := newHookRig(t)
	killed := r.handler(t, &handler.Options{Logger: quiet}, make(chan struct{}))
	id, ev := r.poison(t)
	go func() { _, _ = killed.HandleDeadLetters(context.Background(), ev) }() // never returns: killed in the hook
	<-r.started
	rec := r.e.Get(t, id)
	if rec.State != ledger.Failed || !rec.HookPending || rec.HookUntil == 0 {
		t.Fatalf("in the hook: %s, hook due %v until %d; want Failed with the hook due and held", rec.State, rec.HookPending, rec.HookUntil)
	}
	next := r.handler(t, &handler.Options{Logger: quiet}, nil)
	if resp, _ := next.HandleDeadLetters(context.Background(), ev); len(resp.BatchItemFailures) != 1 {
		t.Fatalf("within the killed consumer's lease: kept %v, want kept (looked at again later)", resp.BatchItemFailures)
	}
	r.e.Advance(t, ledger.Millis(rec.HookUntil).Sub(r.e.Now())+time.Second)
	if resp, _ := next.HandleDeadLetters(context.Background(), ev); len(resp.BatchItemFailures) != 0 || r.hooks.Load() != 2 {
		t.Fatalf("after the lease: kept %v, %d hook runs (the killed one and the take-over); want deleted, 2", resp.BatchItemFailures, r.hooks.Load())
	}
	if rec := r.e.Get(t, id); rec.HookPending {
		t.Fatal("the hook ran and its mark stayed")
	}
}

// Item 17: a hook slower than its lease keeps it: its holder extends the
// lease while the hook runs, so a duplicate delivery after the first
// lease's end does not take it over and run it beside itself.
func TestSlowHookKeepsItsLease(t *testing.T) {
	t.Parallel()
	r := newHookRig(t)
	opts := &handler.Options{Logger: quiet, Lease: 3 * time.Second}
	gate := make(chan struct{})
	slow := r.handler(t, opts, gate)
	id, ev := r.poison(t)
	done := make(chan struct{})
	go func() { defer close(done); _, _ = slow.HandleDeadLetters(context.Background(), ev) }()
	<-r.started
	first := r.e.Get(t, id).HookUntil
	// Real time past the first lease: the holder is alive and its hook
	// still runs.
	for ledger.Millis(first).Add(time.Second).After(r.e.Now()) {
		time.Sleep(100 * time.Millisecond)
	}
	dup := r.handler(t, opts, nil)
	if resp, _ := dup.HandleDeadLetters(context.Background(), ev); len(resp.BatchItemFailures) != 1 || r.hooks.Load() != 1 {
		t.Fatalf("a duplicate past the first lease: kept %v, %d hook runs; want kept, 1 (the hook is still running)", resp.BatchItemFailures, r.hooks.Load())
	}
	gate <- struct{}{} // let the slow hook return (the gate closes at cleanup)
	<-done
	if rec := r.e.Get(t, id); rec.HookPending || r.hooks.Load() != 1 {
		t.Fatalf("after the hook: due %v, %d runs; want done, 1", rec.HookPending, r.hooks.Load())
	}
}
