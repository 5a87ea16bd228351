package ledger

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// newShapeStore is a Store for building expressions: its client is never
// called.
func newShapeStore(t *testing.T, indexAll bool) *Store {
	t.Helper()
	s, err := New(dynamodb.New(dynamodb.Options{Region: "us-east-1"}), "jobs", &Options{IndexAllStates: indexAll})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sameExprs fails t unless got and want carry the same text, names and
// values.
func sameExprs(t *testing.T, what string, got, want exprs) {
	t.Helper()
	str := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return *p
	}
	if str(got.cond) != str(want.cond) || str(got.update) != str(want.update) {
		t.Fatalf("%s: kept text\n%s\n%s\nwant\n%s\n%s", what, str(got.cond), str(got.update), str(want.cond), str(want.update))
	}
	if !reflect.DeepEqual(got.names, want.names) {
		t.Fatalf("%s: kept names %v, want %v", what, got.names, want.names)
	}
	if !reflect.DeepEqual(got.values, want.values) {
		t.Fatalf("%s: values %v, want %v", what, got.values, want.values)
	}
}

// randomFinish is a Finish of state st taking the branches in bits, with
// random values, and the claim's record it ends.
func randomFinish(r *rand.Rand, st State, bits int) (Record, Finish) {
	on := func(i int) bool { return bits&(1<<i) != 0 }
	at := time.UnixMilli(1_700_000_000_000 + r.Int64N(1e9))
	rec := Record{PK: "j#x", ID: fmt.Sprintf("%026d", r.Int64N(1e12)), Attempt: 1 + r.IntN(9), Token: 1 + r.Int64N(99)}
	f := Finish{State: st, Deferred: on(0), CutOff: on(1), HookPending: on(2)}
	if on(3) {
		f.LastError = fmt.Sprint("boom ", r.Int())
	}
	if on(4) {
		f.RunAt = at.Add(time.Minute)
	}
	if on(5) {
		f.HookLease = time.Duration(1+r.IntN(60)) * time.Second
	}
	if on(6) {
		f.ExpiresAt = at.Add(time.Hour)
	}
	if on(7) {
		rec.Defers = 1 + r.IntN(3)
	}
	if on(8) {
		f.Slot = at.Add(time.Second)
	}
	if on(9) {
		rec.Slot = at.UnixMilli()
	}
	if on(10) {
		f.Result = fmt.Sprintf(`{"n":%d}`, r.Int())
	}
	return rec, f
}

// A write whose shape was seen before takes the kept text and names and
// writes only its values: for every claim and every branch of Finish, the
// expressions are the ones a store that never saw the shape writes.
func TestShapesKeepTheText(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, indexAll := range []bool{false, true} {
		warm := newShapeStore(t, indexAll)
		for _, byCheck := range []bool{false, true} {
			for range 3 {
				id, nonce := fmt.Sprintf("%026d", r.Int64N(1e12)), NewNonce()
				now, lease := time.UnixMilli(r.Int64N(2e12)), time.Duration(r.IntN(900))*time.Second
				sameExprs(t, fmt.Sprintf("claim byCheck=%v indexAll=%v", byCheck, indexAll),
					warm.claimExprs(id, lease, byCheck, now, nonce), newShapeStore(t, indexAll).claimExprs(id, lease, byCheck, now, nonce))
			}
		}
		for _, st := range []State{Enqueued, Scheduled, AwaitingContinuation, Succeeded, Failed, Expired} {
			for bits := range 1 << 11 {
				for range 2 {
					rec, f := randomFinish(r, st, bits)
					now, nonce := time.UnixMilli(r.Int64N(2e12)), NewNonce()
					sameExprs(t, fmt.Sprintf("finish %s bits=%011b indexAll=%v", st, bits, indexAll),
						warm.finishExprs(rec, f, now, nonce), newShapeStore(t, indexAll).finishExprs(rec, f, now, nonce))
				}
			}
		}
		if n := len(*warm.finishes.m.Load()); n < 100 {
			t.Fatalf("%d Finish shapes kept: the test did not reach the branches", n)
		}
	}
	var warmPuts shapes[putShape]
	for _, policy := range []DuplicatePolicy{AllowAfterFailed, RejectIfFailed, RejectAlways} {
		for _, request := range []string{"", "r-1", "r-2"} {
			for _, free := range []bool{false, true} {
				for _, at := range []int64{0, r.Int64N(2e12) + 1} {
					states := policy.ReusableStates()
					k := putShape{free: free, ended: len(states), request: request != "" && len(states) > 0}
					k.ordered = k.request && at > 0
					if !free {
						k, states, request, at = putShape{}, nil, "", 0
					}
					now := time.Unix(r.Int64N(2e9), 0)
					sameExprs(t, fmt.Sprintf("put %+v", k), putCond(&warmPuts, k, now, states, request, at), putCond(&shapes[putShape]{}, k, now, states, request, at))
				}
			}
		}
	}
	if n := len(*warmPuts.m.Load()); n < 4 {
		t.Fatalf("%d put shapes kept: the test did not reach the branches", n)
	}
}

// Writes of new and known shapes at once, their values maps given back
// and taken again: each gets its own values (go test -race checks the
// kept shapes are only read, and a map is not shared while in use).
func TestShapesConcurrently(t *testing.T) {
	s := newShapeStore(t, false)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 200 {
				rec, f := randomFinish(r, Failed, r.IntN(1<<10))
				nonce := NewNonce()
				got := s.finishExprs(rec, f, time.UnixMilli(1e12), nonce)
				if v := got.values[":id"]; !reflect.DeepEqual(v, &types.AttributeValueMemberS{Value: rec.ID}) {
					t.Errorf("a write took another's id: %v, want %s", v, rec.ID)
					return
				}
				got.release() // the next write may take the map
			}
		})
	}
	wg.Wait()
}
