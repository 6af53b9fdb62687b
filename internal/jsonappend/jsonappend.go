// Package jsonappend appends a value's JSON, byte for byte as
// encoding/json.Marshal writes it, without reflection for the generic
// documents a decision-log entry is made of: maps of string to any or to
// string, lists of any or of string, strings, json.Number, booleans, nil and
// integers. encoding/json reaches each key and value of a map through reflect
// and allocates for each, and an entry holds the whole input and result of a
// decision: 183 of a logged kubelet-serving decision's 2,358 allocations went
// to its line. Any other value is left to encoding/json, so the bytes are its
// bytes.
package jsonappend

import (
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// maxDepth is how deep the walk goes itself; deeper, encoding/json takes the
// rest, which refuses a map that holds itself rather than recursing for ever.
const maxDepth = 500

// Value appends the JSON of v to dst, as encoding/json.Marshal(v) writes it
// (map keys sorted, HTML characters and invalid UTF-8 escaped as it escapes
// them), and fails where it fails, with its error; of a value that holds
// itself through several types, the type the error names may differ. After an
// error, what dst holds is not to be used.
func Value(dst []byte, v any) ([]byte, error) {
	return appendValue(dst, v, 0)
}

func appendValue(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return appendMarshalled(dst, v)
	}

	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case string:
		return appendString(dst, v), nil
	case bool:
		return strconv.AppendBool(dst, v), nil
	case json.Number:
		if !isInteger(string(v)) {
			return appendMarshalled(dst, v)
		}

		return append(dst, v...), nil
	case int:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(dst, v, 10), nil
	case uint64:
		return strconv.AppendUint(dst, v, 10), nil
	case map[string]any:
		return appendObject(dst, v, depth)
	case []any:
		if v == nil {
			return append(dst, "null"...), nil
		}

		dst = append(dst, '[')

		for i, item := range v {
			if i > 0 {
				dst = append(dst, ',')
			}

			var err error
			if dst, err = appendValue(dst, item, depth+1); err != nil {
				return dst, err
			}
		}

		return append(dst, ']'), nil
	case map[string]string:
		if v == nil {
			return append(dst, "null"...), nil
		}

		dst = append(dst, '{')

		for i, key := range sortedKeys(v) {
			if i > 0 {
				dst = append(dst, ',')
			}

			dst = append(appendString(dst, key), ':')
			dst = appendString(dst, v[key])
		}

		return append(dst, '}'), nil
	case []string:
		if v == nil {
			return append(dst, "null"...), nil
		}

		dst = append(dst, '[')

		for i, s := range v {
			if i > 0 {
				dst = append(dst, ',')
			}

			dst = appendString(dst, s)
		}

		return append(dst, ']'), nil
	default:
		return appendMarshalled(dst, v)
	}
}

func appendObject(dst []byte, m map[string]any, depth int) ([]byte, error) {
	if m == nil {
		return append(dst, "null"...), nil
	}

	dst = append(dst, '{')

	for i, key := range sortedKeys(m) {
		if i > 0 {
			dst = append(dst, ',')
		}

		dst = append(appendString(dst, key), ':')

		var err error
		if dst, err = appendValue(dst, m[key], depth+1); err != nil {
			return dst, err
		}
	}

	return append(dst, '}'), nil
}

// sortedKeys are the map's keys in encoding/json's order (the bytes').
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}

	slices.Sort(keys)

	return keys
}

func appendMarshalled(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, err
	}

	return append(dst, b...), nil
}

// isInteger says whether a number is a JSON integer (-?(0|[1-9][0-9]*)),
// which encoding/json writes as it is; any other is left to it, which checks
// the whole grammar (and writes "" as 0).
func isInteger(s string) bool {
	if s != "" && s[0] == '-' {
		s = s[1:]
	}

	if s == "" || (s[0] == '0' && len(s) > 1) {
		return false
	}

	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}

	return true
}

const hex = "0123456789abcdef"

// appendString is encoding/json's string encoding with HTML escaping, as
// json.Marshal writes it: <, > and & as \u003c, \u003e and \u0026, control
// characters as \b, \f, \n, \r, \t or \u00XX, invalid UTF-8 as \ufffd, and
// U+2028 and U+2029 escaped.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0

	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++

				continue
			}

			dst = append(dst, s[start:i]...)

			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}

			i++
			start = i

			continue
		}

		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size

			continue
		}

		i += size
		start = i
	}

	dst = append(dst, s[start:]...)

	return append(dst, '"')
}
