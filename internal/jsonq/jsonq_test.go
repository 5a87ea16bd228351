package jsonq_test

import (
	"encoding/json"
	"testing"

	"github.com/nexjob/nexjob-aws/internal/jsonq"
)

// FuzzAppend: Append writes what json.Marshal writes, for any string.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "aaaaaaaaaaaaaaaaaaaaaaaaaa", "a\"b", `back\slash`, "<script>&", "tab\there", "caf\u00e9", "bad\xffutf8", "\u2028", "~ !#$%'()*+,-./:;=?@[]^_`{|}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonq.Append([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("%q: %s, json.Marshal %s", s, got[1:], want)
		}
	})
}
