package soak

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
)

// Nemesis picks the faults of one process's AWS requests from one seeded
// source: on each request, with probability Rate, a lost reply, a timeout
// or a throttle that lasts the SDK's whole retry budget (this request and
// the next faults.Attempts-1 of the same operation). Off, it injects
// nothing (the quiet period).
type Nemesis struct {
	Rate float64

	mu     sync.Mutex
	rng    *rand.Rand
	burst  map[string]int
	off    atomic.Bool
	counts map[string]int // "lost reply", "timeout", "throttle burst", by kind
	seen   int
}

// NewNemesis returns a nemesis drawing from seed.
func NewNemesis(seed uint64, rate float64) *Nemesis {
	return &Nemesis{Rate: rate, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), burst: map[string]int{}, counts: map[string]int{}}
}

// Off stops the faults.
func (n *Nemesis) Off() { n.off.Store(true) }

// Pick is a faults.Transport's Nemesis.
func (n *Nemesis) Pick(op string) faults.Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.off.Load() {
		n.seen++ // the share faulted is of the requests made while faults were on
	}
	if left := n.burst[op]; left > 0 {
		n.burst[op] = left - 1
		n.counts["throttle"]++
		return faults.Throttle
	}
	// Draw on every request, faults on or off, so that the same sequence
	// of requests meets the same choices.
	x := n.rng.Float64()
	if n.off.Load() || x >= n.Rate || strings.HasPrefix(op, "DynamoDBStreams.") {
		return 0
	}
	if x < n.Rate/3 {
		n.counts["lost reply"]++
		return faults.LostReply
	}
	if x < 2*n.Rate/3 {
		n.counts["timeout"]++
		return faults.Timeout
	}
	n.counts["throttle burst"]++
	n.counts["throttle"]++
	n.burst[op] = faults.Attempts - 1
	return faults.Throttle
}

// Counts returns the faults injected by kind and the requests seen while
// the faults were on.
func (n *Nemesis) Counts() (map[string]int, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]int, len(n.counts))
	for k, v := range n.counts {
		out[k] = v
	}
	return out, n.seen
}
