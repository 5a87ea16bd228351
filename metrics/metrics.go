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
// # Producers outside Lambda
//
// A process whose stdout does not reach CloudWatch Logs records the same
// metrics through OpenTelemetry (Options.MeterProvider: counters named
// "nexjob.<metric>", e.g. nexjob.enqueued, with a "kind" attribute, and a
// histogram nexjob.run.duration in ms) or through its own slog logger
// (Options.Logger: one record per event, message "nexjob metric", with
// metric, kind, value and unit attributes). Setting either turns the EMF
// lines off unless Out is set too.
//
// # How it fails
//
// A write error is dropped: metrics never fail a job. A nil *Recorder
// records nothing.
package metrics

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/nexjob/nexjob-aws/internal/kinds"
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
	// MeterProvider records through OpenTelemetry instead (see "Producers
	// outside Lambda"). Defaults to none.
	MeterProvider metric.MeterProvider
	// Logger records one slog record per event instead. Defaults to none.
	Logger *slog.Logger
}

// Recorder writes EMF lines. It is safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	out      io.Writer
	ns       string
	now      func() time.Time
	log      *slog.Logger
	counters map[string]metric.Float64Counter
	duration metric.Float64Histogram
}

// names lists the metrics in the order an EMF line declares them.
var names = []string{Enqueued, Deduplicated, Rejected, Succeeded, Failed, Retried, Expired, Orphaned, CutOff, RunDuration}

// New returns a Recorder.
func New(opts *Options) *Recorder {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Out == nil && o.MeterProvider == nil && o.Logger == nil {
		o.Out = os.Stdout
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Recorder{out: o.Out, ns: o.Namespace, now: o.Now, log: o.Logger}
	if o.MeterProvider != nil {
		m := o.MeterProvider.Meter("github.com/nexjob/nexjob-aws/metrics")
		r.counters = map[string]metric.Float64Counter{}
		for _, name := range names[:len(names)-1] {
			// The noop and SDK meters never fail for these fixed names.
			c, _ := m.Float64Counter("nexjob."+strings.ToLower(name), metric.WithUnit("{job}"))
			r.counters[name] = c
		}
		r.duration, _ = m.Float64Histogram("nexjob.run.duration", metric.WithUnit("ms"))
	}
	return r
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
	if !kinds.Valid(kind) {
		kind = kinds.Invalid // never a dimension CloudWatch refuses, nor a new one per forged kind
	}
	if r.counters != nil {
		attrs := metric.WithAttributes(attribute.String("kind", kind))
		for name, v := range values {
			if name == RunDuration {
				r.duration.Record(context.Background(), v, attrs)
			} else {
				r.counters[name].Add(context.Background(), v, attrs)
			}
		}
	}
	if r.log != nil {
		for _, name := range names {
			if v, ok := values[name]; ok {
				r.log.Info("nexjob metric", "metric", name, "kind", kind, "job", jobID, "value", v, "unit", units[name])
			}
		}
	}
	if r.out == nil {
		return
	}
	line := map[string]any{"Kind": kind}
	if jobID != "" {
		line["JobId"] = jobID
	}
	d := directive{Namespace: r.ns, Dimensions: [][]string{{"Kind"}, {}}}
	for _, name := range names {
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
