package handler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// claimRule matches a claim's UpdateItem (the one that sets :lease).
func claimRule(fault faults.Fault, times int) faults.Rule {
	return faults.Rule{Op: "DynamoDB.UpdateItem", Fault: fault, Times: times,
		Match: func(b []byte) bool { return strings.Contains(string(b), `":lease"`) }}
}

// TestClaimOfUnknownOutcomeGivenBack: a claim that DynamoDB applied but
// whose reply and read back both failed (every retry timed out, then the
// read throttled past its retries) leaves the job Processing with an
// attempt spent and no run to follow. The worker gives it back: the job
// is Enqueued again with no attempt spent, the message comes back, and
// its next delivery runs it as attempt 1 (the 10k soak, seed
// 1796529837542061033: a firing's job whose three claims landed after
// their invocations gave up was failed as an orphan, never started).
// Before: "after the lost claim: Processing attempt 1; want Enqueued,
// attempt 0".
// The give-back's own reply lost reads as done (the SDK's resend meets
// its own write).
func TestClaimOfUnknownOutcomeGivenBack(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "give-back reply lost"}[lost], func(t *testing.T) {
			t.Parallel()
			giveBackUnknownClaim(t, lost)
		})
	}
}

func giveBackUnknownClaim(t *testing.T, lostReply bool) {
	r := newRigWith(t, ok, rigConfig{faults: true})
	id := r.enqueue(t, email{To: "patient@example.com"}, nil)
	msgs := r.receive(t, 1)
	claim := r.ft.Add(claimRule(faults.Timeout, faults.Attempts))
	read := r.ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Throttle, Times: faults.Attempts})
	if lostReply {
		back := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply, Match: func(b []byte) bool { return strings.Contains(string(b), " - ") }})
		defer func() {
			if back.Fired() != 1 {
				t.Errorf("the give-back's lost reply fired %d times; want 1", back.Fired())
			}
		}()
	}
	r.deliver(t, msgs, 1)
	if claim.Fired() != faults.Attempts || read.Fired() != faults.Attempts {
		t.Fatalf("faults fired %d and %d times; want the claim lost and its read back refused (%d each)", claim.Fired(), read.Fired(), faults.Attempts)
	}
	rec := r.get(t, id)
	if rec.State != ledger.Enqueued || rec.Attempt != 0 || r.runs(id) != 0 {
		t.Fatalf("after the lost claim: %s attempt %d, %d runs; want Enqueued, attempt 0, no run", rec.State, rec.Attempt, r.runs(id))
	}
	r.e.WantDepth(t, r.e.QueueURL, 1, "the message kept for its next delivery")
	r.deliver(t, msgs, 1)
	r.ranAs(t, id, ledger.Succeeded, 1, "", 1)
}

// TestGiveBackLeavesANewerClaimAlone: the give-back is conditional on the
// lost claim being the job's last write. A claim that was not applied
// (throttled past the retries, the read back failing too) gives nothing
// back when another worker claimed the job meanwhile, and that worker's
// run keeps its attempt and its lease.
func TestGiveBackLeavesANewerClaimAlone(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true})
	id := r.enqueue(t, email{To: "patient@example.com"}, nil)
	other, err := r.prod.Store().Claim(context.Background(), id, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	msgs := r.receive(t, 1)
	r.ft.Add(claimRule(faults.Throttle, faults.Attempts))
	r.ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Throttle, Times: faults.Attempts})
	r.deliver(t, msgs, 1)
	rec := r.get(t, id)
	if rec.State != ledger.Processing || rec.Attempt != 1 || rec.Token != other.Token || rec.LeaseUntil != other.LeaseUntil {
		t.Fatalf("the other worker's claim: %s attempt %d token %d lease %d; want it untouched (Processing, 1, %d, %d)",
			rec.State, rec.Attempt, rec.Token, rec.LeaseUntil, other.Token, other.LeaseUntil)
	}
}
