package handler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Signals and the steps' limits (issue 38 item 5). A run checked its steps
// against what its claim read, so signals landing mid-run took the record
// past the limits; signals for names the job never waits for counted
// against its steps' budget and failed its own next step for good (after
// that step's function ran); a job at its limit could begin a wait no
// signal could complete.

type roomy struct {
	Pad   string `json:"pad,omitempty"`
	Steps int    `json:"steps"` // steps of StepBytes each
	Bytes int    `json:"bytes"`
	Wait  bool   `json:"wait"` // then wait for "go"
}

func (roomy) Kind() string { return "roomy" }

type roomRig struct {
	e         *nexjobtest.Env
	h         *handler.Handler
	mu        sync.Mutex
	calls     map[string]int  // job id + step: its function's calls
	meanwhile func(id string) // after the first step of a job's first run
}

func newRoomRig(t *testing.T) *roomRig {
	t.Helper()
	r := &roomRig{e: nexjobtest.New(t, &nexjobtest.Options{StepsOnRecord: true}), calls: map[string]int{}} // the record's budget
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[roomy](func(ctx context.Context, j *handler.Job[roomy]) error {
		for i := range j.Args.Steps {
			name := fmt.Sprintf("s%d", i)
			if _, err := handler.Step(ctx, name, func(context.Context) (string, error) {
				r.mu.Lock()
				r.calls[j.ID+"/"+name]++
				r.mu.Unlock()
				return strings.Repeat("x", j.Args.Bytes), nil
			}); err != nil {
				return err
			}
			r.mu.Lock()
			f := r.meanwhile
			if i == 0 {
				r.meanwhile = nil
			}
			r.mu.Unlock()
			if f != nil && i == 0 {
				f(j.ID)
			}
		}
		if j.Args.Wait {
			if _, err := handler.WaitForSignal[string](ctx, "go", time.Hour); err != nil {
				return err
			}
		}
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

func (r *roomRig) store(t *testing.T) *ledger.Store {
	st, err := ledger.New(r.e.DB, r.e.Table, nil)
	if err != nil {
		t.Error(err)
	}
	return st
}

func (r *roomRig) enqueue(t *testing.T, a roomy) string {
	t.Helper()
	res, err := r.e.Client.Enqueue(context.Background(), a, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// stepsBytes is the record's steps as DynamoDB keeps them, roughly: names
// and values.
func stepsBytes(rec ledger.Record) int {
	n := 0
	for k, v := range rec.Steps {
		n += len(k) + len(v)
	}
	return n
}

// Two 16 KB signals land mid-run on a job of large args: the record never
// passes its room (args and steps within ledger.MaxArgsBytes), each step
// runs once, and the job succeeds.
func TestSignalsMidRunKeepTheRecordsRoom(t *testing.T) {
	t.Parallel()
	r := newRoomRig(t)
	big := strings.Repeat("a", 300_000)
	payload := `"` + strings.Repeat("p", ledger.MaxStepBytes-2) + `"`
	r.meanwhile = func(id string) {
		for _, name := range []string{"junk-1", "junk-2"} {
			_, err := r.store(t).Signal(context.Background(), id, name, payload)
			var se *ledger.StepError
			if err != nil && !errors.As(err, &se) {
				t.Errorf("signal %s mid-run: %v", name, err)
			}
		}
	}
	id := r.enqueue(t, roomy{Pad: big, Steps: 4, Bytes: 15_000})
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	if size := len(rec.Args) + stepsBytes(rec); size > ledger.MaxArgsBytes {
		t.Errorf("args and steps are %d bytes, over the record's room %d", size, ledger.MaxArgsBytes)
	}
	if rec.State != ledger.Succeeded {
		t.Errorf("the job: %s (%s), want Succeeded", rec.State, rec.LastError)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range 4 {
		if c := r.calls[fmt.Sprintf("%s/s%d", id, i)]; c != 1 {
			t.Errorf("step s%d ran %d times, want once", i, c)
		}
	}
}

// Signals no wait asked for, sent until refused, take none of the job's
// own steps' room: its four steps of 15 KB (60 KB of the 64) all record.
func TestUnsolicitedSignalsCannotStarveAJob(t *testing.T) {
	t.Parallel()
	r := newRoomRig(t)
	id := r.enqueue(t, roomy{Steps: 4, Bytes: 15_000})
	payload := `"` + strings.Repeat("p", ledger.MaxStepBytes-2) + `"`
	accepted := 0
	for i := range 8 {
		if _, err := r.store(t).Signal(context.Background(), id, fmt.Sprintf("junk-%d", i), payload); err == nil {
			accepted++
		} else if se := (*ledger.StepError)(nil); !errors.As(err, &se) {
			t.Fatalf("junk signal %d: %v", i, err)
		}
	}
	if accepted == 0 {
		t.Fatalf("no signal before the wait accepted: they are kept for the wait")
	}
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, id); rec.State != ledger.Succeeded {
		t.Errorf("after %d junk signals of 16 KB: the job %s (%s), want Succeeded", accepted, rec.State, rec.LastError)
	}
}

// A wait reserves its signal's room: a job with 99 steps cannot begin a
// wait no signal could complete; one with room waits and its 16 KB signal
// lands.
func TestAWaitReservesRoomForItsSignal(t *testing.T) {
	t.Parallel()
	r := newRoomRig(t)
	full := r.enqueue(t, roomy{Steps: ledger.MaxSteps - 1, Bytes: 1, Wait: true})
	room := r.enqueue(t, roomy{Steps: 3, Bytes: 15_000, Wait: true})
	r.e.Drain(t, r.h)
	payload := strings.Repeat("p", ledger.MaxStepBytes-2)
	for _, id := range []string{full, room} {
		err := r.e.Client.Signal(context.Background(), id, "go", payload)
		var refused *ledger.SignalRefusedError
		if err != nil && (!errors.As(err, &refused) || !errors.Is(err, ledger.ErrJobEnded)) {
			t.Errorf("the signal to job %s: %v; want it recorded, or the job ended before", id, err)
		}
	}
	r.e.Drain(t, r.h)
	if rec := r.e.Get(t, full); rec.State != ledger.Failed || !strings.Contains(rec.LastError, "steps") {
		t.Errorf("a wait begun with 99 steps: %s (%s); want Failed at once, its wait refused for its signal's room", rec.State, rec.LastError)
	}
	if rec := r.e.Get(t, room); rec.State != ledger.Succeeded {
		t.Errorf("a wait with room for its signal: %s (%s), want Succeeded", rec.State, rec.LastError)
	}
}
