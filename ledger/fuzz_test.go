package ledger

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
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

// A Record read or written with attributevalue (a team's Scan, the test
// kit's, the soak's) keeps the names its run gave: StepMap escapes and
// reads them as the ledger's own decoder does.
func TestStepMapThroughAttributeValue(t *testing.T) {
	rec := Record{ID: "j", Steps: StepMap{"user.fetch": "1", "charge[0]": "2", "%2E": "3"}}
	item, err := attributevalue.MarshalMap(rec)
	if err != nil {
		t.Fatal(err)
	}
	keys := item[AttrSteps].(*types.AttributeValueMemberM).Value
	for _, k := range []string{"user%2Efetch", "charge%5B0%5D", "%252E"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("the item's steps: %v, want the key %q", keys, k)
		}
	}
	var back Record
	if err := attributevalue.UnmarshalMap(item, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Steps) != 3 || back.Steps["user.fetch"] != "1" || back.Steps["charge[0]"] != "2" || back.Steps["%2E"] != "3" {
		t.Errorf("read back with UnmarshalMap: %v", back.Steps)
	}
	own, err := decodeSteps(item[AttrSteps])
	if err != nil || len(own) != 3 || own["user.fetch"] != "1" {
		t.Errorf("the ledger's decoder: %v %v", own, err)
	}
}
