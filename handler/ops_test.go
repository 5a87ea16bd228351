package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
	"go.opentelemetry.io/contrib/propagators/aws/xray"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// syncBuffer is a buffer the handler's goroutines write to.
type syncBuffer = awstest.Buffer

// emf decodes EMF lines, checking each is what CloudWatch accepts: the
// directive names the namespace, the Kind dimension and the all-kinds set, and every metric
// it declares is a number at the top level. It returns metric name →
// count of lines carrying it, per kind.
func emf(t *testing.T, out string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		aws, _ := m["_aws"].(map[string]any)
		dirs, _ := aws["CloudWatchMetrics"].([]any)
		if aws["Timestamp"] == nil || len(dirs) != 1 {
			t.Fatalf("no EMF metadata: %q", line)
		}
		d := dirs[0].(map[string]any)
		if d["Namespace"] != metrics.DefaultNamespace || len(d["Dimensions"].([]any)) != 2 || len(d["Dimensions"].([]any)[1].([]any)) != 0 || d["Dimensions"].([]any)[0].([]any)[0] != "Kind" {
			t.Fatalf("directive: %q", line)
		}
		kind, _ := m["Kind"].(string)
		for _, md := range d["Metrics"].([]any) {
			name := md.(map[string]any)["Name"].(string)
			if _, ok := m[name].(float64); !ok {
				t.Fatalf("metric %s declared but not a number: %q", name, line)
			}
			got[kind+"."+name]++
		}
		if strings.Contains(line, "ops@example.com") || strings.Contains(line, "ops-1") {
			t.Fatalf("a metric line carries args or a key: %q", line)
		}
	}
	return got
}

// TestMetricsAndJobLogger: one job that fails once then succeeds, a
// duplicate and a rejection, recorded as EMF lines; the worker's logger
// carries the job's id, kind and attempt, never its args.
func TestMetricsAndJobLogger(t *testing.T) {
	t.Parallel()
	var emfOut, logs syncBuffer
	rec := metrics.New(&metrics.Options{Out: &emfOut})
	r := newRig(t, func(ctx context.Context, j *handler.Job[email]) error {
		handler.Logger(ctx).InfoContext(ctx, "sending")
		if j.Attempt == 1 {
			return errors.New("smtp 451")
		}
		return nil
	}, &handler.Options{Metrics: rec, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	prod, err := enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Metrics: rec, Ledger: ledger.Options{Now: r.clock.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opts := &enqueue.Opts{IdempotencyKey: "ops-1", DuplicatePolicy: enqueue.RejectAlways}
	res, err := prod.Enqueue(ctx, email{To: "ops@example.com"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prod.Enqueue(ctx, email{To: "ops@example.com"}, opts); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	var dup *enqueue.DuplicateJobError
	if _, err := prod.Enqueue(ctx, email{To: "ops@example.com"}, opts); !errors.As(err, &dup) {
		t.Fatalf("want a rejection, got %v", err)
	}
	got := emf(t, emfOut.String())
	want := map[string]int{"email.Enqueued": 1, "email.Deduplicated": 1, "email.Retried": 1, "email.Succeeded": 1, "email.RunDuration": 2, "email.Rejected": 1}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d lines, want %d (all: %v)", k, got[k], n, got)
		}
	}
	t.Logf("EMF lines of one job:\n%s", emfOut.String())
	var sending int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		_ = json.Unmarshal([]byte(line), &m)
		if m["msg"] == "sending" {
			sending++
			if m["job_id"] != res.ID || m["kind"] != "email" || m["attempt"] != float64(sending) {
				t.Errorf("job logger line: %s", line)
			}
		}
		if strings.Contains(line, "ops@example.com") || strings.Contains(line, "ops-1") {
			t.Errorf("a log line carries args or a key: %s", line)
		}
	}
	if sending != 2 {
		t.Fatalf("%d lines from the job's logger, want 2", sending)
	}
}

// TestTraceFromProducerToWorker: with tracing on, a run's span is the
// child of the enqueue's span (the W3C traceparent rode in the SQS
// message), and a retry's run the child of the failed run.
func TestTraceFromProducerToWorker(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	r := newRig(t, func(_ context.Context, j *handler.Job[email]) error {
		if j.Attempt == 1 {
			return errors.New("try again")
		}
		return nil
	}, &handler.Options{TracerProvider: tp})
	prod, err := enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{TracerProvider: tp, Ledger: ledger.Options{Now: r.clock.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prod.Enqueue(context.Background(), email{To: "traced@example.com"}, nil); err != nil {
		t.Fatal(err)
	}
	r.drain(t)
	var enq sdktrace.ReadOnlySpan
	var runs []sdktrace.ReadOnlySpan
	queue := r.e.QueueURL[strings.LastIndex(r.e.QueueURL, "/")+1:]
	for _, s := range sr.Ended() {
		switch s.Name() {
		case "send " + queue:
			enq = s
		case "process " + queue:
			runs = append(runs, s)
		}
	}
	if enq == nil || len(runs) != 2 {
		t.Fatalf("spans: enqueue %v, %d runs", enq != nil, len(runs))
	}
	if enq.SpanKind() != trace.SpanKindProducer || runs[0].SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("kinds %s %s", enq.SpanKind(), runs[0].SpanKind())
	}
	if runs[0].Parent().SpanID() != enq.SpanContext().SpanID() || runs[0].SpanContext().TraceID() != enq.SpanContext().TraceID() {
		t.Fatalf("the first run is not the enqueue's child: parent %s, enqueue %s", runs[0].Parent().SpanID(), enq.SpanContext().SpanID())
	}
	if runs[1].Parent().SpanID() != runs[0].SpanContext().SpanID() {
		t.Fatalf("the retry's run is not the failed run's child")
	}
	if runs[0].Status().Code != codes.Error {
		t.Fatalf("failed run's status %v", runs[0].Status())
	}
}

// spanAttr returns the span's attribute key as a string ("" if absent).
func spanAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// TestSpansCarryMessaging: spans are named "{operation} {queue}", never
// after a raw kind; they carry OpenTelemetry's messaging attributes and
// the message id; a job with no worker still gets its consumer span;
// ContinueWith and Requeue start spans as documented; with XRay the
// context rides in AWSTraceHeader, and a message with only that header
// (no traceparent: what Lambda's active tracing gives) still links the
// run to the producer.
func TestSpansCarryMessaging(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	r := newRig(t, ok, &handler.Options{TracerProvider: tp, XRay: xray.Propagator{}, UnknownKindBackoff: func(int) time.Duration { return 0 }})
	prod, err := enqueue.New(r.e.Cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{TracerProvider: tp, XRay: xray.Propagator{}, Ledger: ledger.Options{Now: r.clock.Now}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := prod.Enqueue(ctx, email{To: "spans@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prod.ContinueWith(ctx, res.ID, email{To: "child@example.com"}, nil); err != nil {
		t.Fatal(err)
	}
	orphan, err := prod.Enqueue(ctx, orphanKind{}, &enqueue.Opts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The messages as Lambda with active tracing would deliver them: the
	// traceparent attribute dropped, AWSTraceHeader kept.
	msgs := r.receive(t, 2)
	for i := range msgs {
		if msgs[i].Attributes[enqueue.XRayAttribute] == "" {
			t.Fatalf("message %d has no %s: %v", i, enqueue.XRayAttribute, msgs[i].Attributes)
		}
		delete(msgs[i].MessageAttributes, enqueue.TraceAttribute)
	}
	r.deliver(t, msgs, 1)
	r.drain(t)
	if _, err := prod.Requeue(ctx, orphan.ID); err != nil {
		t.Fatal(err)
	}
	r.drain(t)

	queue := r.e.QueueURL[strings.LastIndex(r.e.QueueURL, "/")+1:]
	ops := map[string]int{}
	var sends = map[string]sdktrace.ReadOnlySpan{}
	var processes []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if strings.Contains(s.Name(), "email") || strings.Contains(s.Name(), orphanKind{}.Kind()) {
			t.Errorf("span name %q embeds a kind", s.Name())
		}
		if spanAttr(s, "messaging.system") != "aws_sqs" || spanAttr(s, "messaging.destination.name") != queue {
			t.Errorf("span %s lacks the messaging attributes: %v", s.Name(), s.Attributes())
		}
		switch s.Name() {
		case "send " + queue:
			ops[spanAttr(s, "nexjob.operation")]++
			sends[spanAttr(s, "nexjob.job_id")] = s
		case "process " + queue:
			processes = append(processes, s)
			if spanAttr(s, "messaging.message.id") == "" || spanAttr(s, "messaging.operation.type") != "process" {
				t.Errorf("consumer span without its message id / operation: %v", s.Attributes())
			}
		default:
			t.Errorf("unexpected span %q", s.Name())
		}
	}
	if ops["enqueue"] != 2 || ops["continue_with"] != 1 || ops["requeue"] != 1 {
		t.Fatalf("producer spans by operation: %v", ops)
	}
	var orphanRuns, linked int
	for _, p := range processes {
		if spanAttr(p, "nexjob.job_id") == orphan.ID {
			orphanRuns++
		}
		if s, ok := sends[spanAttr(p, "nexjob.job_id")]; ok && p.Parent().SpanID() == s.SpanContext().SpanID() {
			linked++
		}
	}
	if orphanRuns != 2 { // before and after the requeue, no worker either time
		t.Fatalf("the job with no worker got %d consumer spans, want 2", orphanRuns)
	}
	if linked < 2 { // both first deliveries, through AWSTraceHeader alone
		t.Fatalf("%d consumer spans are children of their send, want the two delivered with only AWSTraceHeader", linked)
	}
}
