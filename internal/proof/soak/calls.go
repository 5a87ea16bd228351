package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexjob/nexjob-aws/idempotency"
)

// The soak's idempotent calls (package idempotency): callers in two
// "processes" (two Stores, one whose clock runs callSkew ahead, one that
// waits for a call in progress) call a small pool of keys under the
// nemesis, each key with its own payload, now and then with another
// payload; the function sleeps a little, fails one time in ten and logs
// each run.

// callSkew is how far ahead the second process's clock runs: within the
// Stores' MaxClockSkew (a second), so no hold may be taken early.
const callSkew = 300 * time.Millisecond

// callRun is one run of a call's function.
type callRun struct {
	key     string
	payload string
	value   int64
	failed  bool
	start   time.Time
	end     time.Time
}

// callMade is one Do and what it returned.
type callMade struct {
	key       string
	mismatch  bool // made with another payload than the key's
	value     int64
	replayed  bool
	err       error
	ranValue  int64 // the value its own run returned, 0 when it ran none
	start     time.Time
	end       time.Time
	ranFailed bool
}

// callLog is what the callers did.
type callLog struct {
	mu    sync.Mutex
	runs  []callRun
	calls []callMade
}

// callBig is a key's order number: an integer beyond 2^53, where a
// float64 cannot tell it from its neighbours.
func callBig(key string) uint64 {
	n, _ := strconv.Atoi(strings.TrimPrefix(key, "call-"))
	return 12_345_678_901_234_567_000 + uint64(n)*2
}

// callPayload is a key's own payload: raw JSON with a large integer. A
// call sends it as it is or with its keys in the other order (the same
// payload); another payload is the same but for the integer's last digit
// (one more: the same float64).
func callPayload(key string) string { return fmt.Sprintf(`{"order":%d,"key":%q}`, callBig(key), key) }

// runCalls makes n idempotent calls from two Stores over keys keys.
func runCalls(ctx context.Context, stores [2]*idempotency.Store, n, keys int, rng *rand.Rand, log *callLog) {
	var next atomic.Int64
	var recorded sync.Map // key → true once a call returned its run's result
	var wg sync.WaitGroup
	type job struct {
		key      string
		mismatch bool
		reorder  bool // its payload's keys in the other order: the same payload
		store    int
		fail     bool
		nap      time.Duration
	}
	jobs := make(chan job)
	for range 4 {
		wg.Go(func() {
			for j := range jobs {
				payload := callPayload(j.key)
				sent := json.RawMessage(payload)
				switch {
				case j.mismatch:
					payload = fmt.Sprintf(`{"order":%d,"key":%q}`, callBig(j.key)+1, j.key)
					sent = json.RawMessage(payload)
				case j.reorder:
					sent = json.RawMessage(fmt.Sprintf(`{"key":%q,"order":%d}`, j.key, callBig(j.key)))
				}
				var mine int64
				failed := false
				start := time.Now()
				res, err := idempotency.Do(ctx, stores[j.store], j.key, func(context.Context) (int64, error) {
					r := callRun{key: j.key, payload: payload, value: next.Add(1), start: time.Now()}
					time.Sleep(j.nap)
					r.end, r.failed = time.Now(), j.fail
					log.mu.Lock()
					log.runs = append(log.runs, r)
					log.mu.Unlock()
					mine, failed = r.value, j.fail
					if j.fail {
						return 0, errors.New("the call's function failed")
					}
					return r.value, nil
				}, &idempotency.CallOptions{Payload: sent})
				c := callMade{key: j.key, mismatch: j.mismatch, value: res.Value, replayed: res.Replayed, err: err, ranValue: mine, ranFailed: failed, start: start, end: time.Now()}
				if err == nil && !res.Replayed {
					recorded.Store(j.key, true)
				}
				log.mu.Lock()
				log.calls = append(log.calls, c)
				log.mu.Unlock()
			}
		})
	}
	for range n {
		key := fmt.Sprintf("call-%d", rng.IntN(keys))
		_, done := recorded.Load(key)
		jobs <- job{key: key, mismatch: done && rng.IntN(5) == 0, reorder: rng.IntN(2) == 0, store: rng.IntN(2), fail: rng.IntN(10) == 0, nap: time.Duration(rng.IntN(30)) * time.Millisecond}
	}
	close(jobs)
	wg.Wait()
}

// checkCalls holds the idempotent calls' promises over the callers' log:
//   - every repeat returns the value a run of the key recorded: all of a
//     key's replays return one value, a run's that ended well, and once a
//     call returned its own run's result every later replay returns it;
//   - the function runs once per key while its result lives (RejectAlways):
//     no run starts after a call of the key returned its run's result;
//   - runs of one key never overlap (holds outlast the runs and the
//     processes' clocks are within MaxClockSkew);
//   - a call with another payload than the one recorded never runs it.
func checkCalls(_ context.Context, f *facts) []string {
	log := f.calls
	if log == nil {
		return nil
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	runs := map[string][]callRun{}
	for _, r := range log.runs {
		runs[r.key] = append(runs[r.key], r)
	}
	calls := map[string][]callMade{}
	for _, c := range log.calls {
		calls[c.key] = append(calls[c.key], c)
	}
	var bad []string
	for _, key := range slices.Sorted(maps.Keys(calls)) {
		good := map[int64]bool{}
		for _, r := range runs[key] {
			if r.payload != callPayload(key) {
				bad = append(bad, fmt.Sprintf("call key %s: a run with another payload (%q, value %d)", key, r.payload, r.value))
			}
			if !r.failed {
				good[r.value] = true
			}
		}
		rs := runs[key]
		slices.SortFunc(rs, func(a, b callRun) int { return a.start.Compare(b.start) })
		for i := 1; i < len(rs); i++ {
			if rs[i].start.Before(rs[i-1].end) {
				bad = append(bad, fmt.Sprintf("call key %s: runs %d (%s–%s) and %d (%s–%s) overlap", key,
					rs[i-1].value, rs[i-1].start.Format(time.StampMilli), rs[i-1].end.Format(time.StampMilli), rs[i].value, rs[i].start.Format(time.StampMilli), rs[i].end.Format(time.StampMilli)))
			}
		}
		var replayed int64
		var firstOwn *callMade
		for i, c := range calls[key] {
			if c.err == nil && !c.replayed && (firstOwn == nil || c.end.Before(firstOwn.end)) {
				firstOwn = &calls[key][i]
			}
		}
		for _, c := range calls[key] {
			if c.err != nil || !c.replayed {
				continue
			}
			if !good[c.value] {
				bad = append(bad, fmt.Sprintf("call key %s: a replay returned %d, which no run of the key returned", key, c.value))
			}
			if replayed != 0 && c.value != replayed {
				bad = append(bad, fmt.Sprintf("call key %s: replays returned %d and %d", key, replayed, c.value))
			}
			replayed = c.value
			if firstOwn != nil && c.start.After(firstOwn.end) && c.value != firstOwn.value {
				bad = append(bad, fmt.Sprintf("call key %s: a replay after a call returned its run's %d returned %d", key, firstOwn.value, c.value))
			}
		}
		if firstOwn != nil {
			for _, r := range runs[key] {
				if r.start.After(firstOwn.end) {
					bad = append(bad, fmt.Sprintf("call key %s: run %d started at %s, after a call returned its run's result %d at %s (RejectAlways keeps it)",
						key, r.value, r.start.Format(time.StampMilli), firstOwn.value, firstOwn.end.Format(time.StampMilli)))
				}
			}
		}
		for _, c := range calls[key] {
			if c.mismatch && c.ranValue != 0 {
				bad = append(bad, fmt.Sprintf("call key %s: a call with another payload ran (value %d)", key, c.ranValue))
			}
		}
	}
	return bad
}
