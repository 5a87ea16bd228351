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
//	Orphaned, CutOff, Deferred           (Count, from the worker and DLQ consumer;
//	                                      Deferred: a claim flow control sent back)
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
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/nexjob/nexjob-aws/internal/jsonq"
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
	Deferred     = "Deferred"
	RunDuration  = "RunDuration"

	// Idempotent calls (package idempotency), by Function: a first call
	// run, a repeat answered with its recorded outcome, a repeat refused
	// while the first runs, a key re-used with a different payload, an
	// event with no key run without idempotency (RunWithoutKey).
	CallRun        = "CallRun"
	CallReplayed   = "CallReplayed"
	CallInProgress = "CallInProgress"
	CallMismatch   = "CallMismatch"
	CallWithoutKey = "CallWithoutKey"
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
	nsJSON   []byte // ns as a JSON string
	now      func() time.Time
	log      *slog.Logger
	counters map[string]metric.Float64Counter
	duration metric.Float64Histogram
}

// names lists the metrics in the order an EMF line declares them.
var names = []string{Enqueued, Deduplicated, Rejected, Succeeded, Failed, Retried, Expired, Orphaned, CutOff, Deferred, CallRun, CallReplayed, CallInProgress, CallMismatch, CallWithoutKey, RunDuration}

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
	ns, _ := json.Marshal(o.Namespace) // a string always marshals
	r := &Recorder{out: o.Out, nsJSON: ns, now: o.Now, log: o.Logger}
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
	r.write(byKind, kind, jobID, []point{{metric, 1, "Count"}})
}

// Run records a run's outcome (a metric name) and its duration.
func (r *Recorder) Run(outcome, kind, jobID string, took time.Duration) {
	r.write(byKind, kind, jobID, []point{{outcome, 1, "Count"}, {RunDuration, float64(took.Microseconds()) / 1000, "Milliseconds"}})
}

// Call records one event of an idempotent call's metric (CallRun …) for
// the function, under the dimension Function (and none), with the key's
// hash as a property (never the key).
func (r *Recorder) Call(metric, function, keyHash string) {
	r.write(byFunction, function, keyHash, []point{{metric, 1, "Count"}})
}

// A line's dimension and the property beside it, as EMF names them and
// as slog and OpenTelemetry attributes.
type dimension struct{ name, property, attr, propAttr string }

var (
	byKind     = dimension{"Kind", "JobId", "kind", "job"}
	byFunction = dimension{"Function", "KeyHash", "function", "key_hash"}
)

// point is one metric's value in a line, in the order names lists.
type point struct {
	name  string
	value float64
	unit  string
}

var lines = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (r *Recorder) write(dim dimension, kind, jobID string, points []point) {
	if r == nil {
		return
	}
	if !kinds.Valid(kind) {
		kind = kinds.Invalid // never a dimension CloudWatch refuses, nor a new one per forged kind
	}
	if r.counters != nil {
		attrs := metric.WithAttributes(attribute.String(dim.attr, kind))
		for _, p := range points {
			if p.name == RunDuration {
				r.duration.Record(context.Background(), p.value, attrs)
			} else {
				r.counters[p.name].Add(context.Background(), p.value, attrs)
			}
		}
	}
	if r.log != nil {
		for _, p := range points {
			r.log.Info("nexjob metric", "metric", p.name, dim.attr, kind, dim.propAttr, jobID, "value", p.value, "unit", p.unit)
		}
	}
	if r.out == nil {
		return
	}
	// The EMF line, written by hand (json.Marshal of a map was most of a
	// run's metric cost): the kind follows the kinds rule and the names and
	// units are ours, so only the job id and the namespace are quoted.
	bp := lines.Get().(*[]byte)
	b := (*bp)[:0]
	b = append(b, `{"`...)
	b = append(b, dim.name...)
	b = append(b, `":"`...)
	b = append(b, kind...)
	b = append(b, '"')
	if jobID != "" {
		b = append(b, `,"`...)
		b = append(b, dim.property...)
		b = append(b, `":`...)
		b = jsonq.Append(b, jobID)
	}
	for _, p := range points {
		b = append(b, ',', '"')
		b = append(b, p.name...)
		b = append(b, '"', ':')
		b = strconv.AppendFloat(b, p.value, 'f', -1, 64)
	}
	b = append(b, `,"_aws":{"Timestamp":`...)
	b = strconv.AppendInt(b, r.now().UnixMilli(), 10)
	b = append(b, `,"CloudWatchMetrics":[{"Namespace":`...)
	b = append(b, r.nsJSON...)
	b = append(b, `,"Dimensions":[["`...)
	b = append(b, dim.name...)
	b = append(b, `"],[]],"Metrics":[`...)
	for i, p := range points {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"Name":"`...)
		b = append(b, p.name...)
		b = append(b, `","Unit":"`...)
		b = append(b, p.unit...)
		b = append(b, `"}`...)
	}
	b = append(b, "]}]}}\n"...)
	r.mu.Lock()
	_, _ = r.out.Write(b)
	r.mu.Unlock()
	*bp = b
	lines.Put(bp)
}
