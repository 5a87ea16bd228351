package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// HandlerOptions say where a handler's event keeps its key and the fields
// a repeat must match. Give the key by a function or an expression.
type HandlerOptions[E, R any] struct {
	// Key returns the event's idempotency key ("" for none).
	Key func(E) (string, error)
	// KeyPath is a JMESPath expression over the event as JSON (its json
	// field names, as in Powertools): `headers."idempotency-key"`,
	// `powertools_json(body).order_id`, `messageId`. A string result is
	// the key; any other is its JSON, keyed apart from the strings. Used
	// when Key is nil. In an HTTP event of aws-lambda-go (API Gateway
	// REST, WebSocket and HTTP APIs, ALB, function URLs) header names are
	// case-insensitive: `headers."Idempotency-Key"` finds the header
	// whatever the case the client sent it in (both the event's names and
	// the expression's names under headers and multiValueHeaders are
	// lowered). A Key function reads the event as it came.
	KeyPath string
	// Payload returns the fields a repeat must match (CallOptions.Payload).
	Payload func(E) any
	// PayloadPath is a JMESPath expression for them, used when Payload is
	// nil: `body`, `[amount, currency]`. Defaults to none (not validated).
	PayloadPath string
	// RunWithoutKey runs an event with no key without idempotency, as
	// Powertools does, with a warning log (the function, never the event)
	// and a CallWithoutKey metric. Defaults to false: such an event gets
	// ErrNoKey, and nothing runs.
	RunWithoutKey bool
	// Replayed marks a replayed response (a header an API client can
	// read, such as Idempotent-Replayed: true). It gets the recorded
	// response as decoded from its JSON, each time afresh: a map the
	// first response had none of (no headers) is nil, and writing into it
	// panics; make one first. Defaults to none.
	Replayed func(R) R
}

// extractor finds an event's key and payload.
type extractor[E, R any] struct {
	o       HandlerOptions[E, R]
	key     *expr
	payload *expr
	// folded: E is an HTTP event (isHTTPEvent): its header names are
	// lowered in the event and in the expressions.
	folded bool
}

func newExtractor[E, R any](o *HandlerOptions[E, R]) (*extractor[E, R], error) {
	if o == nil || o.Key == nil && o.KeyPath == "" {
		return nil, errors.New("nexjob: an idempotent handler needs HandlerOptions.Key or KeyPath")
	}
	x := &extractor[E, R]{o: *o, folded: isHTTPEvent[E]()}
	var err error
	if o.Key == nil {
		if err := unquotedDash(o.KeyPath); err != nil {
			return nil, fmt.Errorf("nexjob: idempotency KeyPath: %w", err)
		}
		if x.key, err = compile(o.KeyPath, x.folded); err != nil {
			return nil, fmt.Errorf("nexjob: idempotency KeyPath: %w", err)
		}
	}
	if o.Payload == nil && o.PayloadPath != "" {
		if err := unquotedDash(o.PayloadPath); err != nil {
			return nil, fmt.Errorf("nexjob: idempotency PayloadPath: %w", err)
		}
		if x.payload, err = compile(o.PayloadPath, x.folded); err != nil {
			return nil, fmt.Errorf("nexjob: idempotency PayloadPath: %w", err)
		}
	}
	return x, nil
}

// eventKey is a key an event holds: a string, or the JSON of any other
// value (json): hashed apart, so that the string "1" and the number 1 are
// two keys, as Powertools hashes a key by its value's JSON.
type eventKey struct {
	text string
	json bool
}

// hash is the key as stored: a string's as Do's (Store.KeyHash), another
// value's JSON scoped apart from every string.
func (k eventKey) hash(s *Store) string {
	if k.json && s.layout != nil {
		kh, _ := s.layout.CallKey([]byte(k.text)) // JSON the event held: no error
		return kh
	}
	if k.json {
		return s.callKey(ledger.HashKeyWith(s.secret, s.function+"\x01"+k.text))
	}
	return s.KeyHash(k.text)
}

// find returns the event's key ("" text: none) and its payload to
// validate (nil: none). An error here names no part of the event.
func (x *extractor[E, R]) find(ev E) (eventKey, any, error) {
	var doc any
	if x.key != nil || x.payload != nil {
		b, err := json.Marshal(ev)
		if err != nil {
			return eventKey{}, nil, fmt.Errorf("nexjob: idempotency: encode the event %T: %w", ev, err)
		}
		if doc, err = decodeJSON(b); err != nil {
			return eventKey{}, nil, fmt.Errorf("nexjob: idempotency: decode the event %T: %w", ev, err)
		}
		if x.folded {
			foldHeaders(doc)
		}
	}
	var key eventKey
	if x.o.Key != nil {
		k, err := x.o.Key(ev)
		if err != nil {
			return eventKey{}, nil, err
		}
		key.text = k
	} else {
		v, err := x.key.search(doc)
		if err != nil {
			return eventKey{}, nil, errors.New("nexjob: idempotency KeyPath failed on the event")
		}
		if key, err = asKey(v); err != nil {
			return eventKey{}, nil, err
		}
	}
	var payload any
	switch {
	case x.o.Payload != nil:
		payload = x.o.Payload(ev)
	case x.payload != nil:
		v, err := x.payload.search(doc)
		if err != nil {
			return eventKey{}, nil, errors.New("nexjob: idempotency PayloadPath failed on the event")
		}
		payload = v
	}
	return key, payload, nil
}

// asKey makes an expression's result a key: a string as it is; nothing
// ("", null, an empty list or object, a list of nulls: what a
// multi-select finds in an event without the fields) as no key; anything
// else its JSON (objects' keys sorted, integers exact), hashed apart
// from the strings.
func asKey(v any) (eventKey, error) {
	switch v := v.(type) {
	case nil:
		return eventKey{}, nil
	case string:
		return eventKey{text: v}, nil
	case map[string]any:
		if len(v) == 0 {
			return eventKey{}, nil
		}
	case []any:
		empty := true
		for _, m := range v {
			empty = empty && m == nil
		}
		if empty {
			return eventKey{}, nil
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return eventKey{}, fmt.Errorf("nexjob: idempotency key: %w", err)
	}
	return eventKey{text: string(b), json: true}, nil
}

// Handler wraps a Lambda handler (any event and response types
// aws-lambda-go can decode and encode as JSON) so that each event runs it
// once per key, as Do. A repeat returns the first response recorded
// (passed through o.Replayed, if set); an event with no key gets ErrNoKey
// unless o.RunWithoutKey. The error is for a bad option or expression.
func Handler[E, R any](s *Store, h func(context.Context, E) (R, error), o *HandlerOptions[E, R]) (func(context.Context, E) (R, error), error) {
	x, err := newExtractor(o)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev E) (R, error) {
		var zero R
		if s.disabled {
			return h(ctx, ev)
		}
		key, payload, err := x.find(ev)
		if err != nil {
			return zero, err
		}
		if key.text == "" {
			if x.o.RunWithoutKey {
				s.count(metrics.CallWithoutKey, "")
				s.log.LogAttrs(ctx, slog.LevelWarn, "nexjob: idempotency key missing; the event runs without idempotency", slog.String("function", s.function))
				return h(ctx, ev)
			}
			if x.o.Key == nil {
				// The path is the team's code, not the event's data: safe to name.
				return zero, fmt.Errorf("%w: KeyPath %q found nothing in the event", ErrNoKey, x.o.KeyPath)
			}
			return zero, ErrNoKey
		}
		res, err := call(ctx, s, key.hash(s), func(ctx context.Context) (R, error) { return h(ctx, ev) }, &CallOptions{Payload: payload})
		if res.Replayed && err == nil && x.o.Replayed != nil {
			return x.o.Replayed(res.Value), nil
		}
		return res.Value, err
	}, nil
}
