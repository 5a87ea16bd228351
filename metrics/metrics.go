// Package metrics writes nexjob's counters in CloudWatch Embedded Metric
// Format: one JSON line per event on the function's stdout, which Lambda
// ships to CloudWatch Logs and CloudWatch turns into metrics. No API call,
// no extra cost beyond the log bytes.
//
// # Namespace and dimensions
//
// Namespace "NexJob" (Options.Namespace), two dimension sets: Kind, and
// none (the same values summed over every kind, for alarms). The metrics:
//
//	Enqueued, Deduplicated, Rejected     (Count, from producers)
//	Succeeded, Failed, Retried, Expired,
//	Orphaned, CutOff                     (Count, from the worker and DLQ consumer)
//	RunDuration                          (Milliseconds, one per run: the run and the write of its result)
//
// Each line also carries the job id as a property (not a dimension, so it
// costs nothing) for CloudWatch Logs Insights; never args or keys.
//
// # How it fails
//
// A write error is dropped: metrics never fail a job. A nil *Recorder
// records nothing.
package metrics

import (
	"encoding/json"
	"io"
	"os"
	"sync"
	"time"
)

// The metric names.
const (
	Enqueued     = "Enqueued"
	Deduplicated = "Deduplicated"
	Rejected     = "Rejected"
	Succeeded    = "Succeeded"
	Failed       = "Failed"
	Retried      = "Retried"
	Expired      = "Expired"
	Orphaned     = "Orphaned"
	CutOff       = "CutOff"
	RunDuration  = "RunDuration"
)

// DefaultNamespace is the CloudWatch namespace.
const DefaultNamespace = "NexJob"

// Options tune a Recorder. The zero value writes to stdout.
type Options struct {
	// Out receives the lines. Defaults to os.Stdout (Lambda's log stream).
	Out io.Writer
	// Namespace defaults to DefaultNamespace.
	Namespace string
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Recorder writes EMF lines. It is safe for concurrent use.
type Recorder struct {
	mu  sync.Mutex
	out io.Writer
	ns  string
	now func() time.Time
}

// New returns a Recorder.
func New(opts *Options) *Recorder {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Recorder{out: o.Out, ns: o.Namespace, now: o.Now}
}

// Count records one event of the metric for the kind.
func (r *Recorder) Count(metric, kind, jobID string) {
	r.write(kind, jobID, map[string]float64{metric: 1}, map[string]string{metric: "Count"})
}

// Run records a run's outcome (a metric name) and its duration.
func (r *Recorder) Run(outcome, kind, jobID string, took time.Duration) {
	r.write(kind, jobID,
		map[string]float64{outcome: 1, RunDuration: float64(took.Microseconds()) / 1000},
		map[string]string{outcome: "Count", RunDuration: "Milliseconds"})
}

type metricDef struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

type directive struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []metricDef `json:"Metrics"`
}

type meta struct {
	Timestamp         int64       `json:"Timestamp"`
	CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
}

func (r *Recorder) write(kind, jobID string, values map[string]float64, units map[string]string) {
	if r == nil {
		return
	}
	line := map[string]any{"Kind": kind}
	if jobID != "" {
		line["JobId"] = jobID
	}
	d := directive{Namespace: r.ns, Dimensions: [][]string{{"Kind"}, {}}}
	for _, name := range []string{Enqueued, Deduplicated, Rejected, Succeeded, Failed, Retried, Expired, Orphaned, CutOff, RunDuration} {
		if v, ok := values[name]; ok {
			line[name] = v
			d.Metrics = append(d.Metrics, metricDef{Name: name, Unit: units[name]})
		}
	}
	line["_aws"] = meta{Timestamp: r.now().UnixMilli(), CloudWatchMetrics: []directive{d}}
	b, err := json.Marshal(line)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.out.Write(append(b, '\n'))
}
