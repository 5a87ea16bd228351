package handler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// More attacks across Map, children and compensations.

// Helper-9's break, fixed: a compensation declared inside a map item's
// function (after the item's own step returned) was never declared again
// once the item replayed (its fn not called), so a job failing for good in
// a later run refunded nothing. Compensate inside a step's or an item's
// function is now refused (*handler.CompensateInStepError, naming the
// step), and the documented way, one declaration per item after Map
// returned, refunds each item once when the job fails in a later run.
func TestAttack39CompensationDeclaredInAMapItem(t *testing.T) {
	t.Parallel()
	for _, inside := range []bool{true, false} {
		t.Run(fmt.Sprint("inside=", inside), func(t *testing.T) {
			t.Parallel()
			var r *rig39
			var refused error
			r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
				r.call("run")
				_, err := handler.Map(ctx, "lines", []int{0, 1, 2}, func(ctx context.Context, i, _ int) (string, error) {
					if _, err := handler.Step(ctx, fmt.Sprint("charge-", i), func(context.Context) (int, error) {
						r.call("charge %d", i)
						return 1, nil
					}); err != nil {
						return "", err
					}
					if inside {
						err := handler.Compensate(ctx, fmt.Sprint("refund-", i), func(context.Context) error { return nil })
						refused = err
						return "", err
					}
					return "ok", nil
				}, nil)
				if err != nil {
					return err
				}
				for i := range 3 {
					if err := handler.Compensate(ctx, fmt.Sprint("refund-", i), func(context.Context) error {
						r.call("refund %d", i)
						return nil
					}); err != nil {
						return err
					}
				}
				if err := handler.Sleep(ctx, "cool", time.Hour); err != nil {
					return err
				}
				return handler.Permanent(errors.New("booking refused"))
			}})
			id := enqueueOne(t, r.e.Client, a39{}, nil)
			for range 3 {
				r.e.Drain(t, r.h)
				r.e.Advance(t, time.Hour+time.Minute)
			}
			rec := r.e.Get(t, id)
			if inside {
				var in *handler.CompensateInStepError
				if rec.State != ledger.Failed || !errors.As(refused, &in) || in.Step != "lines#0" && in.Step != "lines#1" && in.Step != "lines#2" {
					t.Fatalf("Compensate inside a map item: job %s (%s), Compensate returned %v; want a *CompensateInStepError naming the item", rec.State, rec.LastError, refused)
				}
				return
			}
			if rec.State != ledger.Failed || r.n("run") != 2 {
				t.Fatalf("job %s (%s) after %d runs", rec.State, rec.LastError, r.n("run"))
			}
			for i := range 3 {
				if r.n("charge %d", i) != 1 || r.n("refund %d", i) != 1 {
					t.Errorf("item %d charged %d times, refunded %d times; want once each", i, r.n("charge %d", i), r.n("refund %d", i))
				}
			}
		})
	}
}

// Two runs of one caller at once: its first run's child enqueue held in
// flight while its lease passes and a second delivery takes the run over
// and starts the child; then the first run's enqueue lands. "The child is
// enqueued under a key made of the caller's id and the name": one child.
func TestAttack39InvokeTakeoverOneChild(t *testing.T) {
	t.Parallel()
	r, mu, outs := awaitRig(t, []string{"k"}, []a39Kid{{N: 0}}, 24*time.Hour, nil)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var first []string
	hold := r.ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Pass,
		Match: func(b []byte) bool { return strings.Contains(string(b), "a39-kid") },
		Before: func(*http.Request, []byte) {
			hit := false
			once.Do(func() { hit = true })
			if hit {
				close(held)
				<-release
			}
		}})
	hold2 := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Pass,
		Match: func(b []byte) bool { return strings.Contains(string(b), "a39-kid") },
		Before: func(*http.Request, []byte) {
			hit := false
			once.Do(func() { hit = true })
			if hit {
				close(held)
				<-release
			}
		}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	ctx := context.Background()
	done := make(chan struct{})
	go func() { defer close(done); r.deliver(ctx, id, "a39", "first") }()
	select {
	case <-held:
	case <-done:
		t.Fatalf("the caller's run ended without a child enqueue of the kinds held (%v)", r.ft.Ops())
	}
	r.e.Advance(t, handler.DefaultLease+time.Minute)
	r.deliver(ctx, id, "a39", "second")
	close(release)
	<-done
	for range 3 {
		r.e.Drain(t, r.h)
	}
	kids := 0
	for _, x := range r.e.Scan(t) {
		if x.Kind == "a39-kid" {
			kids++
			first = append(first, x.ID)
		}
	}
	rec := r.e.Get(t, id)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("held %d+%d; caller %s (%s) after %d runs; children %v; reads %v", hold.Fired(), hold2.Fired(), rec.State, rec.LastError, r.n("caller"), first, *outs)
	if kids != 1 || r.n("kid 0") != 1 {
		t.Fatalf("promise \"the child is enqueued once\": %d children, run %d times, with two runs of the caller at once", kids, r.n("kid 0"))
	}
	if rec.State != ledger.Succeeded || len(*outs) == 0 || (*outs)[len(*outs)-1].vals[0] != "kid-0" {
		t.Fatalf("caller %s (%s), reads %v", rec.State, rec.LastError, *outs)
	}
}

// A cancel seen while a map runs, the job having declared a compensation
// before it: "A running job stops at its next step and compensates" —
// once, and the map starts no item after the cancel was seen by the item
// steps that follow.
func TestAttack39CancelDuringAMap(t *testing.T) {
	t.Parallel()
	var r *rig39
	var cancelErr error
	var mu sync.Mutex
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		if _, err := handler.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return err
		}
		if err := handler.Compensate(ctx, "refund", func(context.Context) error {
			r.call("refund")
			return nil
		}); err != nil {
			return err
		}
		_, err := handler.Map(ctx, "lines", make([]int, 40), func(ctx context.Context, i, _ int) (string, error) {
			r.call("item %d", i)
			if i == 3 {
				_, cerr := r.e.Client.Cancel(context.Background(), j.ID, "", 0)
				mu.Lock()
				cancelErr = cerr
				mu.Unlock()
				r.e.Advance(t, 3*time.Second) // past ledger.CancelLook: the next step reads the record
			}
			return "ok", nil
		}, &handler.MapOptions{MaxConcurrency: 1})
		return err
	}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	for range 3 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Minute)
	}
	rec := r.e.Get(t, id)
	called := 0
	for i := range 40 {
		called += r.n("item %d", i)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("Cancel: %v; job %s cancelled=%v (%s); %d items called", cancelErr, rec.State, rec.Cancelled, rec.LastError, called)
	if rec.State != ledger.Failed || !rec.Cancelled || r.n("refund") != 1 {
		t.Fatalf("promise \"A running job stops at its next step and compensates\": job %s cancelled=%v (%s), refunded %d times, %d of 40 items called", rec.State, rec.Cancelled, rec.LastError, r.n("refund"), called)
	}
	if called == 40 {
		t.Errorf("promise \"a cancelled job stops at its next step\": all 40 items ran after the cancel at item 3")
	}
}
