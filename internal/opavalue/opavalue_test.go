package opavalue_test

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/opavalue"
)

// viaJSON is the value the engine built before opavalue, and OPA's own
// reading of a Go value: its JSON, read into OPA's value.
func viaJSON(t *testing.T, v any) (ast.Value, error) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return ast.ValueFromReader(bytes.NewReader(b))
}

func requireSame(t *testing.T, v any) {
	t.Helper()
	want, wantErr := viaJSON(t, v)
	got, err := opavalue.Of(v)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%#v: error %v, through JSON %v", v, err, wantErr)
	}
	if err != nil {
		return
	}
	if ast.Compare(got, want) != 0 {
		t.Fatalf("%#v:\n got %v\nwant %v", v, got, want)
	}
}

// TestTheValueIsTheJSONs: for every input the engine decides on, filled at
// random (strings with invalid UTF-8, escapes and HTML among them, empty and
// nil lists and maps, absent pointers), the value is the one OPA reads from
// the input's JSON.
func TestTheValueIsTheJSONs(t *testing.T) {
	inputs := []any{
		csrinput.KubeletServing{}, csrinput.KubeletClient{}, servingcert.Audit{},
		engine.CredentialAdmissionInput{}, engine.CredentialIssuanceInput{}, engine.CredentialCheckInput{},
		engine.KubeconfigInput{}, engine.ManualActInput{}, engine.Applied{},
	}
	r := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // G404: reproducible inputs, not a secret
	for _, in := range inputs {
		t.Run(reflect.TypeOf(in).String(), func(t *testing.T) {
			for range 300 {
				v := reflect.New(reflect.TypeOf(in))
				fill(r, v.Elem(), 0)
				requireSame(t, v.Elem().Interface())
				requireSame(t, v.Interface())
			}
		})
	}
}

// fill sets every exported field of v it can reach at random; a field of an
// interface type gets a value as a decoded JSON document holds.
func fill(r *rand.Rand, v reflect.Value, depth int) {
	if !v.CanSet() {
		return
	}
	if depth > 6 || r.IntN(8) == 0 {
		v.SetZero()
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 0)
	case reflect.String:
		v.SetString(randomString(r))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(r.Int64() >> r.IntN(64))
		if v.OverflowInt(v.Int()) {
			v.SetInt(int64(r.IntN(100)) - 50)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(r.Uint64() >> r.IntN(64))
		if v.OverflowUint(v.Uint()) {
			v.SetUint(r.Uint64N(100))
		}
	case reflect.Float32, reflect.Float64:
		v.SetFloat([]float64{0, math.Copysign(0, -1), 1.5, 1e21, 1e-7, r.NormFloat64()}[r.IntN(6)])
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(r, v.Elem(), depth+1)
	case reflect.Slice:
		n := r.IntN(4)
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			fill(r, v.Index(i), depth+1)
		}
	case reflect.Array:
		for i := range v.Len() {
			fill(r, v.Index(i), depth+1)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for range r.IntN(4) {
			k := reflect.New(v.Type().Key()).Elem()
			e := reflect.New(v.Type().Elem()).Elem()
			fill(r, k, depth+1)
			fill(r, e, depth+1)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(r, v.Field(i), depth+1)
		}
	case reflect.Interface:
		if v.NumMethod() == 0 {
			v.Set(reflect.ValueOf(randomDocument(r, depth)))
		}
	}
}

// randomDocument is what json.Unmarshal makes of a JSON document.
func randomDocument(r *rand.Rand, depth int) any {
	switch r.IntN(6) {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return r.NormFloat64() * 1e6
	case 3:
		return randomString(r)
	case 4:
		if depth > 4 {
			return "deep"
		}
		list := []any{}
		for range r.IntN(3) {
			list = append(list, randomDocument(r, depth+1))
		}
		return list
	default:
		if depth > 4 {
			return json.Number("12.50")
		}
		m := map[string]any{}
		for range r.IntN(3) {
			m[randomString(r)] = randomDocument(r, depth+1)
		}
		return m
	}
}

func randomString(r *rand.Rand) string {
	parts := []string{"", "a", "system:node:w-1", "\xff", "\xe2\x82", "<&>", "\"\\", "\u2028", "é", "\x00\x1f", "\U0001F600", " "}
	var b []byte
	for range r.IntN(5) {
		b = append(b, parts[r.IntN(len(parts))]...)
	}
	return string(b)
}

type embedded struct {
	Inner string `json:"inner"`
}

type withEmbedded struct {
	embedded
	Outer string `json:"outer"`
}

// plain is a struct the walk writes itself: every field's tag is a name and
// at most omitempty.
type plain struct {
	Skipped    string `json:"-"`
	Untagged   string
	Omitted    []string          `json:"omitted,omitempty"`
	NegZero    float64           `json:"neg_zero,omitempty"`
	Zero       uint              `json:"zero,omitempty"`
	NoPointer  *plain            `json:"no_pointer,omitempty"`
	Raw        json.RawMessage   `json:"raw"`
	Number     json.Number       `json:"number"`
	Bytes      []byte            `json:"bytes"`
	IP         net.IP            `json:"ip"`
	Time       time.Time         `json:"time"`
	IntKeys    map[int]string    `json:"int_keys"`
	Nested     *plain            `json:"nested,omitempty"`
	Value      ast.Value         `json:"value"`
	ByPointer  pointerMarshaler  `json:"by_pointer"`
	Array      [2]uint8          `json:"array"`
	Empty      map[string]string `json:"empty"`
	unexported string
}

// Structs with one tag each that the walk leaves to encoding/json.
type (
	quoted struct {
		N int `json:"n,string"`
	}
	omitZero struct {
		T time.Time `json:"t,omitzero"`
	}
	unicodeName struct {
		S string `json:"nämé"`
	}
)

// duplicate has two fields of one name, which encoding/json leaves out.
type duplicate struct {
	A string `json:"B"`
	B string
}

// pointerMarshaler is written by its method only where encoding/json can
// take its address.
type pointerMarshaler struct{ V string }

func (p *pointerMarshaler) MarshalJSON() ([]byte, error) { return json.Marshal("by pointer: " + p.V) }

type cycle struct {
	Next *cycle `json:"next"`
}

// badName is a struct whose one field's tag names it with a character
// encoding/json does not take in a name (so it writes the Go field's name),
// made at run time since linters refuse such a tag in the source.
func badName(value string) any {
	v := reflect.New(reflect.StructOf([]reflect.StructField{{Name: "S", Type: reflect.TypeFor[string](), Tag: `json:"a\\b"`}})).Elem()
	v.Field(0).SetString(value)
	return v.Interface()
}

// TestWhatTheWalkLeavesToEncodingJSON: the cases encoding/json writes in a
// way of its own are the JSON's too.
func TestWhatTheWalkLeavesToEncodingJSON(t *testing.T) {
	full := plain{
		Skipped: "s", Untagged: "u", NegZero: math.Copysign(0, -1),
		Raw: json.RawMessage(`{"x":[1,2.50]}`), Number: "1e3", Bytes: []byte("\x00bytes"),
		IP: net.ParseIP("10.0.0.1"), Time: time.Date(2026, 12, 4, 1, 2, 3, 4, time.UTC), IntKeys: map[int]string{2: "two"},
		ByPointer: pointerMarshaler{V: "v"}, Array: [2]uint8{1, 2},
		unexported: "not written",
	}
	full.Nested = &plain{Untagged: "inner", Number: "2", NegZero: 0.5, Zero: 1}
	for _, v := range []any{
		nil, true, 42, uint8(7), -3.25, "text", "\xffinvalid", []string(nil), map[string]int(nil),
		map[string]any{"\xff": 1}, []any{json.Number("3.0"), float32(0.1)}, withEmbedded{embedded{"i"}, "o"},
		duplicate{"a", "b"}, full, &full, []*plain{nil, &full}, map[string]plain{"k": full},
		quoted{7}, omitZero{}, omitZero{time.Unix(1, 0).UTC()}, unicodeName{"n"}, badName("b"),
		json.Number("not a number"), func() {}, make(chan int), complex(1, 2),
	} {
		requireSame(t, v)
	}

	c := &cycle{}
	c.Next = c
	if _, err := opavalue.Of(c); err == nil {
		t.Fatal("a cycle converts without an error")
	}
}

// TestAnOPAValueIsTakenAsItIs: an input built as OPA's value (the applied
// record's was, and a replayed entry may be), or a part of one that is, is
// not converted again; encoding/json would write OPA's own encoding of its
// terms instead.
func TestAnOPAValueIsTakenAsItIs(t *testing.T) {
	in := ast.MustParseTerm(`{"a": {1, 2}}`).Value
	got, err := opavalue.Of(in)
	if err != nil || got != in {
		t.Fatalf("got %v, %v; want the same value", got, err)
	}
	got, err = opavalue.Of(plain{Value: in})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := got.Find(ast.MustParseRef("x.value")[1:]); err != nil || v != in {
		t.Fatalf("got %v (%v, %v); want the same value under value", got, v, err)
	}
	var none *ast.Array
	if got, err := opavalue.Of(struct {
		A *ast.Array `json:"a"`
	}{none}); err != nil || ast.Compare(got, ast.MustParseTerm(`{"a": null}`).Value) != 0 {
		t.Fatalf("an absent OPA value: got %v, %v; want null", got, err)
	}
}

func FuzzTheValueIsTheJSONs(f *testing.F) {
	f.Add("system:node:w-1", "10.0.0.1", int64(5), true)
	f.Add("\xff\xfe", "\u2028", int64(-1), false)
	f.Fuzz(func(t *testing.T, a, b string, n int64, flag bool) {
		requireSame(t, csrinput.KubeletServing{
			CSR: csrinput.CSR{
				Name: a, Username: b, Groups: []string{a, b}, Extra: map[string][]string{a: {b}, b: nil},
				Request: csrinput.Request{Parsed: flag, SubjectAltNames: []csrinput.SAN{{Type: a, Value: b}}},
			},
			Node: &csrinput.Node{Nodename: b, Addresses: []string{a}},
		})
		requireSame(t, map[string]any{a: []any{b, n, flag, json.Number(b)}})
	})
}
