package capacity_test

import (
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/internal/proof/capacity"
)

var (
	job = capacity.PerJob{WriteUnits: 3, SQSRequests: 1.2, LogBytes: 460, FarCreates: 2, FarFirings: 1}
	wl  = capacity.Workload{RunSeconds: 0.1, WriteSeconds: 0.015, BatchSize: 10, Concurrency: 10,
		IndexedShare: 0.1, IndexShards: 16, FarShare: 0.01, LogPricePerGB: 0.5}
)

func need(t *testing.T, r capacity.Row, l capacity.Limit) float64 {
	t.Helper()
	for _, d := range r.Demands {
		if d.Limit == l {
			return d.Need
		}
	}
	t.Fatalf("no demand on %s", l.Name)
	return 0
}

// TestAt: each demand follows from the per-job costs and the workload,
// and the limits passed are the ones named, the worst first.
func TestAt(t *testing.T) {
	r := capacity.At(10000, job, wl)
	for _, c := range []struct {
		l    capacity.Limit
		want float64
	}{
		{capacity.TableWrites, 30000},
		{capacity.PartitionWrites, 10000 * 0.1 * 2 / 16},
		{capacity.InFlight, 10000 * 0.115},
		{capacity.ESMBatches, 10000 / 10 * 0.115},
		{capacity.SchedulerCreates, 10000 * 0.01 * 2},
		{capacity.SchedulerInvocations, 10000 * 0.01 * 1},
	} {
		if got := need(t, r, c.l); got < c.want*0.999 || got > c.want*1.001 {
			t.Errorf("%s: need %v, want %v", c.l.Name, got, c.want)
		}
	}
	broken := r.Broken()
	if len(broken) != 1 || broken[0].Limit != capacity.NewTableWrites {
		t.Fatalf("at 10k jobs/s the model breaks %v, want only a new table's warm throughput", broken)
	}
	// Half the goroutines: each batch runs in two rounds, twice as long.
	half := wl
	half.Concurrency = 5
	if got := need(t, capacity.At(10000, job, half), capacity.ESMBatches); got < 229.9 || got > 230.1 {
		t.Errorf("batches at concurrency 5: %v, want 230", got)
	}
	if got := capacity.At(100000, job, wl).Broken()[0].Limit; got != capacity.NewTableWrites {
		t.Errorf("worst at 100k jobs/s: %s", got.Name)
	}
	// A far job's Scheduler figures are the measured ones: two firings
	// each (the guard's check schedule, before issue 27 item 23) put
	// 100k jobs/s past the firings' quota.
	two := job
	two.FarFirings = 2
	if r := capacity.At(100000, two, wl); need(t, r, capacity.SchedulerInvocations) != 2000 {
		t.Errorf("firings at 100k jobs/s, two per far job: %v, want 2,000", need(t, r, capacity.SchedulerInvocations))
	}
	if gb := capacity.At(1000, job, wl).LogGBDay; gb < 39.73 || gb > 39.75 {
		t.Errorf("log GB a day at 1k jobs/s: %v, want 460 B × 86,400,000 = 39.74 GB", gb)
	}
	if usd := capacity.At(1, job, wl).LogUSDPerMillion; usd < 0.2299 || usd > 0.2301 {
		t.Errorf("logs per million jobs: $%v, want 460 MB × $0.50/GB = $0.23", usd)
	}
}

func TestTable(t *testing.T) {
	out := capacity.Table([]float64{1000, 10000}, job, wl)
	for _, want := range []string{"| 1,000 jobs/s | 10,000 jobs/s |", "30,000 (75 %)", "**over**", "| nothing | new table warm throughput |", "- index shard: raise IndexShards. Source: https://"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
