package soak_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nexjob/nexjob-aws/internal/proof/soak"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// TestMain doubles as the soak's worker processes (soak.IsChild).
func TestMain(m *testing.M) {
	if soak.IsChild() {
		soak.ChildMain()
		return
	}
	os.Exit(nexjobtest.Main(m))
}

func soakOnce(t *testing.T, seed uint64, jobs int) soak.Report {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{soak.Bulk}, BlobBucket: true})
	rep, err := soak.Run(context.Background(), soak.Env{Cfg: e.Cfg, Table: e.Table, StepsTable: e.StepsTable, BlobBucket: e.BlobBucket, QueueURL: e.QueueURL, DLQURL: e.DLQURL,
		BulkURL: e.Queues[soak.Bulk], BulkDLQURL: e.QueueDLQs[soak.Bulk]},
		soak.Config{Seed: seed, Jobs: jobs, Dir: logDir(t, seed), Logf: t.Logf})
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	t.Log(rep)
	for _, v := range rep.Violations {
		t.Errorf("seed %d: %s", seed, v)
	}
	if rep.FaultShare() < 0.01 || rep.Kills == 0 {
		t.Errorf("seed %d: the nemesis did too little: %.2f %% of requests faulted, %d kills", seed, 100*rep.FaultShare(), rep.Kills)
	}
	if t.Failed() {
		t.Logf("replay: make soak SEED=%d JOBS=%d", seed, jobs)
	}
	return rep
}

// logDir is where a soak's run logs go: under NEXJOB_SOAK_DIR when set
// (make soak sets it, and they are kept to read after a failure), else a
// test's temporary directory.
func logDir(t *testing.T, seed uint64) string {
	root := os.Getenv("NEXJOB_SOAK_DIR")
	if root == "" {
		return t.TempDir()
	}
	dir := filepath.Join(root, fmt.Sprintf("seed-%d", seed))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Logf("run logs in %s", dir)
	return dir
}

// TestShortSoak: three fixed seeds, a few hundred jobs each, under every
// fault at once; make test runs it.
func TestShortSoak(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { soakOnce(t, seed, 200) })
	}
}
