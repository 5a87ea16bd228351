package enqueue_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
)

// FuzzDecodeMessage: any SQS body either decodes to a valid job message
// that survives a round trip, or is refused with ErrMalformedMessage.
func FuzzDecodeMessage(f *testing.F) {
	f.Add(`{"v":1,"id":"aaaaaaaaaaaaaaaaaaaaaaaaaa","kind":"email"}`)
	f.Add(`{"v":1,"id":"x","kind":"k","runAt":123,"check":true}`)
	f.Add(`{"v":2}`)
	f.Add("\xff\xfe")
	f.Add(`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]`)
	f.Add(`{"v":1,"id":"a\u0041","kind":"k"}`)
	f.Add(`{"v":1,"id":"x","kind":"k","runAt":0}`)
	f.Add(`{"v":1,"id":"x","kind":"k","runAt":012}`)
	f.Add(`{"v":1,"id":"x","kind":"k","check":false}`)
	f.Add(`{"v":1,"id":"x","kind":"k"} `)
	f.Add(`{"v":1,"id":"x","kind":"k","runAt":99999999999999999999}`)
	// Bodies shorter than their message's encoding: '<' encodes as \u003c.
	f.Add(`{"v":1,"id":"` + strings.Repeat("<", 4000) + `","kind":"k"}`)
	f.Add(`{"v":1,"id":"a<b&c>","kind":"k"}`)
	f.Fuzz(func(t *testing.T, body string) {
		m, err := enqueue.DecodeMessage(body)
		// The fast path for Encode's own form answers as encoding/json does.
		slow, slowErr := enqueue.DecodeMessageJSON(body)
		if m != slow || (err == nil) != (slowErr == nil) {
			t.Fatalf("%q: %+v, %v; encoding/json: %+v, %v", body, m, err, slow, slowErr)
		}
		if err != nil {
			if !errors.Is(err, enqueue.ErrMalformedMessage) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if m.ID == "" || m.Kind == "" || m.V != 1 {
			t.Fatalf("accepted an invalid message %+v", m)
		}
		again, err := enqueue.DecodeMessage(m.Encode())
		if err != nil || again != m {
			t.Fatalf("round trip: %+v → %+v, %v", m, again, err)
		}
	})
}

// FuzzEncodeMessage: Encode writes what encoding/json writes for the
// message, whatever its fields.
func FuzzEncodeMessage(f *testing.F) {
	f.Add(1, "aaaaaaaaaaaaaaaaaaaaaaaaaa", "email", int64(0), false, "")
	f.Add(1, "x", "orders.charge", int64(1796477173064), true, "bulk")
	f.Add(2, "a\"b", "k", int64(-5), false, "")
	f.Add(1, "x", "k<&>", int64(0), false, "")
	f.Add(1, "x", "k", int64(0), false, "caf\u00e9")
	f.Add(-1, "tab\t", "bad\xff", int64(1), true, `back\slash`)
	f.Fuzz(func(t *testing.T, v int, id, kind string, runAt int64, check bool, queue string) {
		m := enqueue.Message{V: v, ID: id, Kind: kind, RunAt: runAt, Check: check, Queue: queue}
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Encode(); got != string(want) {
			t.Fatalf("%+v: Encode %s, encoding/json %s", m, got, want)
		}
	})
}
