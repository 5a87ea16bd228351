package replay

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/nexjob/nexjob-aws/ledger"
)

// redactStep is step name's value v blanked as Options.Redact says: the
// package's own times and ids (a wait's end, a child's id, the patches
// a job knew) kept; a child's outcome keeping its state; a callback
// token's nonce (a secret) replaced.
func redactStep(name, v string) string {
	switch {
	case !strings.HasPrefix(name, "nexjob:"), strings.HasPrefix(name, ledger.SignalStep("")):
		if v == ledger.TimedOut || isTime(v) {
			return v // a sleep's end (a bare unix ms of 2000 to 2100) is the code's, not data
		}
		return redactJSON(v)
	case strings.HasPrefix(name, ledger.TokenStep("")):
		return `"redacted"`
	case strings.HasPrefix(name, ledger.ChildStep("")):
		var o ledger.ChildOutcome
		if json.Unmarshal([]byte(v), &o) != nil {
			return redactJSON(v)
		}
		if len(o.Result) > 0 {
			o.Result = json.RawMessage(redactJSON(string(o.Result)))
		}
		if o.Error != "" {
			o.Error = "redacted"
		}
		b, _ := json.Marshal(o)
		return string(b)
	case strings.HasPrefix(name, ledger.ConditionStep("", "")) && !strings.Contains(name, "#"):
		return redactJSON(v) // a condition's value
	}
	return v
}

// redactJSON is JSON text v with its strings "", numbers 0 and booleans
// false, arrays and objects keeping their shape; "null" for what is not
// JSON.
func redactJSON(v string) string {
	var x any
	if err := json.Unmarshal([]byte(v), &x); err != nil {
		return "null"
	}
	b, _ := json.Marshal(blank(x))
	return string(b)
}

func blank(x any) any {
	switch t := x.(type) {
	case string:
		return ""
	case float64:
		return 0
	case bool:
		return false
	case []any:
		for i := range t {
			t[i] = blank(t[i])
		}
		return t
	case map[string]any:
		for k := range t {
			t[k] = blank(t[k])
		}
		return t
	}
	return x
}

// isTime reports whether v is a bare JSON number that reads as a unix ms
// time of 2000 to 2100: a sleep's end, kept by redaction (a sleep whose
// end was blanked would not sleep).
func isTime(v string) bool {
	n, err := strconv.ParseInt(v, 10, 64)
	return err == nil && n >= 946_684_800_000 && n < 4_102_444_800_000
}
