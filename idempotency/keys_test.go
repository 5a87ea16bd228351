package idempotency_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/idempotency"
)

// A payload's hash does not depend on the order of its JSON's keys (as
// Powertools sorts them before hashing): raw JSON with its keys in another
// order, at the top or nested, is the same payload; a changed value is
// not. A key found as an object is one key whatever its order.
func TestKeyOrderDoesNotMatter(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	type req struct {
		Card  string          `json:"card"`
		Order json.RawMessage `json:"order"`
	}
	for _, tc := range []struct {
		name        string
		first, same any
	}{
		{"raw", json.RawMessage(`{"amount":100,"currency":"EUR"}`), json.RawMessage(`{"currency":"EUR", "amount":100}`)},
		{"nested raw", req{"4242", json.RawMessage(`{"amount":100,"items":[{"sku":"a","n":1}]}`)}, req{"4242", json.RawMessage(`{"items":[{"n":1,"sku":"a"}],"amount":100}`)}},
		{"struct and map", struct{ B, A int }{2, 1}, map[string]int{"A": 1, "B": 2}},
	} {
		var c charger
		key := "order-" + tc.name
		if _, err := idempotency.Do(context.Background(), r.s, key, c.charge(100), &idempotency.CallOptions{Payload: tc.first}); err != nil {
			t.Fatal(err)
		}
		res, err := idempotency.Do(context.Background(), r.s, key, c.charge(100), &idempotency.CallOptions{Payload: tc.same})
		if err != nil || !res.Replayed || c.runs.Load() != 1 {
			t.Errorf("%s: the same payload with its keys in another order: %+v %v, %d runs; want the first result replayed", tc.name, res, err, c.runs.Load())
		}
	}
	var c charger
	if _, err := idempotency.Do(context.Background(), r.s, "order-raw", c.charge(100), &idempotency.CallOptions{Payload: json.RawMessage(`{"currency":"EUR","amount":101}`)}); err == nil {
		t.Error("a changed amount was taken for the same payload")
	}
	runs := 0
	h, err := idempotency.Handler(r.s, func(context.Context, httpReq) (int, error) { runs++; return runs, nil },
		&idempotency.HandlerOptions[httpReq, int]{KeyPath: `powertools_json(body)`})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"order":7,"shop":"x"}`, `{"shop":"x","order":7}`} {
		if got, err := h(context.Background(), httpReq{Body: body}); err != nil || got != 1 {
			t.Errorf("key %s: %d %v; want the first run's 1", body, got, err)
		}
	}
}

// A key found by KeyPath is hashed as Powertools hashes it, by the JSON
// of the value: the string "1" and the number 1 are two keys (two
// orders, two runs). A string found is the key Do takes as that string.
func TestKeyTypesAreDistinct(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	runs := 0
	h, err := idempotency.Handler(r.s, func(context.Context, httpReq) (receipt, error) {
		runs++
		return receipt{ChargeID: "ch_" + strings.Repeat("x", runs), Amount: 1}, nil
	}, &idempotency.HandlerOptions[httpReq, receipt]{KeyPath: `powertools_json(body).id`})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"id":"1"}`, `{"id":1}`, `{"id":true}`, `{"id":"true"}`} {
		if _, err := h(context.Background(), httpReq{Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 4 {
		t.Fatalf(`keys "1", 1, true and "true" ran %d times, want 4 (four keys)`, runs)
	}
	var c charger
	res, err := idempotency.Do(context.Background(), r.s, "1", c.charge(1), nil)
	if err != nil || !res.Replayed || res.Value.ChargeID != "ch_x" {
		t.Fatalf(`Do with key "1": %+v %v; want the handler's run of the string "1" replayed`, res, err)
	}
}

// An event with no key under RunWithoutKey runs without idempotency, as
// Powertools does, and says so: a warning (the function, never the
// event) and a CallWithoutKey metric.
func TestRunWithoutKeyWarns(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	runs := 0
	h, err := idempotency.Handler(r.s, func(context.Context, httpReq) (string, error) { runs++; return "ran", nil },
		&idempotency.HandlerOptions[httpReq, string]{KeyPath: `headers."idempotency-key"`, RunWithoutKey: true})
	if err != nil {
		t.Fatal(err)
	}
	secret := "card-4111111111111111"
	for range 2 {
		if got, err := h(context.Background(), httpReq{Body: `{"card":"` + secret + `"}`}); err != nil || got != "ran" {
			t.Fatalf("an event without a key: %q %v", got, err)
		}
	}
	if runs != 2 || len(r.counter.Calls()) != 0 {
		t.Fatalf("%d runs, requests %v; want 2 runs and no request", runs, r.counter.Calls())
	}
	logs, emf := r.logs.String(), r.emf.String()
	if n := strings.Count(logs, `"level":"WARN","msg":"nexjob: idempotency key missing; the event runs without idempotency","function":"charge"`); n != 2 {
		t.Errorf("%d warnings, want 2: %s", n, logs)
	}
	if n := strings.Count(emf, `"Function":"charge","CallWithoutKey":1`); n != 2 {
		t.Errorf("%d CallWithoutKey metrics, want 2: %s", n, emf)
	}
	if strings.Contains(logs+emf, secret) {
		t.Errorf("the event leaked: %s %s", logs, emf)
	}
}
