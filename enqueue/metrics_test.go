package enqueue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/metrics"
)

// TestProducerMetricsOutsideLambda (issue 11): a producer whose stdout
// reaches no CloudWatch records the same counts through OpenTelemetry or
// its own slog logger: one new job, then its duplicate.
func TestProducerMetricsOutsideLambda(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var logged bytes.Buffer
	rec := metrics.New(&metrics.Options{MeterProvider: mp, Logger: slog.New(slog.NewJSONHandler(&logged, nil))})
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog, Metrics: rec})
	ctx := context.Background()
	first, err := c.Enqueue(ctx, payment{OrderID: "m-1", Cents: 1}, &enqueue.Opts{IdempotencyKey: "metrics-key"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, payment{OrderID: "m-1", Cents: 1}, &enqueue.Opts{IdempotencyKey: "metrics-key"}); err != nil {
		t.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[float64])
			if !ok {
				t.Fatalf("%s is %T, want a sum", m.Name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				if k, _ := dp.Attributes.Value("kind"); k.AsString() != "payment" {
					t.Fatalf("%s carries kind %q", m.Name, k.AsString())
				}
				got[m.Name] += dp.Value
			}
		}
	}
	if got["nexjob.enqueued"] != 1 || got["nexjob.deduplicated"] != 1 {
		t.Fatalf("OpenTelemetry counts %v; want nexjob.enqueued 1, nexjob.deduplicated 1", got)
	}

	counts := map[string]int{}
	for _, line := range bytes.Split(bytes.TrimSpace(logged.Bytes()), []byte("\n")) {
		var r struct{ Msg, Metric, Kind, Job string }
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r.Msg != "nexjob metric" || r.Kind != "payment" {
			t.Fatalf("log line %s", line)
		}
		if r.Metric == metrics.Enqueued && r.Job != first.ID {
			t.Fatalf("Enqueued logged for job %q, want %s", r.Job, first.ID)
		}
		counts[r.Metric]++
	}
	if counts[metrics.Enqueued] != 1 || counts[metrics.Deduplicated] != 1 {
		t.Fatalf("slog metric records %v; want Enqueued 1, Deduplicated 1", counts)
	}
	if bytes.Contains(logged.Bytes(), []byte("metrics-key")) || bytes.Contains(logged.Bytes(), []byte("m-1")) {
		t.Fatalf("the key or args leaked into the metric records: %s", logged.Bytes())
	}
}
