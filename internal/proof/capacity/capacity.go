// Package capacity is the capacity model the README prints: what a job
// costs (requests, write units, log bytes, as the tests measure them
// against the emulator) against the limits AWS publishes, at a given job
// rate, and which limit breaks first.
//
// It computes; it measures nothing. Its inputs are a PerJob the caller
// measured and a Workload the caller states; its limits are AWS's
// published defaults (each with the page it comes from), which an
// account can raise. A figure it prints is only as good as those.
package capacity

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// PerJob is what one job of the workload's common path costs, and what
// one far job (Workload.FarShare) costs EventBridge Scheduler.
type PerJob struct {
	WriteUnits  float64 // DynamoDB table write units (enqueue, claim, finish)
	SQSRequests float64 // send, and shares of the batched receive and delete
	LogBytes    float64 // bytes the worker writes to its log (JSON lines and EMF)
	// FarCreates and FarFirings are one far job's CreateSchedule requests
	// (its producer's, and the dispatch guard's that meets the schedule)
	// and its schedules' firings, as measured: a figure assumed here
	// once counted one and one while the guard's check took a second
	// schedule (two and two).
	FarCreates float64
	FarFirings float64
}

// Workload is what the caller assumes about the jobs.
type Workload struct {
	RunSeconds    float64 // a job's own run time
	WriteSeconds  float64 // a job's two ledger writes (claim, finish)
	BatchSize     float64 // the event source's batch (the construct's default 10)
	Concurrency   float64 // runs at once in one invocation (handler.DefaultConcurrency)
	IndexedShare  float64 // jobs that pass through an indexed state (Scheduled, Failed): 2 index writes each
	IndexShards   float64 // the byState index's shards per state
	FarShare      float64 // jobs scheduled beyond 15 minutes: PerJob's FarCreates and FarFirings each
	LogPricePerGB float64 // CloudWatch Logs ingestion, USD per GB (10^9 bytes: the larger count)
}

// Limit is a published default.
type Limit struct {
	Short  string // its name in the table's last row
	Name   string
	Value  float64
	Source string
	Fix    string // what to change when the demand passes it
}

// The limits the model checks, AWS's defaults (us-east-1).
var (
	TableWrites = Limit{"table quota", "on-demand table write units/s (table quota)", 40000,
		"https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/on-demand-capacity-mode-max-throughput.html",
		"ask for a higher table quota"}
	NewTableWrites = Limit{"new table warm throughput", "a new on-demand table's warm write throughput", 4000,
		"https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput-scenarios.html",
		"pre-warm the table (WarmThroughput) a day before; on-demand doubles its previous peak within 30 minutes on its own"}
	PartitionWrites = Limit{"index shard", "write units/s on one partition key value (an index shard)", 1000,
		"https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput-scenarios.html",
		"raise IndexShards"}
	InFlight = Limit{"SQS in flight", "SQS in-flight messages per standard queue", 120000,
		"https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html",
		"shorter runs, or more queues"}
	ESMBatches = Limit{"event source batches", "batches one SQS event source mapping processes at once (standard mode)", 1000,
		"https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html",
		"ProvisionedPollers (provisioned mode), larger BatchSize"}
	AccountConcurrency = Limit{"account concurrency", "Lambda concurrent executions per account and Region", 1000,
		"https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html",
		"ask for a higher concurrency quota; ReservedConcurrency for the worker"}
	SchedulerCreates = Limit{"CreateSchedule rate", "EventBridge Scheduler CreateSchedule requests/s", 5000,
		"https://docs.aws.amazon.com/scheduler/latest/UserGuide/scheduler-quotas.html",
		"ask for a higher quota (a throttled create leaves the job unsent until a retry)"}
	SchedulerInvocations = Limit{"Scheduler invocations", "EventBridge Scheduler invocations/s (firings)", 1000,
		"https://docs.aws.amazon.com/scheduler/latest/UserGuide/scheduler-quotas.html",
		"ask for a higher quota (firings over it are delayed, not lost)"}
)

// Demand is one resource's need at a rate against its limit.
type Demand struct {
	Limit Limit
	Need  float64
}

// Use is Need over the limit: over 1 is past it.
func (d Demand) Use() float64 { return d.Need / d.Limit.Value }

// Row is the model at one rate.
type Row struct {
	Rate             float64 // jobs per second
	Demands          []Demand
	LogGBDay         float64 // CloudWatch Logs ingestion a day
	LogUSDDay        float64
	LogUSDPerMillion float64 // per million jobs
}

// At computes the demands at rate jobs per second.
func At(rate float64, j PerJob, w Workload) Row {
	perBatch := w.BatchSize / math.Min(w.BatchSize, w.Concurrency) // runs in a row within a batch
	batchSeconds := perBatch * (w.RunSeconds + w.WriteSeconds)
	invocations := rate / w.BatchSize * batchSeconds // concurrent, by Little's law
	writes := rate * j.WriteUnits
	shard := rate * w.IndexedShare * 2 / w.IndexShards
	r := Row{Rate: rate, Demands: []Demand{
		{TableWrites, writes},
		{NewTableWrites, writes},
		{PartitionWrites, shard},
		{InFlight, rate * batchSeconds},
		{ESMBatches, invocations},
		{AccountConcurrency, invocations},
		{SchedulerCreates, rate * w.FarShare * j.FarCreates},
		{SchedulerInvocations, rate * w.FarShare * j.FarFirings},
	}}
	r.LogGBDay = rate * j.LogBytes * 86400 / 1e9
	r.LogUSDDay = r.LogGBDay * w.LogPricePerGB
	r.LogUSDPerMillion = j.LogBytes * 1e6 / 1e9 * w.LogPricePerGB
	return r
}

// Broken is the row's demands past their limits, the worst first.
func (r Row) Broken() []Demand {
	var out []Demand
	for _, d := range r.Demands {
		if d.Use() > 1 {
			out = append(out, d)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Use() > out[b].Use() })
	return out
}

// Table is the model at each rate, as Markdown: a column per rate, a row
// per limit (the need and its share of the limit), the log ingestion, and
// the limits passed, the worst first; then each limit's source and what
// to change when it is passed.
func Table(rates []float64, j PerJob, w Workload) string {
	rows := make([]Row, len(rates))
	for i, r := range rates {
		rows[i] = At(r, j, w)
	}
	var b strings.Builder
	b.WriteString("| limit (default) |")
	for _, r := range rows {
		fmt.Fprintf(&b, " %s jobs/s |", num(r.Rate))
	}
	b.WriteString("\n|---|")
	for range rows {
		b.WriteString("---|")
	}
	b.WriteByte('\n')
	for i, d := range rows[0].Demands {
		fmt.Fprintf(&b, "| %s (%s) |", d.Limit.Name, num(d.Limit.Value))
		for _, r := range rows {
			x := r.Demands[i]
			mark := ""
			if x.Use() > 1 {
				mark = " **over**"
			}
			fmt.Fprintf(&b, " %s (%.0f %%)%s |", num(x.Need), 100*x.Use(), mark)
		}
		b.WriteByte('\n')
	}
	b.WriteString("| CloudWatch Logs ingestion |")
	for _, r := range rows {
		fmt.Fprintf(&b, " %s GB, $%s a day |", num(r.LogGBDay), num(r.LogUSDDay))
	}
	b.WriteString("\n| past its limit, worst first |")
	for _, r := range rows {
		var names []string
		for _, d := range r.Broken() {
			names = append(names, d.Limit.Short)
		}
		if len(names) == 0 {
			names = []string{"nothing"}
		}
		fmt.Fprintf(&b, " %s |", strings.Join(names, ", "))
	}
	b.WriteString("\n\n")
	for _, d := range rows[0].Demands {
		fmt.Fprintf(&b, "- %s: %s. Source: %s\n", d.Limit.Short, d.Limit.Fix, d.Limit.Source)
	}
	return b.String()
}

// num prints n with thousands separators, to one decimal below 10.
func num(n float64) string {
	if n < 10 && n != math.Trunc(n) {
		return fmt.Sprintf("%.1f", n)
	}
	s := fmt.Sprintf("%.0f", n)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
