package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// A step's, a sleep's and a wait's name is data (issue 38 item 1): names
// such as "user.fetch", "charge[0]" or "x..y" fit the documented 1 to 128
// bytes, and the record's update read them as a path into nested maps,
// so every attempt ran the step's function again and the job failed.

type named struct {
	Names []string `json:"names"`
	Wait  string   `json:"wait"`
}

func (named) Kind() string { return "named" }

// printableNames are step names made of every printable ASCII character,
// each in a name of its own and all together, with the shapes a path
// parser trips on.
func printableNames() []string {
	names := []string{"user.fetch", "stripe.charge", "charge[0]", "approval.v2", "x..y", ".", "[", "]", "[0]", "a[1]b", "%2E", "%", "a%5Bb", "é.ü[ß]", strings.Repeat(".", ledger.MaxStepName)}
	var all strings.Builder
	for c := byte(' '); c <= '~'; c++ {
		names = append(names, "s"+string(c)+"e", string(c))
		all.WriteByte(c)
	}
	names = append(names, all.String())
	slices.Sort(names)
	return slices.Compact(names) // one step of each name: a name twice in a run is ErrStepRepeated
}

func TestStepAndSignalNamesAreData(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("a deployment's secret")}})
	var mu sync.Mutex
	calls := map[string]int{}         // job id + name: the step's function's calls
	tokens := make(chan [2]string, 8) // job id, its token
	got := map[string]string{}        // job id: the wait's payload, or "timed out"
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[named](func(ctx context.Context, j *handler.Job[named]) error {
		for _, n := range j.Args.Names {
			v, err := handler.Step(ctx, n, func(context.Context) (string, error) {
				mu.Lock()
				calls[j.ID+"\x00"+n]++
				mu.Unlock()
				return "v:" + n, nil
			})
			if err != nil {
				return err
			}
			if v != "v:"+n {
				return handler.Permanent(fmt.Errorf("step %q replayed %q", n, v))
			}
		}
		if j.Attempt == 1 {
			return errors.New("the first attempt fails after its steps: the retry replays them")
		}
		if err := handler.Sleep(ctx, "nap."+j.Args.Wait, time.Second); err != nil {
			return err
		}
		tok, err := handler.CallbackToken(ctx, j.Args.Wait)
		if err != nil {
			return err
		}
		a, err := handler.WaitForSignal[approval](ctx, j.Args.Wait, time.Hour)
		var timeout *handler.SignalTimeoutError
		switch {
		case errors.As(err, &timeout):
			a.By = "timed out"
		case err != nil:
			tokens <- [2]string{j.ID, tok}
			return err
		}
		mu.Lock()
		got[j.ID] = a.By
		mu.Unlock()
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()

	names := printableNames()
	// Three jobs, their steps cut to fit MaxSteps, each wait's name one of
	// the worst: one completed by its token, one by Signal, one timing out.
	waits := []string{"approval.v2", "a[0].b", "x..y[]"}
	var ids []string
	for i, w := range waits {
		part := names[i*len(names)/len(waits) : (i+1)*len(names)/len(waits)]
		res, err := e.Client.Enqueue(ctx, named{Names: part, Wait: w}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for range 4 { // the failed first attempt's retry, the sleep: a second each
		e.Drain(t, h)
		e.Advance(t, 2*time.Second)
	}
	e.Drain(t, h)
	for _, id := range ids {
		if rec := e.Get(t, id); rec.State != ledger.Scheduled {
			t.Fatalf("job %s before its signal: %s (%s), want Scheduled in its wait", id, rec.State, rec.LastError)
		}
	}
	first := <-tokens // any job's: that job's wait is completed by its token
	for range len(ids) - 1 {
		<-tokens
	}
	tokID, tok := first[0], first[1]
	if err := e.Client.Complete(ctx, tok, approval{By: "token"}); err != nil {
		t.Fatalf("completing the wait by its token: %v", err)
	}
	var byName string
	for i, id := range ids {
		if id != tokID && byName == "" {
			byName = id
			if err := e.Client.Signal(ctx, id, waits[i], approval{By: "signal"}); err != nil {
				t.Fatalf("signal %q: %v", waits[i], err)
			}
		}
	}
	e.Drain(t, h)
	e.Advance(t, time.Hour+time.Minute)
	e.Drain(t, h)

	want := map[string]string{tokID: "token", byName: "signal"}
	for _, id := range ids {
		if _, ok := want[id]; !ok {
			want[id] = "timed out"
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids {
		rec := e.Get(t, id)
		if rec.State != ledger.Succeeded || got[id] != want[id] {
			t.Errorf("job %d (wait %q): %s (%s), its wait gave %q, want Succeeded with %q", i, waits[i], rec.State, rec.LastError, got[id], want[id])
		}
		part := names[i*len(names)/len(waits) : (i+1)*len(names)/len(waits)]
		for _, n := range part {
			if c := calls[id+"\x00"+n]; c != 1 {
				t.Errorf("job %d's step %q ran %d times, want once", i, n, c)
			}
			if b, _ := json.Marshal("v:" + n); rec.Steps[n] != string(b) {
				t.Errorf("job %d's step %q recorded as %q", i, n, rec.Steps[n])
			}
		}
	}
}
