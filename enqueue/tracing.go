package enqueue

import (
	"context"

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

// TracerName is the instrumentation name of nexjob's spans.
const TracerName = "github.com/nexjob/nexjob-aws"

var traceContext = propagation.TraceContext{}

func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(TracerName)
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
