package ledger

import (
	"errors"
	"strings"
	"testing"
)

// FuzzKeyAndID: any key hashes to a fixed-length id suffix; ids made from
// it locate the key's record; any string given as an id either locates or
// is refused with ErrBadID, never a panic.
func FuzzKeyAndID(f *testing.F) {
	f.Add("payment-1001", "")
	f.Add("", "aaaaaaaaaaaaaaaaaaaaaaaaaa.bbbbbbbbbbbbbbbbbbbbbbbbbb")
	f.Add("welcome-\xff", "../../etc")
	f.Add(strings.Repeat("k", 5000), "a.b.c")
	f.Fuzz(func(t *testing.T, key, id string) {
		h := hashKey(nil, key)
		if len(h) != 26 || hashKey([]byte("s"), key) == h {
			t.Fatalf("hash %q", h)
		}
		pks, err := locate(newID(h))
		if err != nil || len(pks) != 2 || pks[0] != keyPrefix+h || !strings.HasPrefix(pks[1], jobPrefix) {
			t.Fatalf("locate(newID): %q %v", pks, err)
		}
		if _, err := locate(id); err != nil && !errors.Is(err, ErrBadID) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

// FuzzCursor: List's cursors come back from users; any string is either a
// cursor that re-encodes to itself or ErrBadCursor.
func FuzzCursor(f *testing.F) {
	good, _ := encodeCursor(nil)
	f.Add(good)
	f.Add("eyJzOnBrIjoiayNhIiwiczpsaXN0U3RhdGUiOiJGYWlsZWQiLCJuOmxpc3RBdCI6IjEyIn0")
	f.Add("!!!")
	f.Fuzz(func(t *testing.T, c string) {
		key, err := decodeCursor(c)
		if err != nil {
			if !errors.Is(err, ErrBadCursor) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if _, err := encodeCursor(key); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

// A step's name and the key of the steps map that keeps it (stepKey):
// every name comes back as it was, and no key holds what the expression
// builder reads as syntax.
func FuzzStepKey(f *testing.F) {
	for _, s := range []string{"user.fetch", "charge[0]", "x..y", "%2E", "%", "a%5Bb]", "é.ü[ß]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k := stepKey(name)
		if strings.ContainsAny(k, ".[]") {
			t.Fatalf("stepKey(%q) = %q holds path syntax", name, k)
		}
		if got := stepName(k); got != name {
			t.Fatalf("stepName(stepKey(%q)) = %q", name, got)
		}
	})
}
