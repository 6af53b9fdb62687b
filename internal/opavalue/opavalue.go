// Package opavalue converts Go values to OPA's values as OPA reads their
// JSON, without the JSON in between.
package opavalue

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Of is the value OPA reads from v's JSON (encoding/json's, numbers as
// written), built from the Go value without the JSON in between. The SDK's
// own conversion of a Go struct, and the JSON encoded and read again, went
// through a generic map: about a fifteenth of a logged decision's time and a
// seventh of its allocations (see docs/performance.md). What this walk does
// not know exactly as encoding/json does (a type with a MarshalJSON or
// MarshalText of its own, floats, embedded structs, invalid UTF-8, a tag's
// string or omitzero option, keys that are not strings) is encoded by
// encoding/json and read as before, so the value is the JSON's in every case
// (TestTheValueIsTheJSONs) but one: a value that is OPA's already is taken as
// it is (encoding/json would write OPA's encoding of its terms). A value
// nested more deeply than OPA's JSON reader takes (10,000 levels) is
// converted where its JSON would be refused; no input is nearly as deep.
func Of(v any) (ast.Value, error) {
	return valueOf(reflect.ValueOf(v), 0)
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// maxInputDepth is as deep as the walk goes before it leaves the rest to
// encoding/json, which refuses a cycle; no input of the engine's is
// nearly as deep.
const maxInputDepth = 64

func valueOf(v reflect.Value, depth int) (ast.Value, error) {
	if !v.IsValid() {
		return ast.Null{}, nil
	}
	t := v.Type()
	switch handlingOf(t) {
	case asOPAValue:
		if v.Kind() == reflect.Pointer && v.IsNil() {
			return ast.Null{}, nil
		}
		return v.Interface().(ast.Value), nil
	case asJSON:
		return viaJSON(v)
	}
	if depth > maxInputDepth {
		return viaJSON(v)
	}
	depth++
	switch v.Kind() {
	case reflect.Bool:
		return ast.Boolean(v.Bool()), nil
	case reflect.String:
		s := v.String()
		if !utf8.ValidString(s) {
			// encoding/json writes U+FFFD for each invalid byte.
			return viaJSON(v)
		}
		return ast.String(s), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return ast.Number(strconv.FormatInt(v.Int(), 10)), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return ast.Number(strconv.FormatUint(v.Uint(), 10)), nil
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return ast.Null{}, nil
		}
		return valueOf(v.Elem(), depth)
	case reflect.Slice:
		if v.IsNil() {
			return ast.Null{}, nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			// []byte is base64 in JSON.
			return viaJSON(v)
		}
		return arrayOf(v, depth)
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return viaJSON(v)
		}
		return arrayOf(v, depth)
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return viaJSON(v)
		}
		if v.IsNil() {
			return ast.Null{}, nil
		}
		obj := ast.NewObjectWithCapacity(v.Len())
		for it := v.MapRange(); it.Next(); {
			key := it.Key().String()
			if !utf8.ValidString(key) {
				return viaJSON(v)
			}
			elem, err := valueOf(it.Value(), depth)
			if err != nil {
				return nil, err
			}
			obj.Insert(ast.StringTerm(key), ast.NewTerm(elem))
		}
		return obj, nil
	case reflect.Struct:
		fields, ok := fieldsOf(t)
		if !ok {
			return viaJSON(v)
		}
		obj := ast.NewObjectWithCapacity(len(fields))
		for _, f := range fields {
			fv := v.Field(f.index)
			if f.omitEmpty && isEmpty(fv) {
				continue
			}
			elem, err := valueOf(fv, depth)
			if err != nil {
				return nil, err
			}
			obj.Insert(f.key, ast.NewTerm(elem))
		}
		return obj, nil
	default:
		// Floats, complex numbers, channels and functions: encoding/json's
		// own formatting, or its error.
		return viaJSON(v)
	}
}

func arrayOf(v reflect.Value, depth int) (ast.Value, error) {
	terms := make([]*ast.Term, v.Len())
	for i := range terms {
		elem, err := valueOf(v.Index(i), depth)
		if err != nil {
			return nil, err
		}
		terms[i] = ast.NewTerm(elem)
	}
	return ast.NewArray(terms...), nil
}

// handling is how a type's values are converted.
type handling int

const (
	// byWalk: by the walk of valueOf.
	byWalk handling = iota
	// asOPAValue: the value is one of OPA's already (an input built as
	// OPA's value, or part of one).
	asOPAValue
	// asJSON: encoding/json may call a method of the type's (or of its
	// pointer's, for a value it can address) to write it, or writes it as
	// it is (json.Number).
	asJSON
)

// handlingOf is how t's values are converted, looked up once per type.
func handlingOf(t reflect.Type) handling {
	if known, ok := handlings.Load(t); ok {
		return known.(handling)
	}
	h := byWalk
	switch {
	case t.Kind() == reflect.Interface:
		// The walk goes on with the value it holds, and that value's type
		// says: encoding/json writes an interface's value as its own.
	case t.Implements(opaValue):
		h = asOPAValue
	case t == jsonNumber, t.Implements(jsonMarshaler), t.Implements(textMarshaler),
		t.Kind() != reflect.Pointer && (reflect.PointerTo(t).Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(textMarshaler)):
		h = asJSON
	}
	handlings.Store(t, h)
	return h
}

var (
	handlings  sync.Map // reflect.Type → handling
	opaValue   = reflect.TypeFor[ast.Value]()
	jsonNumber = reflect.TypeFor[json.Number]()
)

// viaJSON is the value as OPA reads v's JSON. A value encoding/json would
// reach through a pointer is encoded through its address, as encoding/json
// does, so that a method of the pointer's is called here too.
func viaJSON(v reflect.Value) (ast.Value, error) {
	x := v.Interface()
	if v.CanAddr() {
		x = v.Addr().Interface()
	}
	b, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	return ast.ValueFromReader(bytes.NewReader(b))
}

// isEmpty is encoding/json's test for omitempty.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Interface, reflect.Pointer:
		return v.IsNil()
	}
	return false
}

// structField is a field of a struct as encoding/json writes it.
type structField struct {
	index     int
	key       *ast.Term
	omitEmpty bool
}

// structFields holds, per struct type, its fields as encoding/json writes
// them, or nil when the type is one this walk leaves to encoding/json.
var structFields sync.Map // reflect.Type → []structField (nil: via JSON)

func fieldsOf(t reflect.Type) ([]structField, bool) {
	cached, ok := structFields.Load(t)
	if !ok {
		cached, _ = structFields.LoadOrStore(t, plainFields(t))
	}
	fields := cached.([]structField)
	return fields, fields != nil
}

// plainFields are t's fields when every one is plain: exported or skipped,
// not embedded, with a tag of a name and at most omitempty, and no two of one
// name. Otherwise nil, and encoding/json writes the struct.
func plainFields(t reflect.Type) []structField {
	fields := []structField{}
	seen := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return nil
		}
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		omitEmpty := false
		for opt := range strings.SplitSeq(opts, ",") {
			switch opt {
			case "":
			case "omitempty":
				omitEmpty = true
			default:
				// string, omitzero, and options of later versions.
				return nil
			}
		}
		if name == "" {
			name = f.Name
		}
		if !validTagName(name) || seen[name] {
			return nil
		}
		seen[name] = true
		fields = append(fields, structField{index: i, key: ast.StringTerm(name), omitEmpty: omitEmpty})
	}
	return fields
}

// validTagName is a name encoding/json takes from a tag as it is: letters,
// digits and the punctuation it allows. Any other makes it use the Go
// field's name, which this walk leaves to it.
func validTagName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}
