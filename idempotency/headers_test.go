package idempotency_test

import (
	"context"
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
