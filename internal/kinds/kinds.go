// Package kinds is the rule every job kind follows: 1 to 128 bytes of
// ASCII letters, digits and . _ - : /, starting with a letter or digit.
//
// A kind is a CloudWatch dimension value of every EMF line, a span
// attribute, a log field and a column of the CLI and the dashboard. The
// rule keeps out what CloudWatch refuses as a dimension (control and
// non-ASCII characters) and what a terminal or a log viewer would
// interpret (escapes, newlines, bidi overrides). Enqueue refuses a kind
// outside it with an *enqueue.InputError and handler.AddWorker panics on
// one; metrics writes any other (an old record's) as Invalid.
package kinds

// MaxLen is a kind's longest, in bytes.
const MaxLen = 128

// Rule says the rule in words, for errors.
const Rule = "1 to 128 bytes of ASCII letters, digits and . _ - : /, starting with a letter or digit"

// Invalid is the dimension value metrics writes for a kind outside the rule.
const Invalid = "invalid-kind"

// Valid reports whether kind follows the rule.
func Valid(kind string) bool {
	if len(kind) == 0 || len(kind) > MaxLen {
		return false
	}
	for i := 0; i < len(kind); i++ {
		c := kind[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-' || c == ':' || c == '/'):
		default:
			return false
		}
	}
	return true
}
