package powertools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/powertools"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

func TestAttackPowertoolsInProgressWithoutExpiryIsHeld(t *testing.T) {
	t.Parallel()
	for _, side := range sides {
		for _, remaining := range []any{nil, 60000} {
			t.Run(fmt.Sprintf("%s/remaining=%v", side.name, remaining), func(t *testing.T) {
				t.Parallel()
				cfg, tbl := table(t)
				key := "order-ip-" + ledger.NewNonce()[:6]
				attackPeer(t, side.name, map[string]any{"op": "inprogress", "table": tbl, "prefix": "payments", "key_path": "id", "payload_path": "amount",
					"event": map[string]any{"id": key, "amount": 5}, "remaining_ms": remaining})
				s := pstore(t, cfg, tbl, side.dialect, nil, nil)
				runs := 0
				_, err := idempotency.Do(context.Background(), s, key, func(context.Context) (charge, error) { runs++; return charge{Charge: "go"}, nil }, &idempotency.CallOptions{Payload: 5})
				if !errors.Is(err, idempotency.ErrInProgress) || runs != 0 {
					t.Fatalf("PROMISE BROKEN (a key one holds is in progress for the other): Powertools (%s) in progress (remaining_ms %v): Go ran %d times: %v", side.name, remaining, runs, err)
				}
			})
		}
	}
}

func TestAttackPowertoolsInProgressExpirySkew(t *testing.T) {
	t.Parallel()
	for _, side := range sides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			key := "order-ips-" + ledger.NewNonce()[:6]
			attackPeer(t, side.name, map[string]any{"op": "inprogress", "table": tbl, "prefix": "payments", "key_path": "id",
				"event": map[string]any{"id": key}, "remaining_ms": 30000})
			b, err := powertools.New(cfg, &powertools.Options{Table: tbl, KeyPrefix: "payments", Dialect: side.dialect})
			if err != nil {
				t.Fatal(err)
			}
			kh, err := b.CallKey([]byte(strconv.Quote(key)))
			if err != nil {
				t.Fatal(err)
			}
			item, err := dynamodb.NewFromConfig(cfg).GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(tbl), Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: kh}}, ConsistentRead: aws.Bool(true)})
			if err != nil || item.Item == nil {
				t.Fatalf("the Powertools record %s: %v", kh, err)
			}
			ms, _ := strconv.ParseInt(item.Item["in_progress_expiration"].(*types.AttributeValueMemberN).Value, 10, 64)
			e := time.UnixMilli(ms)
			clk := newFrozen(e.Add(999 * time.Millisecond))
			s := pstore(t, cfg, tbl, side.dialect, clk.now, nil)
			runs := 0
			fn := func(context.Context) (charge, error) { runs++; return charge{Charge: "go"}, nil }
			if _, err := idempotency.Do(context.Background(), s, key, fn, nil); !errors.Is(err, idempotency.ErrInProgress) || runs != 0 {
				t.Fatalf("PROMISE BROKEN (a hold lasts until its deadline plus MaxClockSkew): Powertools' (%s) hold taken 999ms after in_progress_expiration: %d runs, %v", side.name, runs, err)
			}
			clk.set(e.Add(1001 * time.Millisecond))
			if _, err := idempotency.Do(context.Background(), s, key, fn, nil); err != nil || runs != 1 {
				t.Fatalf("Powertools' (%s) hold 1001ms after in_progress_expiration: %d runs, %v; want taken", side.name, runs, err)
			}
		})
	}
}

func TestAttackPowertoolsOddResultsReplayedToGo(t *testing.T) {
	t.Parallel()
	results := []string{`null`, `"a string"`, `false`, `0`, `[]`, `{}`, `{"n": 12, "x": [1.5, {"y": -3}], "s": "ü😀"}`, `{"n": 12345678901234567891, "x": [1.5, {"y": 9007199254740993}]}`}
	for _, side := range sides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			s := pstore(t, cfg, tbl, side.dialect, nil, nil)
			for i, r := range results {
				if side.name == "ts" && i == len(results)-1 {
					continue // JavaScript's numbers are float64s
				}
				key := fmt.Sprintf("order-odd-%d", i)
				var rv any
				d := json.NewDecoder(bytes.NewReader([]byte(r)))
				d.UseNumber()
				if err := d.Decode(&rv); err != nil {
					t.Fatal(err)
				}
				got := attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "event": map[string]any{"id": key}, "result": rv})
				if got["ran"] != true {
					t.Fatalf("Powertools' first call: %v", got)
				}
				runs := 0
				res, err := idempotency.Do(context.Background(), s, key, func(context.Context) (json.RawMessage, error) { runs++; return json.RawMessage(`"go"`), nil }, nil)
				if err != nil || !res.Replayed || runs != 0 || !sameJSON(res.Value, []byte(r)) {
					t.Fatalf("PROMISE BROKEN (a key one ran is replayed to the other): Powertools (%s) recorded %s; Go got %s replayed=%v runs=%d err=%v", side.name, r, res.Value, res.Replayed, runs, err)
				}
			}
		})
	}
}

func TestAttackGoOddResultsReplayedToPowertools(t *testing.T) {
	t.Parallel()
	results := []string{`null`, `"a string"`, `false`, `0`, `[]`, `{}`, `{"n":12,"x":[1.5,{"y":-3}],"s":"ü😀"}`, `{"n":12345678901234567891,"x":[1.5,{"y":9007199254740993}]}`}
	for _, side := range sides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			s := pstore(t, cfg, tbl, side.dialect, nil, nil)
			for i, r := range results {
				if side.name == "ts" && i == len(results)-1 {
					continue // JavaScript's numbers are float64s
				}
				// What Powertools replays of its own record of r (Python
				// replays a falsy result as None: its own behaviour).
				var rv any
				d := json.NewDecoder(bytes.NewReader([]byte(r)))
				d.UseNumber()
				if err := d.Decode(&rv); err != nil {
					t.Fatal(err)
				}
				own := fmt.Sprintf("order-pown-%d", i)
				attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "event": map[string]any{"id": own}, "result": rv})
				ptOwn := attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "event": map[string]any{"id": own}, "result": "pt"})
				key := fmt.Sprintf("order-godd-%d", i)
				if _, err := idempotency.Do(context.Background(), s, key, func(context.Context) (json.RawMessage, error) { return json.RawMessage(r), nil }, nil); err != nil {
					t.Fatal(err)
				}
				got := attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "event": map[string]any{"id": key}, "result": "pt"})
				out, _ := json.Marshal(got["result"])
				want, _ := json.Marshal(ptOwn["result"])
				if got["ran"] != false || ptOwn["ran"] != false || !sameJSON(out, want) {
					t.Fatalf("PROMISE BROKEN (a key one ran is replayed to the other): Go recorded %s; Powertools (%s) got %v, and of its own record of it %v", r, side.name, got, ptOwn)
				}
			}
		})
	}
}

func sameJSON(a, b []byte) bool {
	dec := func(x []byte) (any, error) {
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		var v any
		err := d.Decode(&v)
		return v, err
	}
	va, ea := dec(a)
	vb, eb := dec(b)
	return ea == nil && eb == nil && reflect.DeepEqual(normal(va), normal(vb))
}

func normal(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return fmt.Sprint(i)
		}
		if _, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return string(x)
		}
		f, _ := x.Float64()
		if f == float64(int64(f)) && (f < 1<<53 && f > -(1<<53)) {
			return fmt.Sprint(int64(f))
		}
		return strconv.FormatFloat(f, 'g', -1, 64)
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = normal(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = normal(e)
		}
		return l
	}
	return v
}

func TestAttackPowertoolsPayloadKeyOrder(t *testing.T) {
	t.Parallel()
	for _, side := range sides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			s := pstore(t, cfg, tbl, side.dialect, nil, nil)
			got := attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "payload_path": "meta",
				"event": map[string]any{"id": "order-ko", "meta": json.RawMessage(`{"zeta": 1, "Alpha": {"d": [2, {"y": 1, "x": 2}], "c": "é"}, "alpha": 3}`)}, "result": map[string]any{"charge": "pt"}})
			if got["ran"] != true {
				t.Fatalf("Powertools' first call: %v", got)
			}
			runs := 0
			res, err := idempotency.Do(context.Background(), s, "order-ko", func(context.Context) (charge, error) { runs++; return charge{}, nil },
				&idempotency.CallOptions{Payload: json.RawMessage(`{"alpha":3,"Alpha":{"c":"é","d":[2,{"x":2,"y":1}]},"zeta":1}`)})
			if err != nil || !res.Replayed || runs != 0 || res.Value.Charge != "pt" {
				t.Fatalf("PROMISE BROKEN (key order does not matter; a validated payload is accepted under the same value): Powertools (%s) then Go with the payload's keys reordered: %+v %v, %d runs", side.name, res, err, runs)
			}
			// And the reverse.
			if _, err := idempotency.Do(context.Background(), s, "order-ko2", func(context.Context) (charge, error) { return charge{Charge: "go"}, nil },
				&idempotency.CallOptions{Payload: map[string]any{"b": 1, "a": map[string]any{"y": 1, "x": 2}}}); err != nil {
				t.Fatal(err)
			}
			got = attackPeer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "payload_path": "meta",
				"event": map[string]any{"id": "order-ko2", "meta": json.RawMessage(`{"a": {"x": 2, "y": 1}, "b": 1}`)}, "result": "pt"})
			if got["ran"] != false {
				t.Fatalf("PROMISE BROKEN (key order does not matter): Go then Powertools (%s) with the payload's keys reordered: %v", side.name, got)
			}
		})
	}
}

func TestAttackPowertoolsBigIntegerKeyViaHandler(t *testing.T) {
	t.Parallel()
	cfg, tbl := table(t)
	s := pstore(t, cfg, tbl, powertools.Python, nil, nil)
	got := attackPeer(t, "py", map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id",
		"event": json.RawMessage(`{"id": 12345678901234567891}`), "result": map[string]any{"charge": "pt_big"}})
	if got["ran"] != true {
		t.Fatalf("Powertools' first call: %v", got)
	}
	runs := 0
	h, err := idempotency.Handler(s, func(context.Context, json.RawMessage) (charge, error) { runs++; return charge{Charge: "go"}, nil },
		&idempotency.HandlerOptions[json.RawMessage, charge]{KeyPath: "id"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h(context.Background(), json.RawMessage(`{"id": 12345678901234567891}`))
	if err != nil || runs != 0 || r.Charge != "pt_big" {
		t.Fatalf("PROMISE BROKEN (numbers are exact; an event's KeyPath value hashed as its JSON): Go's Handler on Python's key 12345678901234567891: %+v %v, %d runs", r, err, runs)
	}
	r, err = h(context.Background(), json.RawMessage(`{"id": 12345678901234567890}`))
	if err != nil || runs != 1 || r.Charge != "go" {
		t.Fatalf("PROMISE BROKEN (numbers are exact): the neighbouring integer key: %+v %v, %d runs", r, err, runs)
	}
}

func TestAttackPowertoolsWritesUnderTimeout(t *testing.T) {
	t.Parallel()
	declined := errors.New("declined")
	for _, op := range []string{"DynamoDB.PutItem", "DynamoDB.UpdateItem", "DynamoDB.DeleteItem"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			ft := faults.New(nil)
			s := pstore(t, faults.Config(cfg, ft), tbl, powertools.Python, nil, nil)
			runs := 0
			fail := op == "DynamoDB.DeleteItem"
			fn := func(context.Context) (charge, error) {
				runs++
				if fail {
					return charge{}, declined
				}
				return charge{Charge: fmt.Sprintf("go_%d", runs)}, nil
			}
			h := ft.Add(faults.Rule{Op: op, Fault: faults.Timeout})
			res, err := idempotency.Do(context.Background(), s, "order-to", fn, nil)
			if h.Fired() != 1 {
				t.Fatalf("the timeout did not fire: %d", h.Fired())
			}
			if fail {
				if !errors.Is(err, declined) || runs != 1 {
					t.Fatalf("a release timed out: %v, %d runs", err, runs)
				}
				fail = false
				if again, err := idempotency.Do(context.Background(), s, "order-to", fn, nil); err != nil || again.Replayed || runs != 2 {
					t.Fatalf("PROMISE BROKEN (a release whose reply was lost frees the key): %+v %v, %d runs", again, err, runs)
				}
				return
			}
			if err != nil || runs != 1 {
				t.Fatalf("PROMISE BROKEN (a write whose reply was lost is read back as the success it was): %s timed out: %+v %v, %d runs", op, res, err, runs)
			}
			again, err := idempotency.Do(context.Background(), s, "order-to", fn, nil)
			if err != nil || !again.Replayed || again.Value != res.Value || runs != 1 {
				t.Fatalf("PROMISE BROKEN (lost reply read back): after %s timed out, a repeat: %+v %v, %d runs", op, again, err, runs)
			}
		})
	}
}
