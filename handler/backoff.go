package handler

import (
	"math/rand/v2"
	"time"
)

// DefaultBackoff is NexJob's polynomial backoff with jitter:
// attempt⁴ + 15 + rand(30)·(attempt+1) seconds (17 s, 31 s, 1m36 s, … about
// 2 h 47 m before the 10th attempt).
func DefaultBackoff(attempt int) time.Duration {
	a := max(attempt, 1)
	secs := a*a*a*a + 15 + rand.IntN(30)*(a+1)
	return time.Duration(secs) * time.Second
}
