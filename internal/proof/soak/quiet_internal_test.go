package soak

import (
	"context"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// TestQuietWaitOutlastsADrainingSystem: the wait for quiet goes on while
// the system moves, and fails only once nothing moved for its limit. Ten
// jobs end one a second under a 5 s limit: quiet after about 10 s. With
// the fixed limit, a system that ended records every second (the soak at
// seed 20261206, its backlog draining on a loaded machine) failed "not
// quiet", each record still in the backlog reported as left waiting.
func TestQuietWaitOutlastsADrainingSystem(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	var ids []string
	for i := range 10 {
		res, err := e.Client.Enqueue(ctx, OK{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	go func() {
		for _, id := range ids {
			time.Sleep(time.Second) // a slow system: one job ends a second
			if _, err := e.Client.Cancel(ctx, id, "drained", time.Hour); err != nil {
				t.Error(err)
			}
		}
	}()
	// The job queue's messages are not waited for: the DLQ stands in for it.
	env := Env{Cfg: e.Cfg, Table: e.Table, QueueURL: e.DLQURL}
	if err := waitQuiet(ctx, env, e.Client.Store(), 5*time.Second, 25*time.Second); err != nil {
		t.Fatalf("a system ending a job a second: %v", err)
	}
}

// TestQuietWaitFailsWhenNothingMoves: a record no one touches fails the
// wait once nothing moved for the limit, however long the wait may last
// in all.
func TestQuietWaitFailsWhenNothingMoves(t *testing.T) {
	w := quietWait{limit: 3 * time.Minute, most: 15 * time.Minute}
	t0 := time.Unix(0, 0)
	for i := range 20 { // a backlog draining for 10 minutes
		if why := w.look(t0.Add(time.Duration(i)*30*time.Second), 100-i, int64(i)); why != "" {
			t.Fatalf("a draining system, look %d: %s", i, why)
		}
	}
	// One record left, untouched.
	for i := 20; i < 26; i++ {
		if why := w.look(t0.Add(time.Duration(i)*30*time.Second), 1, 19); why != "" {
			t.Fatalf("look %d, nothing moved for %s: %s; want the wait to go on for 3m0s", i, time.Duration(i-19)*30*time.Second, why)
		}
	}
	if why := w.look(t0.Add(26*30*time.Second), 1, 19); why != "nothing moved for 3m0s" {
		t.Fatalf("nothing moved for 3m30s: %q, want the wait to fail", why)
	}
}
