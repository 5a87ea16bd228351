package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// skewedStore is another process on the rig's table whose clock reads
// the rig's clock plus skew.
func (r *rig) skewedStore(t *testing.T, o *idempotency.Options, skew time.Duration) *idempotency.Store {
	t.Helper()
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	cfg := faults.Config(r.e.Cfg, r.ft)
	opts.Ledger.Now = func() time.Time { return r.e.Now().Add(skew) }
	opts.Logger = slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.Metrics = metrics.New(&metrics.Options{Out: r.emf})
	if opts.Function == "" {
		opts.Function = "charge"
	}
	s, err := idempotency.New(cfg, r.e.Table, &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Doc: "the first call with a key runs and records its result; a repeat
// returns the recorded result without running" and "A result that
// cannot be recorded (...) is returned with a *NotRecordedError: the
// function ran; its key stays held until the hold ends". A function that
// did its work and returned a value JSON cannot encode (a NaN ratio) has
// its key released at once: the caller gets a plain error, and an
// immediate repeat runs the side effect again.
func TestAttackUnencodableResultRunsTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var runs atomic.Int32
	fn := func(context.Context) (float64, error) { runs.Add(1); return math.NaN(), nil }
	_, err := idempotency.Do(context.Background(), r.s, "ratio-1", fn, nil)
	var ue *idempotency.UnencodableResultError
	if !errors.As(err, &ue) || ue.Replayed || ue.Err == nil {
		t.Errorf("first call: %v; want an *UnencodableResultError (the function ran, its result has no JSON)", err)
	}
	_, err = idempotency.Do(context.Background(), r.s, "ratio-1", fn, nil)
	if n := runs.Load(); n != 1 || !errors.As(err, &ue) || !ue.Replayed {
		t.Fatalf("an immediate repeat: %v; the function ran %d times, want 1 and the error replayed", err, n)
	}
}

// Doc: "Every write is conditional on the caller's own token, so a write
// whose reply was lost and that the SDK resent reads as the success it
// was: ... a result recorded is not recorded twice". NotRecordedError:
// "ledger.ErrCallTakenOver when its hold had run out and another call
// took the key". Under AllowAfterFailed, a first call whose result was
// recorded (its reply lost) and whose key a new call took before the
// SDK's resend reads as *NotRecordedError (taken over) although its hold
// never ran out and its result was recorded.
func TestAttackRecordedResultLostReplyReadsAsNotRecorded(t *testing.T) {
	t.Parallel()
	allow := ledger.AllowAfterFailed
	o := &idempotency.Options{Policy: &allow}
	r := newRig(t, o)
	other := r.store(t, o)
	applied, proceed := make(chan struct{}), make(chan struct{})
	h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, After: func() {
		close(applied)
		<-proceed
	}})
	var c charger
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r.s, "order-a2", c.charge(100), nil)
		done <- err
	}()
	<-applied // the first call's result is recorded; its reply is not back yet
	if _, err := idempotency.Do(context.Background(), other, "order-a2", c.charge(100), nil); err != nil {
		t.Fatalf("the new call: %v", err)
	}
	close(proceed)
	err := <-done
	if h.Fired() != 1 {
		t.Fatalf("the rule fired %d times", h.Fired())
	}
	if err != nil {
		t.Fatalf("the first call, its result recorded and its reply lost: %v; want the success it was", err)
	}
}

// Doc table: under AllowAfterFailed a first call that "returned an error,
// recorded (Options.RecordErrors)" -> "runs again"; DuplicateError: "the
// policy protects that outcome (as at enqueue: RejectIfFailed,
// RejectAlways)". A repeat that waited (Options.Wait) for that first call
// gets a *DuplicateError under AllowAfterFailed instead.
func TestAttackWaiterGetsDuplicateUnderAllowAfterFailed(t *testing.T) {
	t.Parallel()
	allow := ledger.AllowAfterFailed
	r := newRig(t, &idempotency.Options{Policy: &allow, RecordErrors: true, Wait: true})
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	first := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r.s, "order-a3", func(context.Context) (int, error) {
			runs.Add(1)
			close(started)
			<-release
			return 0, errors.New("declined")
		}, nil)
		first <- err
	}()
	<-started
	waiter := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r.s, "order-a3", func(context.Context) (int, error) { runs.Add(1); return 1, nil }, nil)
		waiter <- err
	}()
	r.waitForOp(t, "DynamoDB.GetItem") // the waiter polls
	close(release)
	if err := <-first; err == nil || err.Error() != "declined" {
		t.Fatalf("first call: %v", err)
	}
	err := <-waiter
	var dup *idempotency.DuplicateError
	if errors.As(err, &dup) {
		t.Fatalf("the waiter under AllowAfterFailed: %v (policy %s); want it run again, not a *DuplicateError", err, dup.Policy)
	}
	if err != nil || runs.Load() != 2 {
		t.Fatalf("the waiter: %v, %d runs; want it run again", err, runs.Load())
	}
}

// HandlerOptions.RunWithoutKey: "Defaults to false: such an event [with
// no key] gets ErrNoKey, and nothing runs"; ErrNoKey: "an event its key
// expression finds nothing in"; the package is "the Powertools for AWS
// Lambda idempotency utility's behaviour" (whose multi-field key
// `[userDetail, productId]` finding [null, null] is a missing key). Here
// it is the key "[null,null]": every keyless event shares it, and a
// second, different event is answered with the first's response.
func TestAttackKeylessEventsShareAKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	type event struct {
		ID          string `json:"id"`
		UserDetail  string `json:"userDetail,omitempty"`
		ProductID   string `json:"productId,omitempty"`
		AnotherList []int  `json:"list,omitempty"`
	}
	var runs atomic.Int32
	h, err := idempotency.Handler(r.s, func(_ context.Context, ev event) (string, error) {
		runs.Add(1)
		return "handled " + ev.ID, nil
	}, &idempotency.HandlerOptions[event, string]{KeyPath: "[userDetail, productId]"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		got, err := h(context.Background(), event{ID: id})
		if got != "" && got != "handled "+id {
			t.Errorf("event %s without a key was answered %q (another event's response)", id, got)
		}
		if !errors.Is(err, idempotency.ErrNoKey) {
			t.Errorf("event %s without a key: %q %v; want ErrNoKey", id, got, err)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("events without a key ran the handler %d times, want 0", n)
	}
	// A filter finding nothing is no key either.
	h2, err := idempotency.Handler(r.s, func(_ context.Context, ev event) (string, error) { return "x", nil },
		&idempotency.HandlerOptions[event, string]{KeyPath: "list[?@ > `100`]"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h2(context.Background(), event{ID: "c", AnotherList: []int{1}}); !errors.Is(err, idempotency.ErrNoKey) {
		t.Errorf("a key expression that found nothing ([]): %v; want ErrNoKey", err)
	}
}

// Doc: "Turn the utility off (every call runs its function, nothing is
// read or written) with Options.Disabled or
// NEXJOB_IDEMPOTENCY_DISABLED=true: for unit tests of the function
// itself." A disabled Handler whose key expression fails on a test event
// (a body that is not JSON) does not run the handler.
func TestAttackDisabledHandlerDoesNotRun(t *testing.T) {
	t.Parallel()
	r := newRig(t, &idempotency.Options{Disabled: true})
	var runs atomic.Int32
	h, err := idempotency.Handler(r.s, func(_ context.Context, ev events.APIGatewayProxyRequest) (string, error) {
		runs.Add(1)
		return "ok", nil
	}, &idempotency.HandlerOptions[events.APIGatewayProxyRequest, string]{KeyPath: "powertools_json(body).order_id"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := h(context.Background(), events.APIGatewayProxyRequest{Body: "plain text"})
	if err != nil || got != "ok" || runs.Load() != 1 {
		t.Errorf("disabled handler: %q %v, %d runs; want the handler run", got, err, runs.Load())
	}
	batch, err := idempotency.SQSBatch(r.s, func(context.Context, events.SQSMessage) error { runs.Add(1); return nil },
		&idempotency.BatchOptions[events.SQSMessage]{KeyPath: "powertools_json(body).order_id"})
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := batch(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m1", Body: "plain text"}}})
	if len(resp.BatchItemFailures) != 0 || runs.Load() != 2 {
		t.Errorf("disabled batch: failures %v, %d runs in all; want the message run, no failure", resp.BatchItemFailures, runs.Load())
	}
	if calls := r.counter.Calls(); len(calls) != 0 {
		t.Errorf("requests while disabled: %v", calls)
	}
}

// Doc: "A repeat whose payload ... differs from the first call's gets a
// *PayloadMismatchError while the first call holds the key or while its
// recorded outcome answers repeats; an outcome the policy lets a new call
// replace is replaced whatever the new call's payload." (The first
// version said "whatever the record's state" beside a table that let
// such a call run: the helper's attack found the contradiction; the doc
// now says what the policy decides, and this holds it.)
func TestAttackMismatchAgainstRecordedOutcomes(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	type req struct{ Amount int }
	for _, p := range []ledger.DuplicatePolicy{ledger.AllowAfterFailed, ledger.RejectIfFailed} {
		t.Run(p.String(), func(t *testing.T) {
			s := r.store(t, &idempotency.Options{Policy: &p, RecordErrors: true, Function: "m-" + p.String()})
			fail := charger{err: errors.New("declined")}
			if _, err := idempotency.Do(context.Background(), s, "failed", fail.charge(100), &idempotency.CallOptions{Payload: req{100}}); err == nil {
				t.Fatal("want the function's error")
			}
			var ok charger
			if _, err := idempotency.Do(context.Background(), s, "succeeded", ok.charge(100), &idempotency.CallOptions{Payload: req{100}}); err != nil {
				t.Fatal(err)
			}
			var other charger
			for _, key := range []string{"failed", "succeeded"} {
				_, err := idempotency.Do(context.Background(), s, key, other.charge(999), &idempotency.CallOptions{Payload: req{999}})
				protected := key == "failed" && p == ledger.RejectIfFailed
				if protected != errors.Is(err, idempotency.ErrPayloadMismatch) || !protected && err != nil {
					t.Errorf("%s: a repeat of the %s record with another payload: %v; want a mismatch only when the policy protects the record", p, key, err)
				}
			}
			want := int32(2)
			if p == ledger.RejectIfFailed {
				want = 1
			}
			if n := other.runs.Load(); n != want {
				t.Errorf("%s: the repeats with another payload ran %d times, want %d", p, n, want)
			}
		})
	}
}

// Doc: a result not kept is "recorded as used without a result; a repeat
// is answered as any repeat of a recorded result: under RejectAlways with
// the same error, the function not run again". Under the other two a
// Succeeded record lets a new call take the key, whatever its result
// was: the repeat runs. (The first version promised no run under every
// policy: the helper's attack found it false.)
func TestAttackTooLargeUnderEachPolicy(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	for _, p := range []ledger.DuplicatePolicy{ledger.AllowAfterFailed, ledger.RejectIfFailed, ledger.RejectAlways} {
		s := r.store(t, &idempotency.Options{Policy: &p, MaxResultBytes: 100, Function: "big-" + p.String()})
		var runs atomic.Int32
		big := func(context.Context) (string, error) { runs.Add(1); return strings.Repeat("x", 200), nil }
		if _, err := idempotency.Do(context.Background(), s, "big", big, nil); !errors.Is(err, idempotency.ErrResultTooLarge) {
			t.Fatalf("%s first call: %v", p, err)
		}
		_, err := idempotency.Do(context.Background(), s, "big", big, nil)
		want := int32(2)
		if p == ledger.RejectAlways {
			want = 1
		}
		if !errors.Is(err, idempotency.ErrResultTooLarge) || runs.Load() != want {
			t.Errorf("%s: a repeat: %v, %d runs; want *ResultTooLargeError and %d runs", p, err, runs.Load(), want)
		}
	}
}

// Doc: "While the first call runs, it holds the key until its context's
// deadline (... otherwise Options.Hold from its start): a repeat then gets
// an *InProgressError". Another process whose clock is 15 s ahead takes
// the key 50 s into a one-minute hold, and runs the function beside the
// first call.
func TestAttackSkewedClockTakesAHeldKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	// Both processes allow for 20 s of skew (Options.MaxClockSkew); with
	// the default second, clocks 15 s apart break the hold, as the doc
	// now says.
	skew := &idempotency.Options{MaxClockSkew: 20 * time.Second}
	held := r.store(t, skew)
	ahead := r.skewedStore(t, skew, 15*time.Second)
	var c charger
	first := startBlocked(context.Background(), held, "order-a8", &c)
	r.e.Advance(t, 50*time.Second) // 10 s of the hold left
	_, err := idempotency.Do(context.Background(), ahead, "order-a8", c.charge(100), nil)
	close(first.release)
	if ferr := <-first.done; ferr != nil {
		t.Fatal(ferr)
	}
	if !errors.Is(err, idempotency.ErrInProgress) || c.runs.Load() != 1 {
		t.Fatalf("a repeat from a process 15 s ahead, 10 s before the hold ends: %v, %d runs; want *InProgressError, 1 run", err, c.runs.Load())
	}
}

// Doc: "a write whose reply was lost and that the SDK resent reads as
// the success it was: ... a release is done" and "A release that fails
// is joined to the function's error". A release applied, its reply lost
// and the resends throttled, is reported as a failed release ("stays
// held until ...") joined to the function's error, though the key is
// free.
func TestAttackReleaseLostReplyResendsThrottled(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.ft.Add(faults.Rule{Op: "DynamoDB.DeleteItem", Fault: faults.LostReply})
	r.ft.Add(faults.Rule{Op: "DynamoDB.DeleteItem", Fault: faults.Throttle, Times: faults.Attempts - 1})
	c := charger{err: errors.New("declined")}
	_, err := idempotency.Do(context.Background(), r.s, "order-a9", c.charge(100), nil)
	if r.item(t, r.s.KeyHash("order-a9")) != nil {
		t.Fatal("the release was not applied: the attack did not happen")
	}
	if err == nil || err.Error() != "declined" {
		t.Fatalf("a release applied, its reply lost: %q; want the function's error as it is (the release done)", err)
	}
}

// Options.CacheSize: "its entries end with the record's retention". The
// record's retention is kept in whole seconds (its TTL), the cache's to
// the nanosecond: in the gap, another process runs the key again and
// records a new result, and this process's cache replays the old one.
func TestAttackCacheOutlivesTheRecord(t *testing.T) {
	t.Parallel()
	r := newRig(t, &idempotency.Options{CacheSize: 10, Retention: time.Hour})
	other := r.store(t, &idempotency.Options{Retention: time.Hour})
	var c charger
	// Start half-way through a second: the record's expiry is too.
	now := r.e.Now()
	r.e.Advance(t, time.Second+500*time.Millisecond-now.Sub(now.Truncate(time.Second)))
	first, err := idempotency.Do(context.Background(), r.s, "order-a10", c.charge(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Move the clock to the start of the second the record expires in.
	exp := r.e.Now().Add(time.Hour)
	r.e.Advance(t, exp.Truncate(time.Second).Sub(r.e.Now())+time.Millisecond)
	if !r.e.Now().Before(exp.Add(-200 * time.Millisecond)) {
		t.Fatal("the first call's record expires on a whole second: the setup left no gap to attack")
	}
	second, err := idempotency.Do(context.Background(), other, "order-a10", c.charge(2), nil)
	if err != nil || second.Replayed {
		t.Fatalf("the record's retention is over for the ledger: %+v %v", second, err)
	}
	res, err := idempotency.Do(context.Background(), r.s, "order-a10", c.charge(3), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Value == first.Value {
		t.Fatalf("the cache answered %+v after the record's retention ended (the table now records %+v)", res.Value, second.Value)
	}
}

// Held: eight concurrent calls of one key across two Stores (two
// processes) run the function once; the others are in progress or
// replayed, never a second run.
func TestAttackHeldConcurrentAcrossStores(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	stores := []*idempotency.Store{r.s, r.store(t, nil)}
	var runs atomic.Int32
	gate := make(chan struct{})
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			<-gate
			_, err := idempotency.Do(context.Background(), stores[i%2], "order-h1", func(context.Context) (int, error) { runs.Add(1); return 1, nil }, nil)
			errs <- err
		}()
	}
	close(gate)
	for range 8 {
		if err := <-errs; err != nil && !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("a concurrent call: %v", err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
}

// Held: an SQS batch carrying one message twice runs it once and reports
// no failure; a huge key and a replay into another type run nothing again.
func TestAttackHeldBatchDuplicatesHugeKeyWrongType(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var runs atomic.Int32
	batch, err := idempotency.SQSBatch(r.s, func(context.Context, events.SQSMessage) error { runs.Add(1); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := events.SQSMessage{MessageId: "dup", Body: "x"}
	resp, _ := batch(context.Background(), events.SQSEvent{Records: []events.SQSMessage{m, m}})
	if len(resp.BatchItemFailures) != 0 || runs.Load() != 1 {
		t.Fatalf("duplicates in a batch: %v, %d runs", resp.BatchItemFailures, runs.Load())
	}
	key := strings.Repeat("k", 1<<20)
	var c charger
	for range 2 {
		if _, err := idempotency.Do(context.Background(), r.s, key, c.charge(1), nil); err != nil {
			t.Fatal(err)
		}
	}
	if c.runs.Load() != 1 {
		t.Fatalf("a 1 MB key: %d runs", c.runs.Load())
	}
	_, err = idempotency.Do(context.Background(), r.s, key, func(context.Context) (int, error) { runs.Add(1); return 0, nil }, nil)
	if err == nil || runs.Load() != 1 {
		t.Fatalf("a replay into another type: %v, %d runs; want a decode error, no run", err, runs.Load())
	}
}

// Held: a result write held in flight past the hold, while another call
// takes the key and records, lands on nothing: the late first call gets
// *NotRecordedError (taken over) and the table keeps the second result.
func TestAttackHeldSlowRecordAfterTakeover(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	inFlight, letGo := make(chan struct{}), make(chan struct{})
	r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass, Before: func(*http.Request, []byte) {
		close(inFlight)
		<-letGo
	}})
	var c charger
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r.s, "order-h3", c.charge(1), nil)
		done <- err
	}()
	<-inFlight
	r.e.Advance(t, idempotency.DefaultHold+time.Second)
	second, err := idempotency.Do(context.Background(), r.store(t, nil), "order-h3", c.charge(2), nil)
	if err != nil || second.Replayed {
		t.Fatalf("the takeover: %+v %v", second, err)
	}
	close(letGo)
	if err := <-done; !errors.Is(err, ledger.ErrCallTakenOver) {
		t.Fatalf("the late first call: %v", err)
	}
	again, err := idempotency.Do(context.Background(), r.s, "order-h3", c.charge(3), nil)
	if err != nil || !again.Replayed || again.Value != second.Value {
		t.Fatalf("a repeat: %+v %v, want the second's result", again, err)
	}
}
