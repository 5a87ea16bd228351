package idempotency_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
)

func TestAttackMemoryRaceTwoStores(t *testing.T) {
	t.Parallel()
	b := idempotency.NewMemoryBackend(nil)
	stores := []*idempotency.Store{memStore(t, b, "race", time.Now, nil), memStore(t, b, "race", time.Now, nil)}
	for round := 0; round < 50; round++ {
		var ch idemtest.Charger
		key := fmt.Sprintf("k%d", round)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ {
			wg.Add(1)
			go func(s *idempotency.Store) {
				defer wg.Done()
				<-gate
				_, _ = idempotency.Do(context.Background(), s, key, ch.Charge(1), nil)
			}(stores[i%2])
		}
		close(gate)
		wg.Wait()
		if ch.Runs.Load() != 1 {
			t.Fatalf("PROMISE BROKEN (of racing calls one runs): %s ran %d times", key, ch.Runs.Load())
		}
	}
}
