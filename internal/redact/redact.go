// Package redact describes errors that may quote a job's args without
// quoting them: "never args" holds for every error nexjob builds, in logs,
// spans, EMF lines and the stored last error.
//
// encoding/json's errors quote values: "number 4111111111111111" in an
// UnmarshalTypeError, the text of a time.Time that does not parse, a
// ",string" field's content, an UnsupportedValueError's value, and
// whatever a type's own MarshalJSON or UnmarshalJSON returned. JSON keeps
// what locates the fault (the field, the Go type, the JSON kind, the byte
// offset) and drops every value.
//
// # How it fails
//
// It cannot: an error it does not know becomes its Go type's name and a
// note that its text was withheld.
package redact

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// JSON describes err, an error from encoding or decoding args as JSON,
// without any value it may hold.
func JSON(err error) string {
	var (
		syn  *json.SyntaxError
		typ  *json.UnmarshalTypeError
		inv  *json.InvalidUnmarshalError
		unt  *json.UnsupportedTypeError
		unv  *json.UnsupportedValueError
		mErr *json.MarshalerError
	)
	switch {
	case errors.As(err, &typ):
		kind, _, _ := strings.Cut(typ.Value, " ") // "number 4111…" → "number"
		where := "the value"
		if typ.Field != "" {
			where = fmt.Sprintf("field %q", typ.Field)
		}
		return fmt.Sprintf("a JSON %s cannot go into %s of Go type %s", kind, where, typ.Type)
	case errors.As(err, &syn):
		return fmt.Sprintf("invalid JSON at byte offset %d", syn.Offset)
	case errors.As(err, &inv), errors.As(err, &unt):
		return err.Error() // Go types only
	case errors.As(err, &unv):
		return "an unsupported value (NaN, an infinity or a cycle)"
	case errors.As(err, &mErr):
		return fmt.Sprintf("the %s method of type %s failed (its text withheld: it may quote the args)", methodOf(mErr), mErr.Type)
	}
	return fmt.Sprintf("%T (its text withheld: it may quote the args)", innermost(err))
}

func methodOf(e *json.MarshalerError) string {
	if strings.Contains(e.Error(), "MarshalText") {
		return "MarshalText"
	}
	return "MarshalJSON"
}

// innermost is the last error of err's Unwrap chain (the one that says
// what failed), for its type's name.
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// Capped is err with its text cut to at most n bytes (on a rune boundary,
// "…" marking the cut); errors.Is and errors.As still reach err. A worker's
// own error text is stored and shown (ledger, logs, spans): a capped copy
// bounds what one error can put in each.
func Capped(err error, n int) error {
	if err == nil || len(err.Error()) <= n {
		return err
	}
	return &capped{err: err, text: Truncate(err.Error(), n)}
}

type capped struct {
	err  error
	text string
}

func (c *capped) Error() string { return c.text }
func (c *capped) Unwrap() error { return c.err }

// Truncate cuts s to at most n bytes on a rune boundary and marks the cut
// with "…", as the ledger cuts the last error it stores, so what a log or
// span shows is what the record keeps.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
