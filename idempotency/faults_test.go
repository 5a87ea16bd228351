package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
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
