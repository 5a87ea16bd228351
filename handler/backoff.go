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

// FloorBackoff is DefaultBackoff without its jitter, its lower bound:
// attempt⁴ + 15 seconds (16 s, 31 s, 1m36 s, …). The test kit's handlers
// retry with it (nexjobtest: a test's outcome must not hang on a draw).
func FloorBackoff(attempt int) time.Duration {
	a := max(attempt, 1)
	return time.Duration(a*a*a*a+15) * time.Second
}
