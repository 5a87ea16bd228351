//go:build soak

package soak_test

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestSoak is make soak (the soak build tag keeps it out of make test): NEXJOB_SOAK_JOBS jobs (default 10,000) under
// NEXJOB_SOAK_SEED (default: a fresh one, printed).
func TestSoak(t *testing.T) {
	jobs, _ := strconv.Atoi(os.Getenv("NEXJOB_SOAK_JOBS"))
	if jobs <= 0 {
		jobs = 10000
	}
	seed, err := strconv.ParseUint(os.Getenv("NEXJOB_SOAK_SEED"), 10, 64)
	if err != nil || seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d", seed)
	soakOnce(t, seed, jobs)
}
