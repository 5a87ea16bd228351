package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Every write of a call, its reply lost (applied, then 500: the SDK
// resends it) or throttled past the SDK's retries: the function runs once
// per outcome the caller saw, and a repeat's answer follows from it.
func TestEveryWriteUnderFaults(t *testing.T) {
	t.Parallel()
	declined := errors.New("declined")
	type step struct {
		name string
		// rules are added before the first call.
		rules []faults.Rule
		// fail makes the first call's function fail (its key released).
		fail bool
		// check judges the first call's error.
		check func(error) bool
		// held: a repeat right after meets the key in progress, and runs
		// only once the hold ended.
		held bool
		// runsAfter is the function's runs after the first call and a
		// repeat (after the hold, if held).
		runsAfter int32
	}
	ok := func(err error) bool { return err == nil }
	isDeclined := func(err error) bool { return errors.Is(err, declined) }
	steps := []step{
		{name: "hold's reply lost", rules: []faults.Rule{{Op: "DynamoDB.PutItem", Fault: faults.LostReply}}, check: ok, runsAfter: 1},
		{name: "hold's reply lost, resends throttled", rules: []faults.Rule{
			{Op: "DynamoDB.PutItem", Fault: faults.LostReply},
			{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts - 1},
		}, check: ok, runsAfter: 1},
		{name: "hold timed out", rules: []faults.Rule{{Op: "DynamoDB.PutItem", Fault: faults.Timeout}}, check: ok, runsAfter: 1},
		{name: "hold throttled", rules: []faults.Rule{{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts}},
			check: func(err error) bool { return err != nil && !errors.Is(err, idempotency.ErrNotRecorded) }, runsAfter: 1},
		{name: "result's reply lost", rules: []faults.Rule{{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply}}, check: ok, runsAfter: 1},
		{name: "result throttled", rules: []faults.Rule{{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts}},
			check: func(err error) bool { return errors.Is(err, idempotency.ErrNotRecorded) }, held: true, runsAfter: 2},
		{name: "release's reply lost", rules: []faults.Rule{{Op: "DynamoDB.DeleteItem", Fault: faults.LostReply}}, fail: true, check: isDeclined, runsAfter: 2},
		{name: "release throttled", rules: []faults.Rule{{Op: "DynamoDB.DeleteItem", Fault: faults.Throttle, Times: faults.Attempts}}, fail: true,
			check: isDeclined, held: true, runsAfter: 2},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			c := charger{}
			if st.fail {
				c.err = declined
			}
			var handles []faults.Handle
			for _, rule := range st.rules {
				handles = append(handles, r.ft.Add(rule))
			}
			first, err := idempotency.Do(context.Background(), r.s, "order", c.charge(100), nil)
			if !st.check(err) {
				t.Fatalf("first call: %+v %v", first, err)
			}
			for i, h := range handles {
				if h.Fired() == 0 {
					t.Fatalf("rule %d never fired: the fault was not exercised", i)
				}
			}
			c.err = nil
			ranFirst := c.runs.Load()
			if errors.Is(err, idempotency.ErrNotRecorded) && first.Value.Amount != 100 {
				t.Errorf("a run whose result was not recorded returned %+v, want its value", first.Value)
			}
			if st.held {
				if _, err := idempotency.Do(context.Background(), r.s, "order", c.charge(100), nil); !errors.Is(err, idempotency.ErrInProgress) {
					t.Fatalf("a repeat within the hold: %v, want in progress", err)
				}
				r.e.Advance(t, idempotency.DefaultHold+time.Second)
			}
			res, err := idempotency.Do(context.Background(), r.s, "order", c.charge(100), nil)
			if err != nil || c.runs.Load() != st.runsAfter {
				t.Fatalf("the repeat: %+v %v; %d runs (first call %d), want %d", res, err, c.runs.Load(), ranFirst, st.runsAfter)
			}
			if wantReplay := st.runsAfter == ranFirst; res.Replayed != wantReplay {
				t.Fatalf("the repeat replayed=%v, want %v", res.Replayed, wantReplay)
			}
			if res.Replayed && res.Value != first.Value {
				t.Fatalf("replayed %+v, the first call returned %+v", res.Value, first.Value)
			}
		})
	}
}

// A first call's result write applied with its reply lost (forwarded,
// then 500: the SDK resends it) while, before the resend, other calls the
// policy lets in replace the recorded result twice, or take it and release
// it (their function failed): the resend meets a record that is not the
// first call's, though its hold never ran out and its result was
// recorded. The first caller gets its result as recorded (no
// *NotRecordedError). Once its hold has ended, the same meeting cannot
// be told from a takeover after the hold: the *NotRecordedError says
// both.
func TestRecordedResultReplacedBeforeItsResend(t *testing.T) {
	t.Parallel()
	allow := ledger.AllowAfterFailed
	replaceTwice := func(t *testing.T, other *idempotency.Store) {
		var c charger
		for range 2 {
			if res, err := idempotency.Do(context.Background(), other, "order", c.charge(200), nil); err != nil || res.Replayed {
				t.Fatalf("a later call under AllowAfterFailed: %+v %v; want it run", res, err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		// later runs the other calls while the first call's resend waits.
		later func(t *testing.T, other *idempotency.Store)
		// afterHold: the first call's hold has ended by the resend.
		afterHold bool
		// left: a record is left afterwards.
		left bool
	}{
		{"two takeovers", replaceTwice, false, true},
		{"a takeover released", func(t *testing.T, other *idempotency.Store) {
			failing := charger{err: errors.New("declined")}
			if _, err := idempotency.Do(context.Background(), other, "order", failing.charge(200), nil); err == nil || err.Error() != "declined" {
				t.Fatalf("a later call that fails: %v; want its error, the key released", err)
			}
		}, false, false},
		{"two takeovers, the hold over", replaceTwice, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := &idempotency.Options{Policy: &allow}
			r := newRig(t, o)
			other := r.store(t, o)
			applied, resend := make(chan struct{}), make(chan struct{})
			h := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, After: func() {
				close(applied)
				<-resend
			}})
			var c charger
			type outcome struct {
				res idempotency.Result[receipt]
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := idempotency.Do(context.Background(), r.s, "order", c.charge(100), nil)
				done <- outcome{res, err}
			}()
			<-applied // the first call's result is recorded; its reply is lost, the resend not sent yet
			tc.later(t, other)
			if tc.afterHold {
				r.e.Advance(t, idempotency.DefaultHold+time.Second)
			}
			close(resend)
			got := <-done
			if h.Fired() != 1 {
				t.Fatalf("the lost reply fired %d times", h.Fired())
			}
			if got.res.Value != (receipt{"ch_1", 100}) {
				t.Fatalf("the first call returned %+v, want its own result", got.res.Value)
			}
			if tc.afterHold {
				var nr *idempotency.NotRecordedError
				if !errors.As(got.err, &nr) || !errors.Is(got.err, ledger.ErrCallTakenOver) ||
					!strings.Contains(got.err.Error(), "either another call took the key and this outcome was not recorded, or this outcome was recorded (its reply lost) and later calls replaced or released it") {
					t.Fatalf("the first call, met after its hold: %v; want a *NotRecordedError saying both", got.err)
				}
			} else if got.err != nil {
				t.Fatalf("the first call, its result recorded before the others came: %+v %v; want its result, no error", got.res, got.err)
			}
			if left := r.item(t, got.res.KeyHash) != nil; left != tc.left {
				t.Fatalf("a record left: %v, want %v", left, tc.left)
			}
		})
	}
}
