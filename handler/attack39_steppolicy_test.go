package handler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Attacks on a step's own retries (docs/durable-jobs.md "A step's own
// retries"; go doc handler.StepWith, StepOptions).

// tries39 are the record's nexjob:try steps.
func tries39(rec ledger.Record) map[string]string {
	out := map[string]string{}
	for k, v := range rec.Steps {
		if strings.HasPrefix(k, "nexjob:try:") {
			out[k] = v
		}
	}
	return out
}

// stepRig: a job whose one step is StepWith(o) over fn(call, attempt),
// counted; after the step, the run ends (nil) or, with sleepAfter, sleeps
// an hour first.
func stepRig(t *testing.T, o *handler.StepOptions, fn func(ctx context.Context, call, attempt int) (string, error)) (*rig39, *sync.Mutex, *[]int) {
	var mu sync.Mutex
	var attempts []int // the job's attempt at each call
	var r *rig39
	r = newRig39(t, rig39Opts{kopts: &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }},
		work: func(ctx context.Context, j *handler.Job[a39]) error {
			_, err := handler.StepWith(ctx, "charge", o, func(ctx context.Context) (string, error) {
				k := r.call("charge")
				mu.Lock()
				attempts = append(attempts, j.Attempt)
				mu.Unlock()
				return fn(ctx, k, j.Attempt)
			})
			return err
		}})
	return r, &mu, &attempts
}

func drainFor(t *testing.T, r *rig39, id string, rounds int, step time.Duration) ledger.Record {
	for range rounds {
		r.e.Drain(t, r.h)
		if rec := r.e.Get(t, id); rec.State.Terminal() {
			return rec
		}
		r.e.Advance(t, step)
	}
	return r.e.Get(t, id)
}

// "A failing call is retried without failing the run or spending one of
// the job's attempts" in the run (short pauses) and across durable pauses
// (an hour each); "Each failure is recorded on the job before its retry"
// (nexjob:try, text cut to 512 bytes); a duplicate delivery at the wake
// calls nothing twice.
func TestAttack39StepRetriesKeepTheAttempt(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 400) // 800 bytes, cut inside a rune at 512
	for _, c := range []struct {
		name  string
		pause time.Duration
	}{{"in the run", time.Millisecond}, {"durable", time.Hour}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, mu, attempts := stepRig(t, &handler.StepOptions{MaxAttempts: 4, Backoff: func(int) time.Duration { return c.pause }},
				func(ctx context.Context, call, attempt int) (string, error) {
					if call < 4 {
						return "", fmt.Errorf("call %d: %s", call, long)
					}
					return "paid", nil
				})
			id := enqueueOne(t, r.e.Client, a39{}, nil)
			ctx := context.Background()
			for range 5 {
				r.e.Drain(t, r.h)
				if r.e.Get(t, id).State.Terminal() {
					break
				}
				r.e.Advance(t, c.pause+time.Minute)
				for k := range 2 {
					r.deliver(ctx, id, "a39", fmt.Sprint("dup", k))
				}
			}
			rec := r.e.Get(t, id)
			mu.Lock()
			defer mu.Unlock()
			if rec.State != ledger.Succeeded || rec.Attempt != 1 || r.n("charge") != 4 {
				t.Fatalf("promise \"retried without failing the run or spending one of the job's attempts\": job %s at attempt %d (%s), fn called %d times at attempts %v", rec.State, rec.Attempt, rec.LastError, r.n("charge"), *attempts)
			}
			for _, a := range *attempts {
				if a != 1 {
					t.Fatalf("fn called at job attempts %v, want all 1", *attempts)
				}
			}
			tr := tries39(rec)
			if len(tr) != 3 {
				t.Fatalf("promise \"Each failure is recorded on the job before its retry\": %d try records %v", len(tr), tr)
			}
			for k, v := range tr {
				if !utf8.ValidString(v) || len(v) > 512+64 {
					t.Errorf("promise \"its error's text cut to 512 bytes\": %s is %d bytes (valid UTF-8 %v)", k, len(v), utf8.ValidString(v))
				}
			}
		})
	}
}

// "once MaxAttempts are spent fn's last error is the run's, and the job's
// own retry policy decides (its next attempt gives the step its attempts
// again)"; "A Permanent error, one Retryable refuses ... are never
// retried"; a call that outlasts Timeout is a *StepTimeoutError, retried.
func TestAttack39StepRetryPolicyEnds(t *testing.T) {
	t.Parallel()
	t.Run("spent, then the job's next attempt", func(t *testing.T) {
		t.Parallel()
		r, mu, attempts := stepRig(t, &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Hour }},
			func(ctx context.Context, call, attempt int) (string, error) {
				return "", fmt.Errorf("declined %d", call)
			})
		id := enqueueOne(t, r.e.Client, a39{}, &enqueue.Opts{MaxAttempts: 2})
		rec := drainFor(t, r, id, 12, time.Hour+time.Minute)
		mu.Lock()
		defer mu.Unlock()
		want := []int{1, 1, 1, 2, 2, 2}
		if rec.State != ledger.Failed || fmt.Sprint(*attempts) != fmt.Sprint(want) || !strings.Contains(rec.LastError, "declined 6") {
			t.Fatalf("promise \"its next attempt gives the step its attempts again\": job %s (%s), fn called at job attempts %v, want %v", rec.State, rec.LastError, *attempts, want)
		}
	})
	for _, c := range []struct {
		name string
		o    *handler.StepOptions
		err  error
	}{
		{"permanent", &handler.StepOptions{MaxAttempts: 5, Backoff: func(int) time.Duration { return time.Millisecond }}, handler.Permanent(errors.New("declined"))},
		{"not retryable", &handler.StepOptions{MaxAttempts: 5, Backoff: func(int) time.Duration { return time.Millisecond }, Retryable: func(error) bool { return false }}, errors.New("declined")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, _, _ := stepRig(t, c.o, func(ctx context.Context, call, attempt int) (string, error) { return "", c.err })
			id := enqueueOne(t, r.e.Client, a39{}, &enqueue.Opts{MaxAttempts: 1})
			rec := drainFor(t, r, id, 3, time.Minute)
			if r.n("charge") != 1 || rec.State != ledger.Failed || len(tries39(rec)) != 0 {
				t.Fatalf("promise \"A Permanent error, one Retryable refuses ... never retried\": fn called %d times, job %s, tries %v", r.n("charge"), rec.State, tries39(rec))
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var last error
		var r *rig39
		r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
			_, err := handler.StepWith(ctx, "slow", &handler.StepOptions{MaxAttempts: 2, Timeout: 50 * time.Millisecond, Backoff: func(int) time.Duration { return time.Millisecond }},
				func(ctx context.Context) (string, error) {
					r.call("slow")
					<-ctx.Done()
					return "", ctx.Err()
				})
			mu.Lock()
			last = err
			mu.Unlock()
			if err != nil {
				return handler.Permanent(err)
			}
			return nil
		}})
		id := enqueueOne(t, r.e.Client, a39{}, nil)
		rec := drainFor(t, r, id, 3, time.Minute)
		mu.Lock()
		defer mu.Unlock()
		var te *handler.StepTimeoutError
		if r.n("slow") != 2 || !errors.As(last, &te) || rec.State != ledger.Failed {
			t.Fatalf("promise \"Timeout bounds each call of fn ... a *StepTimeoutError (retried as any error)\": fn called %d times, last error %v, job %s", r.n("slow"), last, rec.State)
		}
	})
}

// "A step whose result is recorded is never called again, whatever its
// policy": its record's reply lost (applied, then 500); a replay after a
// sleep; the step renamed (Aliases).
func TestAttack39StepWithRecordedNeverAgain(t *testing.T) {
	t.Parallel()
	var r *rig39
	var mu sync.Mutex
	got := map[string]string{}
	runs := 0
	r = newRig39(t, rig39Opts{work: func(ctx context.Context, j *handler.Job[a39]) error {
		mu.Lock()
		runs++
		run := runs
		mu.Unlock()
		name, o := "charge", &handler.StepOptions{MaxAttempts: 5, Backoff: func(int) time.Duration { return time.Millisecond }}
		if run > 1 {
			name, o.Aliases = "charge-v2", []string{"charge"}
		}
		v, err := handler.StepWith(ctx, name, o, func(ctx context.Context) (string, error) {
			if r.call("charge") == 1 {
				return "", errors.New("busy")
			}
			return fmt.Sprint("paid-", run), nil
		})
		if err != nil {
			return err
		}
		mu.Lock()
		got[fmt.Sprint(run)] = v
		mu.Unlock()
		if run == 1 {
			return handler.Sleep(ctx, "after", time.Hour)
		}
		return nil
	}})
	lost := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.LostReply,
		Match: func(b []byte) bool {
			return strings.Contains(string(b), `charge"`) && strings.Contains(string(b), "paid-1")
		}})
	id := enqueueOne(t, r.e.Client, a39{}, nil)
	rec := drainFor(t, r, id, 3, time.Hour+time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if rec.State != ledger.Succeeded || r.n("charge") != 2 || got["1"] != "paid-1" || got["2"] != "paid-1" {
		t.Fatalf("promise \"A step whose result is recorded is never called again, whatever its policy\" (lost reply fired %d): job %s (%s), fn called %d times, results %v", lost.Fired(), rec.State, rec.LastError, r.n("charge"), got)
	}
	if lost.Fired() != 1 {
		t.Logf("the lost-reply fault fired %d times (the step's record may not be a PutItem matching it)", lost.Fired())
	}
}

// Zero and negative options: MaxAttempts 0 and -2 are one call; a
// negative Backoff and a negative WaitInRun still retry MaxAttempts times
// without spending the job's attempt.
func TestAttack39StepWithBadOptions(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		o     *handler.StepOptions
		calls int
	}{
		{"MaxAttempts 0", &handler.StepOptions{MaxAttempts: 0}, 1},
		{"MaxAttempts -2", &handler.StepOptions{MaxAttempts: -2}, 1},
		{"negative Backoff", &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return -time.Hour }}, 3},
		{"negative WaitInRun", &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Millisecond }, WaitInRun: -time.Second}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, mu, attempts := stepRig(t, c.o, func(ctx context.Context, call, attempt int) (string, error) {
				return "", fmt.Errorf("no %d", call)
			})
			id := enqueueOne(t, r.e.Client, a39{}, &enqueue.Opts{MaxAttempts: 1})
			rec := drainFor(t, r, id, 6, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			if rec.State != ledger.Failed || r.n("charge") != c.calls {
				t.Fatalf("%s: job %s (%s), fn called %d times at attempts %v; want %d calls", c.name, rec.State, rec.LastError, r.n("charge"), *attempts, c.calls)
			}
		})
	}
}

// "a run that dies between two calls resumes the count where it was": the
// run is cut off by its invocation's deadline during fn's second call
// (the run's own end: not a failure, not retried); the next run calls fn
// only until three failures are counted in all.
func TestAttack39StepRetryResumesAfterACutOff(t *testing.T) {
	t.Parallel()
	r, mu, attempts := stepRig(t, &handler.StepOptions{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Millisecond }},
		func(ctx context.Context, call, attempt int) (string, error) {
			if call == 2 {
				<-ctx.Done() // cut off here
				return "", ctx.Err()
			}
			return "", fmt.Errorf("declined %d", call)
		})
	id := enqueueOne(t, r.e.Client, a39{}, &enqueue.Opts{MaxAttempts: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	r.deliver(ctx, id, "a39", "cut")
	cancel()
	cut := r.e.Get(t, id)
	rec := drainFor(t, r, id, 6, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("after the cut-off: %s at attempt %d (%s); at the end %s, fn called at attempts %v", cut.State, cut.Attempt, cut.LastError, rec.State, *attempts)
	first := 0
	for _, a := range *attempts {
		if a == 1 {
			first++
		}
	}
	if first != 4 {
		t.Fatalf("promise \"a run that dies between two calls resumes the count where it was\": fn called %d times at the job's attempt 1 (want 4: one failure, the cut-off call, two failures), attempts %v; tries after the cut-off %v", first, *attempts, tries39(cut))
	}
}
