package enqueue

import (
	"context"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TraceAttribute is the SQS message attribute that carries the W3C trace
// context (traceparent) from the producer's span to the worker's.
const TraceAttribute = "traceparent"

// XRayAttribute is the SQS system attribute that carries an X-Ray trace
// header (Lambda's active tracing reads and writes it); XRayHeader is the
// carrier key an X-Ray propagator reads and writes it under.
const (
	XRayAttribute = "AWSTraceHeader"
	XRayHeader    = "X-Amzn-Trace-Id"
)

// TracerName is the instrumentation name of nexjob's spans.
const TracerName = "github.com/nexjob/nexjob-aws"

var traceContext = propagation.TraceContext{}

func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// messaging are the OpenTelemetry messaging attributes of a span about a
// message on queueURL: system, destination, operation.
func messaging(queueURL, operation, operationType string) []attribute.KeyValue {
	name := queueURL[strings.LastIndex(queueURL, "/")+1:]
	return []attribute.KeyValue{
		attribute.String("messaging.system", "aws_sqs"),
		attribute.String("messaging.destination.name", name),
		attribute.String("messaging.operation.name", operation),
		attribute.String("messaging.operation.type", operationType),
	}
}

// startSpan starts a producer span of operation op (enqueue,
// enqueue_many, continue_with, requeue): "send <queue>", with the
// messaging attributes, nexjob.operation and attrs.
func (c *Client) startSpan(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !c.tracing {
		// Off: no span and no attributes built. A caller's own span in ctx
		// is still what the message carries (traceAttributes).
		return ctx, noop.Span{}
	}
	all := append(messaging(c.queueURL, "send", "send"), attribute.String("nexjob.operation", op))
	return c.tracer.Start(ctx, SpanName("send", c.queueURL), trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(append(all, attrs...)...))
}

// SpanName is the name of a span about a message on queueURL (OpenTelemetry's
// "{operation} {destination}"): never a job's kind, which is an attribute.
func SpanName(operation, queueURL string) string {
	return operation + " " + queueURL[strings.LastIndex(queueURL, "/")+1:]
}

// ConsumerSpanAttributes are the attributes of a worker's span for one
// message: the messaging ones (system, destination, "process") and the
// message id.
func ConsumerSpanAttributes(queueURL, messageID string) []attribute.KeyValue {
	return append(messaging(queueURL, "process", "process"), attribute.String("messaging.message.id", messageID))
}

// xrayAttribute returns the system attribute carrying ctx's span context
// in X-Ray's format through p, or nil (p nil, or no span context).
func xrayAttribute(ctx context.Context, p propagation.TextMapPropagator) map[string]sqstypes.MessageSystemAttributeValue {
	if p == nil {
		return nil
	}
	carrier := propagation.MapCarrier{}
	p.Inject(ctx, carrier)
	h := carrier.Get(XRayHeader)
	if h == "" {
		return nil
	}
	return map[string]sqstypes.MessageSystemAttributeValue{XRayAttribute: {DataType: aws.String("String"), StringValue: aws.String(h)}}
}

// TraceContextOf returns ctx with the span context the SQS message
// carries: its traceparent attribute, else (with xray, an X-Ray
// propagator) its AWSTraceHeader system attribute, which Lambda's active
// tracing sets. A message with neither leaves ctx as it is.
func TraceContextOf(ctx context.Context, m events.SQSMessage, xray propagation.TextMapPropagator) context.Context {
	if a, ok := m.MessageAttributes[TraceAttribute]; ok && a.StringValue != nil {
		return traceContext.Extract(ctx, propagation.MapCarrier{TraceAttribute: *a.StringValue})
	}
	if h := m.Attributes[XRayAttribute]; h != "" && xray != nil {
		return xray.Extract(ctx, propagation.MapCarrier{XRayHeader: h})
	}
	return ctx
}

// traceAttributes returns the message attributes carrying ctx's span
// context, or nil when it has none.
func traceAttributes(ctx context.Context) map[string]sqstypes.MessageAttributeValue {
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	tp := carrier.Get(TraceAttribute)
	if tp == "" {
		return nil
	}
	return map[string]sqstypes.MessageAttributeValue{TraceAttribute: {DataType: aws.String("String"), StringValue: aws.String(tp)}}
}

// TraceContext returns ctx with the span context a job message carries
// (see TraceAttribute), for the worker's span to be its child. A message
// without one leaves ctx as it is.
func TraceContext(ctx context.Context, attrs map[string]events.SQSMessageAttribute) context.Context {
	a, ok := attrs[TraceAttribute]
	if !ok || a.StringValue == nil {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier{TraceAttribute: *a.StringValue})
}

// endSpan records the outcome on span and ends it.
func endSpan(span trace.Span, res Result, err error) {
	span.SetAttributes(attribute.String("nexjob.job_id", res.ID), attribute.Bool("nexjob.duplicate", res.Duplicate))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "enqueue failed")
	}
	span.End()
}
