package handler_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Long waits (issue 38 item 4): a wait longer than the longest schedule
// was cut short on the record but not in its step, so its signal woke no
// one; a wait "for ever" (math.MaxInt64) refused every signal as too late,
// its end compared with now as a string. Now a sleep or a wait longer
// than handler.MaxWait is refused when the run meets it, and one within
// it (a year) is woken by its signal.

type longWait struct {
	Sleep time.Duration `json:"sleep"`
	Wait  time.Duration `json:"wait"`
}

func (longWait) Kind() string { return "long-wait" }

func TestWaitsLongerThanTheLongestScheduleAreRefused(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var mu sync.Mutex
	got := map[string]string{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[longWait](func(ctx context.Context, j *handler.Job[longWait]) error {
		if j.Args.Sleep != 0 {
			if err := handler.Sleep(ctx, "nap", j.Args.Sleep); err != nil {
				return err
			}
		}
		a, err := handler.WaitForSignal[approval](ctx, "approval", j.Args.Wait)
		if err != nil {
			return err
		}
		mu.Lock()
		got[j.ID] = a.By
		mu.Unlock()
		return nil
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	enq := func(a longWait) string { return enqueueOne(t, e.Client, a, nil) }
	year := enq(longWait{Wait: 365 * 24 * time.Hour})
	twoYears := enq(longWait{Wait: 2 * 365 * 24 * time.Hour})
	forever := enq(longWait{Wait: math.MaxInt64})
	longSleep := enq(longWait{Sleep: 400 * 24 * time.Hour, Wait: time.Hour})
	// Its signal sent before the run meets the wait: refused all the same
	// (the soak, seed 20261206: a two-year wait whose signal came first
	// returned it and Succeeded, "its wait recorded false").
	signalledFirst := enq(longWait{Wait: 2 * 365 * 24 * time.Hour})
	if err := e.Client.Signal(ctx, signalledFirst, "approval", approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	for _, id := range []string{year, twoYears, forever} {
		err := e.Client.Signal(ctx, id, "approval", approval{By: "ada"})
		var refused *ledger.SignalRefusedError
		if err != nil && (!errors.As(err, &refused) || !errors.Is(err, ledger.ErrJobEnded)) {
			t.Errorf("signal to job %s: %v", id, err)
		}
	}
	e.Drain(t, h)
	mu.Lock()
	defer mu.Unlock()
	if rec := e.Get(t, year); rec.State != ledger.Succeeded || got[year] != "ada" {
		t.Errorf("a wait of a year, signalled: %s (%s), got %q; want Succeeded with the signal", rec.State, rec.LastError, got[year])
	}
	for name, id := range map[string]string{"a wait of two years": twoYears, "a wait for ever": forever, "a sleep of 400 days": longSleep, "a wait of two years signalled first": signalledFirst} {
		rec := e.Get(t, id)
		if rec.State != ledger.Failed || rec.Attempt != 1 || !strings.Contains(rec.LastError, "longer than the longest") {
			t.Errorf("%s: %s, attempt %d (%s); want Failed at its first attempt, refused as longer than handler.MaxWait", name, rec.State, rec.Attempt, rec.LastError)
		}
		for step := range rec.Steps {
			if strings.HasPrefix(step, "nexjob:wait:") || step == "nap" {
				t.Errorf("%s: its end recorded (%q), want nothing recorded", name, step)
			}
		}
	}
}
