package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// The worker that makes a job Failed holds its hook for Finish.HookLease:
// ClaimHook refuses until then, takes it once after, and refuses when it
// ran. A ClaimHook whose update applied and whose reply was lost (or
// timed out) still reads as taken; a throttle past the retries is an
// error and takes nothing.
func TestClaimHookOnceAndUnderFaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	ft, cfg := e.Faulty()
	s, now := clockedStore(t, dynamodb.NewFromConfig(cfg), e.Table, time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	clock := s.Now
	failed := func() ledger.Record {
		t.Helper()
		rec, _, err := s.Insert(ctx, ledger.Record{Kind: "notice", Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "", ledger.RejectAlways, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rec, err = s.Claim(ctx, rec.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		rec, err = s.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "down", HookPending: true, HookLease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	rec := failed()
	if want := clock().Add(time.Minute).UnixMilli(); !rec.HookPending || rec.HookUntil != want {
		t.Fatalf("Finish wrote mark %v, lease %d; want true, %d", rec.HookPending, rec.HookUntil, want)
	}
	cur, ok, err := s.ClaimHook(ctx, rec, time.Minute)
	if err != nil || ok || !cur.HookPending || cur.HookUntil != rec.HookUntil {
		t.Fatalf("within the holder's lease: ok %v, err %v, found mark %v until %d", ok, err, cur.HookPending, cur.HookUntil)
	}
	now.Add(int64(time.Minute))
	if _, ok, err := s.ClaimHook(ctx, rec, time.Minute); err != nil || !ok {
		t.Fatalf("after the lease: ok %v, err %v", ok, err)
	}
	if _, ok, err := s.ClaimHook(ctx, rec, time.Minute); err != nil || ok {
		t.Fatalf("taken twice: ok %v, err %v", ok, err)
	}
	if err := s.HookDone(ctx, rec); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(2 * time.Minute))
	if cur, ok, err := s.ClaimHook(ctx, rec, time.Minute); err != nil || ok || cur.HookPending {
		t.Fatalf("after HookDone: ok %v, err %v, mark %v", ok, err, cur.HookPending)
	}

	for _, f := range []faults.Fault{faults.LostReply, faults.Timeout} {
		rec := failed()
		now.Add(int64(2 * time.Minute))
		h := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: f})
		if _, ok, err := s.ClaimHook(ctx, rec, time.Minute); err != nil || !ok {
			t.Fatalf("%s: ok %v, err %v; want our own applied claim", f, ok, err)
		}
		if h.Fired() != 1 {
			t.Fatalf("%s: the fault did not fire", f)
		}
		if _, ok, _ := s.ClaimHook(ctx, rec, time.Minute); ok {
			t.Fatalf("%s: taken again after the lost reply", f)
		}
	}
	rec = failed()
	now.Add(int64(2 * time.Minute))
	h := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts})
	if _, ok, err := s.ClaimHook(ctx, rec, time.Minute); err == nil || ok {
		t.Fatalf("a throttle past the retries: ok %v, err %v; want the throttle", ok, err)
	}
	h.Remove()
	if _, ok, err := s.ClaimHook(ctx, rec, time.Minute); err != nil || !ok {
		t.Fatalf("after the throttle: ok %v, err %v; the throttled claim took the hook", ok, err)
	}
}

// ExtendHook moves the holder's lease on, and only the holder's: a lease
// taken over (another value) or a done hook is not extended. Its update
// applied with the reply lost reads as extended (the resend meets its own
// value); a throttle past the retries is an error, and the caller's next
// try, holding both values, extends.
func TestExtendHookUnderFaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	ctx := context.Background()
	ft, cfg := e.Faulty()
	s, _ := clockedStore(t, dynamodb.NewFromConfig(cfg), e.Table, time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	rec, _, err := s.Insert(ctx, ledger.Record{Kind: "notice", Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "", ledger.RejectAlways, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = s.Claim(ctx, rec.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if rec, err = s.Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "down", HookPending: true, HookLease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	until := rec.HookUntil
	if ok, err := s.ExtendHook(ctx, rec.ID, []int64{until + 1}, until+1000); err != nil || ok {
		t.Fatalf("a lease not held: ok %v, err %v; want not extended", ok, err)
	}
	lost := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply})
	if ok, err := s.ExtendHook(ctx, rec.ID, []int64{until}, until+1000); err != nil || !ok || lost.Fired() != 1 {
		t.Fatalf("reply lost: ok %v, err %v, fired %d; want our own extension", ok, err, lost.Fired())
	}
	throttled := ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts})
	if ok, err := s.ExtendHook(ctx, rec.ID, []int64{until + 1000}, until+2000); err == nil || ok {
		t.Fatalf("throttled past the retries: ok %v, err %v; want the throttle", ok, err)
	}
	throttled.Remove()
	if ok, err := s.ExtendHook(ctx, rec.ID, []int64{until + 1000, until + 2000}, until+3000); err != nil || !ok {
		t.Fatalf("after the throttle: ok %v, err %v; want extended", ok, err)
	}
	if got := e.Get(t, rec.ID).HookUntil; got != until+3000 {
		t.Fatalf("lease ends %d, want %d", got, until+3000)
	}
	if err := s.HookDone(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ExtendHook(ctx, rec.ID, []int64{until + 3000}, until+4000); err != nil || ok {
		t.Fatalf("after HookDone: ok %v, err %v; want not extended", ok, err)
	}
}
