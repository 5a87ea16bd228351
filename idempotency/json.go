package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
)

// decodeJSON decodes a JSON document for a key or payload expression, its
// numbers as Powertools' Python reads them: an integer is exact (a
// float64 within ±2^53, where each one is; beyond, a json.Number keeping
// its digits, which a float64 would round: order 12345678901234567888
// must not be order …889), any other number a float64. An expression that
// computes with such a large integer (a comparison, arithmetic, a number
// function) meets a value that is not a float64, as go-jmespath counts
// numbers: the comparison is null, the function an error. Selecting it
// keeps it exact.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("invalid character after top-level value")
	}
	return exact(v), nil
}

// maxExact is the largest integer from which every smaller one is exact
// in a float64.
const maxExact = 1 << 53

// exact replaces v's json.Numbers, in place, as decodeJSON says.
func exact(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, m := range v {
			v[k] = exact(m)
		}
	case []any:
		for i, m := range v {
			v[i] = exact(m)
		}
	case json.Number:
		s := string(v)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := strconv.ParseInt(s, 10, 64); err == nil && i >= -maxExact && i <= maxExact {
				return float64(i)
			}
			return v // an integer a float64 would round: its digits
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return f
		}
		return v // beyond a float64's range: as written
	}
	return v
}

// canonicalJSON is v's JSON as a payload is hashed: its objects' keys
// sorted at every depth (json.RawMessage's included, which json.Marshal
// writes as it is) and its numbers as decodeJSON reads them, so that one
// payload has one hash whatever the order its JSON was written in.
func canonicalJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d, err := decodeJSON(b)
	if err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// encodeResult is v's JSON as a result is recorded. A string that is not
// UTF-8 has no JSON: encoding/json writes its bad bytes as \ufffd, so the
// first caller would get the bytes and every repeat U+FFFD in their place.
// It is refused, as the handler refuses such a job result (so is a
// MarshalJSON that spells U+FFFD as that escape: it cannot be told
// apart).
func encodeResult(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if replacementEscape(b) {
		return nil, errors.New("a string in it is not valid UTF-8")
	}
	return b, nil
}

// replacementEscape reports whether JSON b holds the escape \ufffd.
func replacementEscape(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+6 <= len(b) && b[i+1] == 'u' && strings.EqualFold(string(b[i+2:i+6]), "fffd") {
			return true
		}
		i++ // the escaped character: a backslash escaped is not an escape
	}
	return false
}

// decodeResult decodes a recorded result into a T, the numbers held in an
// any as json.Number (exact).
func decodeResult[T any](b []byte) (T, error) {
	var v T
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	err := d.Decode(&v)
	return v, err
}
