package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/idempotency"
)

// Header names are case-insensitive in every HTTP event the package
// knows (API Gateway REST and WebSocket, HTTP API, ALB, function URLs):
// a KeyPath naming the header in any case finds it however the client
// spelled it (HTTP/2 clients send every name in lower case; REST APIs
// and ALBs pass names as sent).
func TestHeaderNamesAreCaseInsensitive(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	t.Run("REST v1", func(t *testing.T) {
		caseCheck(t, r, true, func(sent, key string) events.APIGatewayProxyRequest {
			return events.APIGatewayProxyRequest{Headers: map[string]string{sent: key}, MultiValueHeaders: map[string][]string{sent: {key}}}
		})
	})
	t.Run("HTTP v2", func(t *testing.T) {
		caseCheck(t, r, false, func(sent, key string) events.APIGatewayV2HTTPRequest {
			return events.APIGatewayV2HTTPRequest{Headers: map[string]string{sent: key}}
		})
	})
	t.Run("ALB", func(t *testing.T) {
		caseCheck(t, r, true, func(sent, key string) *events.ALBTargetGroupRequest {
			return &events.ALBTargetGroupRequest{Headers: map[string]string{sent: key}, MultiValueHeaders: map[string][]string{sent: {key}}}
		})
	})
	t.Run("function URL", func(t *testing.T) {
		caseCheck(t, r, false, func(sent, key string) events.LambdaFunctionURLRequest {
			return events.LambdaFunctionURLRequest{Headers: map[string]string{sent: key}}
		})
	})
	t.Run("WebSocket", func(t *testing.T) {
		caseCheck(t, r, true, func(sent, key string) events.APIGatewayWebsocketProxyRequest {
			return events.APIGatewayWebsocketProxyRequest{Headers: map[string]string{sent: key}, MultiValueHeaders: map[string][]string{sent: {key}}}
		})
	})
}

// caseCheck runs, for each KeyPath spelling of the header, a handler
// over events whose header is named in three cases (one key: one run,
// two replays) and then another key (a second run).
func caseCheck[E any](t *testing.T, r *rig, multi bool, event func(sent, key string) E) {
	paths := []string{`headers."Idempotency-Key"`, `headers."idempotency-key"`, `headers.nothing || headers."IDEMPOTENCY-KEY"`, `[headers."Idempotency-Key", body]`}
	if multi {
		paths = append(paths, `multiValueHeaders."Idempotency-Key"[0]`)
	}
	for i, path := range paths {
		s := r.store(t, &idempotency.Options{Function: fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), i)})
		runs := 0
		h, err := idempotency.Handler(s, func(context.Context, E) (string, error) { runs++; return fmt.Sprintf("run %d", runs), nil },
			&idempotency.HandlerOptions[E, string]{KeyPath: path})
		if err != nil {
			t.Fatal(err)
		}
		for _, sent := range []string{"idempotency-key", "Idempotency-Key", "IDEMPOTENCY-KEY"} {
			if got, err := h(context.Background(), event(sent, "k-1")); err != nil || got != "run 1" {
				t.Fatalf("KeyPath %s, the header sent as %q: %q %v; want \"run 1\" (one key)", path, sent, got, err)
			}
		}
		if got, err := h(context.Background(), event("Idempotency-KEY", "k-2")); err != nil || got != "run 2" {
			t.Fatalf("KeyPath %s, another key: %q %v; want a second run", path, got, err)
		}
	}
}

// TestKeyPathWithAnUnquotedDash (issue 41 item 7): a KeyPath that JMESPath
// reads as a subtraction (headers.Idempotency-Key) is refused when the
// handler is built, naming the path and the quoting; quoted, it finds the
// header; a path that finds nothing in an event fails the call naming
// the path (never the event's data).
func TestKeyPathWithAnUnquotedDash(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	run := func(context.Context, events.APIGatewayV2HTTPRequest) (string, error) { return "ok", nil }
	for _, path := range []string{"headers.Idempotency-Key", "body.order-id", "headers.X-Request-Id || body.id"} {
		_, err := idempotency.Handler(r.s, run, &idempotency.HandlerOptions[events.APIGatewayV2HTTPRequest, string]{KeyPath: path})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", path)) || !strings.Contains(err.Error(), `"Idempotency-Key"`) {
			t.Errorf("KeyPath %s: %v; want a refusal naming it and how to quote", path, err)
		}
	}
	h, err := idempotency.Handler(r.s, run, &idempotency.HandlerOptions[events.APIGatewayV2HTTPRequest, string]{KeyPath: `headers."Idempotency-Key"`})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h(context.Background(), events.APIGatewayV2HTTPRequest{Headers: map[string]string{"Idempotency-Key": "k-1"}}); err != nil || out != "ok" {
		t.Fatalf("the quoted path: %q, %v", out, err)
	}
	_, err = h(context.Background(), events.APIGatewayV2HTTPRequest{Headers: map[string]string{"Other": "secret-value"}})
	if !errors.Is(err, idempotency.ErrNoKey) || !strings.Contains(err.Error(), `KeyPath "headers.\"Idempotency-Key\""`) || strings.Contains(err.Error(), "secret-value") {
		t.Fatalf("an event without the header: %v; want ErrNoKey naming the path", err)
	}
}
