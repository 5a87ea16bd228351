// Package jsonq writes JSON strings as encoding/json does, without its
// reflection for the common case: a string of printable ASCII with no
// quote, backslash or HTML character is written as it is, anything else
// goes to json.Marshal. It cannot fail.
package jsonq

import "encoding/json"

// Plain reports whether encoding/json writes s between quotes as it is.
func Plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// Append appends s as a JSON string, as json.Marshal writes it.
func Append(b []byte, s string) []byte {
	if !Plain(s) {
		q, _ := json.Marshal(s) // a string always marshals
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
