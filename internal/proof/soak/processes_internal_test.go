package soak

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// TestWorkerProcessesQuietWhenTheFaultsStop: once the killer stops (the
// soak's quiet period), its worker processes fault no more, as the
// in-process workers do not. A process under faults on every request
// runs a job enqueued after the stop. Their nemeses were never turned
// off: the quiet had faults in every process the soak killed.
func TestWorkerProcessesQuietWhenTheFaultsStop(t *testing.T) {
	e := nexjobtest.New(t, nil)
	c := Config{Children: 1, FaultRate: 1, KillEvery: time.Hour, Dir: t.TempDir()}
	c.defaults()
	k := newKiller(c, Env{Cfg: e.Cfg, Table: e.Table, QueueURL: e.QueueURL}, rand.New(rand.NewPCG(1, 2)), &Report{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); k.run(ctx) }()
	defer func() { cancel(); <-done; k.wait() }()
	k.stop()
	for end := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if acks, _ := filepath.Glob(filepath.Join(c.Dir, "quiet.*")); len(acks) > 0 {
			break // the process has turned its faults off
		}
		if time.Now().After(end) {
			t.Fatal("the worker process did not turn its faults off a minute after the killer stopped")
		}
	}
	res, err := e.Client.Enqueue(ctx, OK{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var rec ledger.Record
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if rec, err = e.Client.Store().Get(ctx, res.ID); err != nil {
			t.Fatal(err)
		}
		if rec.State == ledger.Succeeded {
			return
		}
	}
	t.Fatalf("a job enqueued after the faults stopped: %s after a minute, want Succeeded (run by the worker process)", rec.State)
}
