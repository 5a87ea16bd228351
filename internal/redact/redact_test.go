package redact_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/internal/redact"
)

const canary = "4111111111111111"

type loud struct{}

func (loud) MarshalJSON() ([]byte, error) { return nil, errors.New("cannot marshal " + canary) }

// TestJSONQuotesNoValue: every kind of encoding/json error that can hold a
// value is described without it, and still says where the fault is.
func TestJSONQuotesNoValue(t *testing.T) {
	var when struct{ At time.Time }
	var str struct {
		N int `json:",string"`
	}
	var s struct{ Card string }
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"time", json.Unmarshal([]byte(`{"At":"`+canary+`"}`), &when), "withheld"},
		{",string", json.Unmarshal([]byte(`{"N":"x`+canary+`"}`), &str), ""},
		{"type", json.Unmarshal([]byte(`{"Card":`+canary+`}`), &s), `field "Card"`},
		{"syntax", json.Unmarshal([]byte(`{"Card":`+canary+`x}`), &s), "byte offset"},
		{"unsupported value", func() error { _, err := json.Marshal(math.NaN()); return err }(), "unsupported value"},
		{"marshaler", func() error { _, err := json.Marshal(loud{}); return err }(), "MarshalJSON method of type redact_test.loud"},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Fatalf("%s: no error to describe", c.name)
		}
		got := redact.JSON(c.err)
		if strings.Contains(got, canary) || strings.Contains(got, "NaN") && c.name != "unsupported value" {
			t.Errorf("%s: %q quotes the value", c.name, got)
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: %q does not say %q", c.name, got, c.want)
		}
	}
}

// TestCapped: the text is cut on a rune boundary and marked; errors.Is
// still reaches the original.
func TestCapped(t *testing.T) {
	base := errors.New(strings.Repeat("é", 3000)) // 6000 bytes
	c := redact.Capped(base, 4000)
	if len(c.Error()) > 4000+len("…") || !strings.HasSuffix(c.Error(), "…") || !errors.Is(c, base) {
		t.Fatalf("capped: %d bytes, Is %v", len(c.Error()), errors.Is(c, base))
	}
	if short := errors.New("short"); redact.Capped(short, 4000) != short || redact.Capped(nil, 10) != nil { //nolint:errorlint // the very value, not a wrapper
		t.Fatal("a short error or nil must come back as it is")
	}
}
