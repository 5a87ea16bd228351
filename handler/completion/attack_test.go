package completion_test

// Attacks on the completion events' promises (reviewer h30). Each test
// says which promise it tries to break; those that broke it say so with
// the failing line, those that held are kept as regression checks.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/completion"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type sleeper struct{ Card string }

func (sleeper) Kind() string { return "sleeper" }

type waiter struct{ Card string }

func (waiter) Kind() string { return "waiter" }

type hooked struct{ Card string }

func (hooked) Kind() string { return "hooked" }

type stepper struct{ Card string }

func (stepper) Kind() string { return "stepper" }

// attackBus makes a bus on e (no rule: the recording client keeps what
// was put, and a call that succeeded is EventBridge's acceptance).
func attackBus(t *testing.T, e *nexjobtest.Env) string {
	t.Helper()
	eb := eventbridge.NewFromConfig(e.Cfg)
	if _, err := eb.CreateEventBus(context.Background(), &eventbridge.CreateEventBusInput{Name: aws.String(e.Table)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = eb.DeleteEventBus(context.Background(), &eventbridge.DeleteEventBusInput{Name: aws.String(e.Table)})
	})
	return e.Table
}

// batchCounter wraps pub.Publish: per stream batch, the ends it held and
// the PutEvents calls it made.
type batchCounter struct {
	pub   *completion.Publisher
	eb    *recording
	mu    sync.Mutex
	fails []string
}

func (b *batchCounter) sink(ctx context.Context, changes []guard.Change) error {
	ends := 0
	for _, c := range changes {
		if c.Ended() {
			ends++
		}
	}
	b.eb.mu.Lock()
	before := b.eb.calls
	b.eb.mu.Unlock()
	err := b.pub.Publish(ctx, changes)
	b.eb.mu.Lock()
	calls := b.eb.calls - before
	b.eb.mu.Unlock()
	if err == nil && calls != (ends+9)/10 {
		b.mu.Lock()
		b.fails = append(b.fails, fmt.Sprintf("a batch of %d ends made %d PutEvents calls, want %d", ends, calls, (ends+9)/10))
		b.mu.Unlock()
	}
	return err
}

func decodeDetails(t *testing.T, details []string) []completion.Event {
	t.Helper()
	var out []completion.Event
	for _, d := range details {
		var ev completion.Event
		if err := jsonUnmarshal(d, &ev); err != nil {
			t.Fatalf("detail %s: %v", d, err)
		}
		out = append(out, ev)
	}
	return out
}

// TestAttackCompletionLifecycle tries the "exactly one event per end"
// promise across a job's whole life, all read from one stream: a Failed
// job requeued and Failed again; a Scheduled job cancelled (an end, as
// Failed), requeued and Succeeded; a keyed job Succeeded and its key
// re-used (the holder archived: no event) by a job that Succeeds; a
// Scheduled job deleted (ended Failed first, its removal no event); a
// Failed job with a dead-letter hook (its mark cleared: no event); a
// durable sleep and a signal wait (Processing → Scheduled: no end); a
// job recording steps and returning a result; an Expired job. And "never
// args, result or key": every one carries the secret in all three.
// And "one PutEvents per 10 ends" for each stream batch.
//
// HELD (kept as a regression check).
func TestAttackCompletionLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := awstest.New(t, nil)
	bus := attackBus(t, e.Env)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(context.Context, *handler.Job[charge]) error { return nil }), nil)
	handler.AddWorker(reg, handler.WorkFunc[refund](func(context.Context, *handler.Job[refund]) error {
		return handler.Permanent(errors.New("card declined"))
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[hooked](func(context.Context, *handler.Job[hooked]) error {
		return handler.Permanent(errors.New("hooked declined"))
	}), &handler.KindOptions{OnDeadLetter: func(context.Context, ledger.Record, error) error { return nil }})
	handler.AddWorker(reg, handler.WorkFunc[sleeper](func(ctx context.Context, j *handler.Job[sleeper]) error {
		return handler.Sleep(ctx, "nap", 5*time.Second)
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[waiter](func(ctx context.Context, j *handler.Job[waiter]) error {
		_, err := handler.WaitForSignal[string](ctx, "go", time.Hour)
		return err
	}), nil)
	handler.AddWorkerResult(reg, handler.ResultFunc[stepper, string](func(ctx context.Context, j *handler.Job[stepper]) (string, error) {
		for _, n := range []string{"a", "b"} {
			if _, err := handler.Step(ctx, n, func(context.Context) (string, error) { return "step " + secret, nil }); err != nil {
				return "", err
			}
		}
		return "result " + secret, nil
	}), nil)
	h := e.Handler(t, reg, nil)
	enq := func(args enqueue.JobArgs, o *enqueue.Opts) string {
		t.Helper()
		res, err := e.Client.Enqueue(ctx, args, o)
		if err != nil {
			t.Fatal(err)
		}
		return res.ID
	}
	later := &enqueue.Opts{RunAt: e.Now().Add(time.Hour)}
	want := map[string][]ledger.State{} // id → its ends, in order

	// Cancelled (Scheduled → Failed), then requeued and Succeeded.
	c := enq(charge{Card: secret}, later)
	if _, err := e.Client.Cancel(ctx, c, "", 0); err != nil {
		t.Fatal(err)
	}
	want[c] = []ledger.State{ledger.Failed}
	// Deleted while Scheduled: ended Failed, then removed.
	d := enq(charge{Card: secret}, later)
	if err := e.Client.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	want[d] = []ledger.State{ledger.Failed}
	// Failed.
	f := enq(refund{Card: secret}, nil)
	want[f] = []ledger.State{ledger.Failed}
	// Keyed, the key re-used after it Succeeded.
	key := "order-" + secret
	k1 := enq(charge{Card: secret}, &enqueue.Opts{IdempotencyKey: key})
	want[k1] = []ledger.State{ledger.Succeeded}
	hk := enq(hooked{Card: secret}, nil)
	want[hk] = []ledger.State{ledger.Failed}
	s := enq(sleeper{Card: secret}, nil)
	want[s] = []ledger.State{ledger.Succeeded}
	w := enq(waiter{Card: secret}, nil)
	want[w] = []ledger.State{ledger.Succeeded}
	st := enq(stepper{Card: secret}, nil)
	want[st] = []ledger.State{ledger.Succeeded}
	runAt := e.Now().Add(time.Minute)
	x := enq(charge{Card: secret}, &enqueue.Opts{RunAt: runAt, Deadline: runAt.Add(time.Millisecond)})
	want[x] = []ledger.State{ledger.Expired}
	e.Drain(t, h)
	e.RequireState(t, w, ledger.Scheduled)
	if err := e.Client.Signal(ctx, w, "go", "sig "+secret); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.Advance(t, 2*time.Minute)
	e.Drain(t, h)
	// Second lives.
	if _, err := e.Client.Requeue(ctx, f); err != nil {
		t.Fatal(err)
	}
	want[f] = append(want[f], ledger.Failed)
	if _, err := e.Client.Requeue(ctx, c); err != nil {
		t.Fatal(err)
	}
	want[c] = append(want[c], ledger.Succeeded)
	k2 := enq(charge{Card: secret}, &enqueue.Opts{IdempotencyKey: key})
	if k2 == k1 {
		t.Fatalf("key re-use gave the same job %s", k2)
	}
	want[k2] = []ledger.State{ledger.Succeeded}
	e.Drain(t, h)
	for id, sts := range want {
		if id != d { // d is gone
			e.RequireState(t, id, sts[len(sts)-1])
		}
	}
	if rec := e.Get(t, hk); rec.HookPending {
		t.Fatalf("the hook's mark is still on %s", hk)
	}

	eb := &recording{Client: eventbridge.NewFromConfig(e.Cfg)}
	bc := &batchCounter{pub: completion.New(eb, &completion.Options{Bus: bus}), eb: eb}
	g := guard.New(e.SQS, e.QueueURL, nil)
	sp := guard.NewStreamPoller(e.DB, dynamodbstreams.NewFromConfig(e.Cfg), e.Table, g).Also(bc.sink)
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string][]ledger.State{}
	ids := map[string]int{}
	for _, ev := range decodeDetails(t, eb.put) {
		got[ev.ID] = append(got[ev.ID], ev.State)
		ids[ev.EventID]++
	}
	for id, sts := range want {
		if !slices.Equal(got[id], sts) {
			t.Errorf("job %s: ends published %v, want %v", id, got[id], sts)
		}
	}
	for id, sts := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("job %s is no job of the test, published %v", id, sts)
		}
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("eventId %s published %d times without a fault", id, n)
		}
	}
	for _, d := range eb.put {
		if strings.Contains(d, secret) {
			t.Errorf("an event carries the job's args, result, step, signal or key: %s", d)
		}
	}
	for _, f := range bc.fails {
		t.Error(f)
	}
}

// TestAttackCompletionStreamFaults tries at-least-once through faults on
// the stream's reads (GetRecords' reply lost, timed out, throttled past
// the SDK's retries) and a throttled PutEvents between: every end
// published, each with one eventId, none lost.
//
// HELD.
func TestAttackCompletionStreamFaults(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ft, fc := r.e.Faulty()
	eb := &recording{Client: eventbridge.NewFromConfig(fc)}
	g := guard.New(r.e.SQS, r.e.QueueURL, nil)
	sp := guard.NewStreamPoller(r.e.DB, dynamodbstreams.NewFromConfig(fc), r.e.Table, g).Also(completion.New(eb, &completion.Options{Bus: r.bus}).Publish)
	ctx := context.Background()
	hs := []faults.Handle{
		ft.Add(faults.Rule{Op: "DynamoDBStreams.GetRecords", Fault: faults.LostReply}),
		ft.Add(faults.Rule{Op: "DynamoDBStreams.GetRecords", Fault: faults.Timeout}),
	}
	th := ft.Add(faults.Rule{Op: "DynamoDBStreams.GetRecords", Fault: faults.Throttle, Times: faults.Attempts})
	for i := 0; i < 6; i++ {
		_ = sp.Poll(ctx)
	}
	for i, h := range append(hs, th) {
		if h.Fired() == 0 {
			t.Fatalf("fault %d never fired", i)
		}
	}
	pt := ft.Add(faults.Rule{Op: "EventBridge.PutEvents", Fault: faults.Timeout})
	// More ends after the faults: requeue the Failed one, and it fails again.
	if _, err := r.e.Client.Requeue(ctx, r.ids[ledger.Failed]); err != nil {
		t.Fatal(err)
	}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[refund](func(context.Context, *handler.Job[refund]) error {
		return handler.Permanent(errors.New("card declined"))
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[charge](func(context.Context, *handler.Job[charge]) error { return nil }), nil)
	r.e.Drain(t, r.e.Handler(t, reg, nil))
	for i := 0; i < 3; i++ {
		if err := sp.Poll(ctx); err != nil {
			t.Logf("poll: %v", err)
		}
	}
	if pt.Fired() != 1 {
		t.Fatalf("PutEvents timeout fired %d", pt.Fired())
	}
	byID := map[string]map[string]bool{}
	for _, ev := range decodeDetails(t, eb.put) {
		if byID[ev.ID] == nil {
			byID[ev.ID] = map[string]bool{}
		}
		byID[ev.ID][ev.EventID] = true
	}
	wantEnds := map[string]int{r.ids[ledger.Succeeded]: 1, r.ids[ledger.Failed]: 2, r.ids[ledger.Expired]: 1}
	for id, n := range wantEnds {
		if len(byID[id]) != n {
			t.Errorf("job %s: %d distinct ends published, want %d (%v)", id, len(byID[id]), n, byID[id])
		}
	}
}

// fakeEB answers PutEvents without a backend, refusing entries as told.
type fakeEB struct {
	mu       sync.Mutex
	calls    int
	accepted []string // details accepted, in order
	sizes    []int    // each accepted entry's size as EventBridge counts it
	refuse   func(call, i int) string
	in       []ebtypes.PutEventsRequestEntry // the call's entries, for refuse
}

func (f *fakeEB) PutEvents(_ context.Context, in *eventbridge.PutEventsInput, _ ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if len(in.Entries) > 10 {
		return nil, fmt.Errorf("ValidationException: %d entries, at most 10", len(in.Entries))
	}
	out := &eventbridge.PutEventsOutput{}
	f.in = in.Entries
	for i, e := range in.Entries {
		code := ""
		if f.refuse != nil {
			code = f.refuse(f.calls, i)
		}
		if code != "" {
			out.FailedEntryCount++
			out.Entries = append(out.Entries, ebtypes.PutEventsResultEntry{ErrorCode: aws.String(code), ErrorMessage: aws.String("injected")})
			continue
		}
		f.accepted = append(f.accepted, aws.ToString(e.Detail))
		// https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html
		size := 14 + len(aws.ToString(e.Source)) + len(aws.ToString(e.DetailType)) + len(aws.ToString(e.Detail))
		f.sizes = append(f.sizes, size)
		out.Entries = append(out.Entries, ebtypes.PutEventsResultEntry{EventId: aws.String(fmt.Sprint(f.calls, "-", i))})
	}
	return out, nil
}

func ends(n int) []guard.Change {
	var cs []guard.Change
	for i := range n {
		cs = append(cs, guard.Change{ID: fmt.Sprintf("job%02d", i), OldID: fmt.Sprintf("job%02d", i), Kind: "charge", State: ledger.Succeeded,
			OldState: ledger.Processing, Attempt: 1, MaxAttempts: 3, UpdatedAt: 1700000000000 + int64(i)})
		// a change that is not an end between each
		cs = append(cs, guard.Change{ID: "other", OldID: "other", Kind: "charge", State: ledger.Processing, OldState: ledger.Enqueued})
	}
	return cs
}

// TestAttackCompletionPartialRefusals tries "does the library notice a
// PutEvents that succeeds with FailedEntryCount > 0": entries refused
// here and there for a few calls are sent again (only they), each end
// accepted exactly once; entries refused on every call fail the batch
// (not a silent loss); 25 ends make 3 requests of at most 10.
//
// HELD.
func TestAttackCompletionPartialRefusals(t *testing.T) {
	ctx := context.Background()
	// Refused at 2 and 7 on the first call, then at 0 on the second.
	f := &fakeEB{refuse: func(call, i int) string {
		switch {
		case call == 1 && (i == 2 || i == 7), call == 2 && i == 0:
			return "ThrottlingException"
		}
		return ""
	}}
	if err := completion.New(f, nil).Publish(ctx, ends(25)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, d := range f.accepted {
		var ev completion.Event
		if err := jsonUnmarshal(d, &ev); err != nil {
			t.Fatal(err)
		}
		seen[ev.EventID]++
	}
	if len(seen) != 25 || len(f.accepted) != 25 {
		t.Fatalf("accepted %d entries of %d ends; want each once", len(f.accepted), len(seen))
	}
	if f.calls != 5 {
		t.Fatalf("%d calls; want 3 and two resends", f.calls)
	}
	// Refused for good.
	var badFake *fakeEB
	badFake = &fakeEB{refuse: func(_, i int) string {
		// the end of job03, wherever it sits in the call
		if strings.Contains(aws.ToString(badFake.in[i].Detail), `"id":"job03"`) {
			return "InternalFailure"
		}
		return ""
	}}
	bad := badFake
	if err := completion.New(bad, &completion.Options{Retries: 2}).Publish(ctx, ends(4)); err == nil {
		t.Fatal("an entry refused on every try: Publish returned nil")
	}
}

// TestAttackCompletionEventUnder1KB breaks the package doc's "Cost"
// promise: "each entry one EventBridge event under 1 KB" (the price
// rests on it). The error is cut to ledger.MaxListError (200) bytes, but
// json.Marshal escapes <, > and & as \u003c (6 bytes each) and control
// characters as \u00XX: an error quoting an HTML error page ("<html>
// <head><title>502 Bad Gateway</title>...", what an HTTP client's error
// often carries) makes a detail several times the 200 bytes.
//
// BROKEN. Failing output:
//
//	attack_test.go:454: an end whose error quotes an upstream HTML page is a 1108-byte event; the package promises each under 1 KB
func TestAttackCompletionEventUnder1KB(t *testing.T) {
	// An upstream's error page quoted in the worker's error: markup.
	page := "502: <html><body>" + strings.Repeat("<p>", 70)
	c := guard.Change{ID: ledger.NewJobID(), Kind: "payments.charge-card", State: ledger.Failed, OldState: ledger.Processing,
		Attempt: 5, MaxAttempts: 5, Queue: "payments-priority", UpdatedAt: time.Now().UnixMilli()}
	c.OldID = c.ID
	// What the ledger keeps as ListErr: the error cut to MaxListError bytes.
	c.ListErr = page[:ledger.MaxListError] + "…"
	f := &fakeEB{}
	if err := completion.New(f, nil).Publish(context.Background(), []guard.Change{c}); err != nil {
		t.Fatal(err)
	}
	if len(f.sizes) != 1 {
		t.Fatalf("%d events", len(f.sizes))
	}
	t.Logf("detail (%d bytes): %s", len(f.accepted[0]), f.accepted[0])
	if f.sizes[0] >= 1024 {
		t.Fatalf("an end whose error quotes an upstream HTML page is a %d-byte event; the package promises each under 1 KB", f.sizes[0])
	}
}

// TestAttackCompletionSameMillisecond breaks "a requeued job that ends
// again publishes a new end with a different eventId": eventId is the
// job's id and its end's time in milliseconds by the writer's clock, so
// two ends of one job stamped in the same millisecond (a frozen or
// coarse clock, as the test kit's Options.Ledger.Now allows; or two
// writers' clocks skewed onto the same millisecond) share one eventId,
// and a consumer dropping repeats, as the package tells it to, drops a
// real end.
//
// BROKEN (under a clock that gives two ends the same millisecond).
// Failing output:
//
//	attack_test.go:507: 2 ends of job 7bylrjc5fcalk5qvj3bpkydy7a: published with eventIds [7bylrjc5fcalk5qvj3bpkydy7a@1796542012672 7bylrjc5fcalk5qvj3bpkydy7a@1796542012672]: the same id for two different ends
func TestAttackCompletionSameMillisecond(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	frozen := time.Now()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{Now: func() time.Time { return frozen }}})
	bus := attackBus(t, e)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[refund](func(context.Context, *handler.Job[refund]) error {
		return handler.Permanent(errors.New("card declined"))
	}), nil)
	h := e.Handler(t, reg, nil)
	res, err := e.Client.Enqueue(ctx, refund{Card: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, res.ID, ledger.Failed)
	if _, err := e.Client.Requeue(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, res.ID, ledger.Failed)
	eb := &recording{Client: eventbridge.NewFromConfig(e.Cfg)}
	sp := guard.NewStreamPoller(e.DB, dynamodbstreams.NewFromConfig(e.Cfg), e.Table, guard.New(e.SQS, e.QueueURL, nil)).
		Also(completion.New(eb, &completion.Options{Bus: bus}).Publish)
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	var evIDs []string
	for _, ev := range decodeDetails(t, eb.put) {
		evIDs = append(evIDs, ev.EventID)
	}
	if len(evIDs) != 2 {
		t.Fatalf("published %d ends, want the 2", len(evIDs))
	}
	if evIDs[0] == evIDs[1] {
		t.Fatalf("2 ends of job %s: published with eventIds %v: the same id for two different ends", res.ID, evIDs)
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

type reservedKind struct{ Card string }

// The kind's name is valid by the kind rule (internal/kinds): letters,
// '.', '-'. Nothing reserves it.
func (reservedKind) Kind() string { return ledger.DeadLetterKind }

// TestAttackCompletionReservedKind breaks "each job's end (Succeeded,
// Failed, Expired) is an EventBridge event": guard.Change.Ended skips
// every record of kind ledger.DeadLetterKind ("nexjob.dead-letter", the
// DLQ consumer's records of messages that were not jobs), telling them
// by their kind alone, and that name is a valid kind a team may give
// its own job (the kind rule allows it; AddWorker and Enqueue take it).
// Such a job runs, Succeeds and Fails like any other, and none of its
// ends is ever published. The record that is not a job carries NonJob
// (AttrNonJob), which the stream's image has and the filter ignores.
//
// BROKEN. Failing output:
//
//	attack_test.go:552: job ak4tewxrf7ms7xwsga7xajsrri of kind "nexjob.dead-letter" ended Succeeded: 0 events published, want 1
func TestAttackCompletionReservedKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := awstest.New(t, nil)
	bus := attackBus(t, e.Env)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[reservedKind](func(context.Context, *handler.Job[reservedKind]) error { return nil }), nil)
	res, err := e.Client.Enqueue(ctx, reservedKind{Card: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, e.Handler(t, reg, nil))
	e.RequireState(t, res.ID, ledger.Succeeded)
	eb := &recording{Client: eventbridge.NewFromConfig(e.Cfg)}
	sp := guard.NewStreamPoller(e.DB, dynamodbstreams.NewFromConfig(e.Cfg), e.Table, guard.New(e.SQS, e.QueueURL, nil)).
		Also(completion.New(eb, &completion.Options{Bus: bus}).Publish)
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if len(eb.put) != 1 {
		t.Fatalf("job %s of kind %q ended Succeeded: %d events published, want 1", res.ID, ledger.DeadLetterKind, len(eb.put))
	}
}

// TestAttackCompletionDeleteRace tries "each job's end is an event"
// through Delete racing a Requeue: Client.Delete reads the job (Failed:
// nothing to end), and before its DeleteItem lands an operator's
// Requeue makes it Enqueued again (its message sent). DeleteItem is
// conditional on the id alone, so it removes the active job: Delete's
// "an active job is ended before that (Failed, marked cancelled)" does
// not happen, the requeued job never runs (its message finds no job)
// and never ends, and no end of it is ever published: a consumer saw
// the Failed end, the requeue's success, and then nothing.
//
// BROKEN (Delete's read-then-delete race; the completion events follow
// the ledger). Failing output:
//
//	attack_test.go:613: job bde2ovmy5qe3bvgatmx7qlyzdi was requeued (Enqueued) and then removed by a Delete that read it Failed: 1 ends published ([Failed]), want the requeued life's end too
func TestAttackCompletionDeleteRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := awstest.New(t, nil)
	bus := attackBus(t, e.Env)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[refund](func(context.Context, *handler.Job[refund]) error {
		return handler.Permanent(errors.New("card declined"))
	}), nil)
	h := e.Handler(t, reg, nil)
	res, err := e.Client.Enqueue(ctx, refund{Card: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	e.RequireState(t, res.ID, ledger.Failed)
	ft, fc := e.Faulty()
	operator, err := enqueue.New(fc, e.Table, e.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	var requeued error
	ft.Add(faults.Rule{Op: "DynamoDB.DeleteItem", Fault: faults.Pass, Before: func(*http.Request, []byte) {
		_, requeued = e.Client.Requeue(ctx, res.ID) // the other operator, between Delete's read and its delete
	}})
	if err := operator.Delete(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	if requeued != nil {
		t.Fatalf("requeue: %v", requeued)
	}
	e.Drain(t, h) // the requeued job's message
	eb := &recording{Client: eventbridge.NewFromConfig(e.Cfg)}
	sp := guard.NewStreamPoller(e.DB, dynamodbstreams.NewFromConfig(e.Cfg), e.Table, guard.New(e.SQS, e.QueueURL, nil)).
		Also(completion.New(eb, &completion.Options{Bus: bus}).Publish)
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	var states []ledger.State
	for _, ev := range decodeDetails(t, eb.put) {
		states = append(states, ev.State)
	}
	if len(states) != 2 {
		t.Fatalf("job %s was requeued (Enqueued) and then removed by a Delete that read it Failed: %d ends published (%v), want the requeued life's end too", res.ID, len(states), states)
	}
}

type cancelled struct{}

func (cancelled) Kind() string { return "cancelled" }

// TestAttackCompletionRunningCancelAndLambdaPath tries "a cancelled
// job's end is published as Failed" for a running job (asked to stop,
// refused at its next step), once; and the Lambda handler's path
// (HandleStream on the JSON Lambda sends) against the same end, plus
// records of unexpected attribute types (no panic, nothing published)
// and an INSERT of a terminal record (nothing).
//
// HELD.
func TestAttackCompletionRunningCancelAndLambdaPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := awstest.New(t, nil)
	bus := attackBus(t, e.Env)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[cancelled](func(ctx context.Context, j *handler.Job[cancelled]) error {
		if _, err := handler.Step(ctx, "a", func(context.Context) (int, error) {
			_, err := e.Client.Cancel(ctx, j.ID, "stop it", 0)
			var cr *enqueue.CancelRequestedError
			if !errors.As(err, &cr) {
				return 0, fmt.Errorf("cancel while running: %w", err)
			}
			e.Advance(t, ledger.CancelLook) // the run reads its record for a cancel at this step's record
			return 1, nil
		}); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "b", func(context.Context) (int, error) { return 2, nil })
		return err
	}), nil)
	res, err := e.Client.Enqueue(ctx, cancelled{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, e.Handler(t, reg, nil))
	if rec := e.RequireState(t, res.ID, ledger.Failed); !rec.Cancelled {
		t.Fatalf("not marked cancelled: %+v", rec)
	}
	eb := &recording{Client: eventbridge.NewFromConfig(e.Cfg)}
	sp := guard.NewStreamPoller(e.DB, dynamodbstreams.NewFromConfig(e.Cfg), e.Table, guard.New(e.SQS, e.QueueURL, nil)).
		Also(completion.New(eb, &completion.Options{Bus: bus}).Publish)
	if err := sp.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	evs := decodeDetails(t, eb.put)
	if len(evs) != 1 || evs[0].State != ledger.Failed || evs[0].ID != res.ID {
		t.Fatalf("a running job cancelled: published %+v, want its one Failed end", evs)
	}

	// The Lambda path, on the JSON Lambda sends.
	raw := `{"Records":[
	 {"eventName":"MODIFY","dynamodb":{"NewImage":{"id":{"S":"j1"},"kind":{"S":"charge"},"state":{"S":"Expired"},"attempt":{"N":"1"},"maxAttempts":{"N":"3"},"updatedAt":{"N":"1700000000123"},"listErr":{"S":"deadline passed"},"args":{"S":"` + secret + `"}},
	                                        "OldImage":{"id":{"S":"j1"},"kind":{"S":"charge"},"state":{"S":"Scheduled"},"args":{"S":"` + secret + `"}}}},
	 {"eventName":"MODIFY","dynamodb":{"NewImage":{"id":{"N":"7"},"state":{"N":"1"}},"OldImage":{"id":{"BOOL":true},"state":{"L":[]}}}},
	 {"eventName":"INSERT","dynamodb":{"NewImage":{"id":{"S":"j2"},"kind":{"S":"charge"},"state":{"S":"Failed"},"updatedAt":{"N":"1"}}}},
	 {"eventName":"REMOVE","dynamodb":{"OldImage":{"id":{"S":"j3"},"kind":{"S":"charge"},"state":{"S":"Processing"}}}}
	]}`
	var ev events.DynamoDBEvent
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		t.Fatal(err)
	}
	f := &fakeEB{}
	if _, err := completion.New(f, nil).HandleStream(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if len(f.accepted) != 1 {
		t.Fatalf("HandleStream published %d events: %v", len(f.accepted), f.accepted)
	}
	var got completion.Event
	_ = jsonUnmarshal(f.accepted[0], &got)
	if !strings.HasPrefix(got.EventID, "j1@1700000000123") || got.State != ledger.Expired || got.Attempt != 1 || got.MaxAttempts != 3 || got.Error != "deadline passed" ||
		!got.EndedAt.Equal(time.UnixMilli(1700000000123)) || strings.Contains(f.accepted[0], secret) {
		t.Fatalf("HandleStream's event: %s", f.accepted[0])
	}
}
