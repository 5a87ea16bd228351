package powertools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
)

// value is a JSON document decoded with its numbers as written
// (json.Number), so that each dialect reads them as its language does.
func value(doc []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("nexjob: powertools: more than one JSON value")
	}
	return v, nil
}

// object is a JSON object's members in the order written (a key written
// twice: its first place, its last value, as JSON.parse and json.loads
// keep it).
type object []member

type member struct {
	k string
	v any
}

// ordered decodes doc as value does, its objects as objects.
func ordered(doc []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	v, err := orderedValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("nexjob: powertools: more than one JSON value")
	}
	return v, nil
}

func orderedValue(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		var o object
		at := map[string]int{}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := orderedValue(d)
			if err != nil {
				return nil, err
			}
			if i, ok := at[k]; ok {
				o[i].v = v
				continue
			}
			at[k] = len(o)
			o = append(o, member{k, v})
		}
		_, err := d.Token() // }
		return o, err
	case json.Delim('['):
		a := []any{}
		for d.More() {
			v, err := orderedValue(d)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := d.Token() // ]
		return a, err
	}
	return tok, nil
}

// pythonJSON writes v as Python's json.dumps(v, sort_keys=True) does
// (Powertools' key and payload hashes): separators ", " and ": ", every
// character outside printable ASCII escaped (\uXXXX, lower-case hex,
// surrogate pairs above the BMP), keys sorted by code point, an integer
// exact and a float as Python's repr.
func pythonJSON(w *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		w.WriteString("null")
	case bool:
		w.WriteString(strconv.FormatBool(v))
	case json.Number:
		w.WriteString(pythonNumber(string(v)))
	case string:
		pythonString(w, v)
	case []any:
		w.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				w.WriteString(", ")
			}
			pythonJSON(w, e)
		}
		w.WriteByte(']')
	case object:
		ms := slices.Clone(v)
		slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.k, b.k) }) // UTF-8 byte order is code point order, as Python's
		w.WriteByte('{')
		for i, m := range ms {
			if i > 0 {
				w.WriteString(", ")
			}
			pythonString(w, m.k)
			w.WriteString(": ")
			pythonJSON(w, m.v)
		}
		w.WriteByte('}')
	}
}

func pythonString(w *strings.Builder, s string) { quote(w, s, true) }

// quote writes s as a JSON string: '"', '\' and the control characters
// escaped as both languages do; with ascii (Python's ensure_ascii) every
// other character outside printable ASCII too, as \uXXXX (lower-case
// hex, a surrogate pair above the BMP); else as UTF-8 (JavaScript's).
func quote(w *strings.Builder, s string, ascii bool) {
	w.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			w.WriteString(`\"`)
		case r == '\\':
			w.WriteString(`\\`)
		case r == '\n':
			w.WriteString(`\n`)
		case r == '\r':
			w.WriteString(`\r`)
		case r == '\t':
			w.WriteString(`\t`)
		case r == '\b':
			w.WriteString(`\b`)
		case r == '\f':
			w.WriteString(`\f`)
		case r < ' ':
			fmt.Fprintf(w, `\u%04x`, r)
		case !ascii || r <= '~':
			w.WriteRune(r)
		case r > 0xFFFF:
			a, b := utf16.EncodeRune(r)
			fmt.Fprintf(w, `\u%04x\u%04x`, a, b)
		default:
			fmt.Fprintf(w, `\u%04x`, r)
		}
	}
	w.WriteByte('"')
}

// pythonNumber is a JSON number as Python's json.loads then json.dumps
// write it: an integer (no ".", "e" or "E") exact, a float as repr.
func pythonNumber(s string) string {
	if !strings.ContainsAny(s, ".eE") {
		if strings.HasPrefix(s, "-") && strings.Trim(s[1:], "0") == "" {
			return "0" // int("-0") is 0
		}
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		if f > 0 {
			return "Infinity"
		}
		return "-Infinity"
	}
	// repr: the shortest digits; fixed when the decimal point falls
	// between -4 and 16 digits, else d.ddde±XX.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	out := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(out, ".") {
		out += ".0"
	}
	return out
}

// jsJSON writes v as TypeScript Powertools hashes it,
// JSON.stringify(deepSort(JSON.parse(doc))): no spaces, only '"', '\'
// and control characters escaped (the rest as UTF-8), every number a
// double written as JavaScript's Number#toString, and an object's keys in
// the order JavaScript enumerates deepSort's object: integer-like keys
// ascending first, then the others as deepSort sorted them
// (case-insensitive, by UTF-16 code units).
func jsJSON(w *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		w.WriteString("null")
	case bool:
		w.WriteString(strconv.FormatBool(v))
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil { // beyond a double: JSON.parse gives ±Infinity, stringify null
			w.WriteString("null")
			return
		}
		w.WriteString(jsNumber(f))
	case string:
		jsString(w, v)
	case []any:
		w.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				w.WriteByte(',')
			}
			jsJSON(w, e)
		}
		w.WriteByte(']')
	case object:
		w.WriteByte('{')
		for i, m := range jsOrder(v) {
			if i > 0 {
				w.WriteByte(',')
			}
			jsString(w, m.k)
			w.WriteByte(':')
			jsJSON(w, m.v)
		}
		w.WriteByte('}')
	}
}

// jsOrder is o's members in the order JSON.stringify writes deepSort's
// copy: integer-like keys ascending first (JavaScript enumerates them so),
// then the others as deepSort sorted them: by a.toLowerCase() <
// b.toLowerCase() (UTF-16 code units), a stable sort (V8's TimSort), so
// keys equal but for case keep the order they were written in.
func jsOrder(o object) []member {
	var index, rest []member
	for _, m := range o {
		if _, ok := arrayIndex(m.k); ok {
			index = append(index, m)
		} else {
			rest = append(rest, m)
		}
	}
	slices.SortFunc(index, func(a, b member) int {
		x, _ := arrayIndex(a.k)
		y, _ := arrayIndex(b.k)
		return int(x - y)
	})
	slices.SortStableFunc(rest, func(a, b member) int {
		return slices.Compare(utf16.Encode([]rune(jsLower(a.k))), utf16.Encode([]rune(jsLower(b.k))))
	})
	return append(index, rest...)
}

// jsLower is String#toLowerCase: Unicode's full lower-case mapping, which
// is Go's simple one but for U+0130 (İ: "i̇") and a final capital sigma
// (ς after a letter and not before one).
func jsLower(s string) string {
	rs := []rune(s)
	var w strings.Builder
	for i, r := range rs {
		switch {
		case r == 'İ':
			w.WriteString("i\u0307")
		case r == 'Σ' && i > 0 && unicode.IsLetter(rs[i-1]) && (i+1 == len(rs) || !unicode.IsLetter(rs[i+1])):
			w.WriteRune('ς')
		default:
			w.WriteRune(unicode.ToLower(r))
		}
	}
	return w.String()
}

// arrayIndex reports whether k is a canonical array index, which
// JavaScript enumerates before every other key, ascending.
func arrayIndex(k string) (int64, bool) {
	n, err := strconv.ParseUint(k, 10, 32)
	if err != nil || n == 1<<32-1 || strconv.FormatUint(n, 10) != k {
		return 0, false
	}
	return int64(n), true
}

func jsString(w *strings.Builder, s string) { quote(w, s, false) }

// jsNumber is Number#toString(10) of f (ECMA-262 Number::toString).
func jsNumber(f float64) string {
	if f == 0 {
		return "0"
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX: the shortest digits
	mant, ex, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(ex)
	k, n := len(digits), x+1
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits
	}
	exp := "+" + strconv.Itoa(n-1)
	if n-1 < 0 {
		exp = strconv.Itoa(n - 1)
	}
	if k == 1 {
		return sign + digits + "e" + exp
	}
	return sign + digits[:1] + "." + digits[1:] + "e" + exp
}

// numbers replaces, in place, each of v's numbers that conv converts.
func numbers(v any, conv func(any) (any, bool)) any {
	switch x := v.(type) {
	case map[string]any:
		for k, m := range x {
			x[k] = numbers(m, conv)
		}
	case []any:
		for i, m := range x {
			x[i] = numbers(m, conv)
		}
	default:
		if n, ok := conv(v); ok {
			return n
		}
	}
	return v
}

// avNumbers turns v's json.Numbers into attributevalue.Numbers, which
// attributevalue.Marshal writes as DynamoDB numbers, exact.
func avNumbers(v any) any {
	return numbers(v, func(x any) (any, bool) {
		n, ok := x.(json.Number)
		return attributevalue.Number(n), ok
	})
}

// jsonOf is the JSON of a value attributevalue decoded with UseNumber.
func jsonOf(v any) ([]byte, error) {
	return json.Marshal(numbers(v, func(x any) (any, bool) {
		n, ok := x.(attributevalue.Number)
		return json.Number(n), ok
	}))
}

func lambdaFunctionName() string { return os.Getenv("AWS_LAMBDA_FUNCTION_NAME") }
