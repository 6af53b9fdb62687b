package engine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// decodeResult decodes a decision's result into out, a pointer to the
// decision's type, after refusing any key that names one of its fields only
// as encoding/json matches names: without regard to case, under Unicode's
// folding, the last such key winning. A rule answering
// {"talos_role": "os:reader", "taloſ_role": "os:admin"} (ſ folds to s, and
// sorts after it) reads as os:reader to `opa test`, the decision log and
// every person, while encoding/json would hand os:admin to the issuer; such a
// result is a broken bundle, refused like any other shape error.
//
// A result that answers "allowed" is refused too when it also carries an
// "action" or a "status": Outcome reads those first, so the metrics, the
// shadow and a replay would count as refused what the caller, which reads
// "allowed" alone, carries out (review of 2026-12-05).
func decodeResult(raw []byte, out any) error {
	if err := checkKeys(raw, reflect.TypeOf(out)); err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// actionWords are what Outcome reads a result's outcome from before
// "allowed".
var actionWords = []string{"action", "status"}

// actionWord is the word of actionWords key is, in any case (as Outcome's
// decoder matches it), when a type with fields answers "allowed" and has no
// such field of its own; "" otherwise.
func actionWord(key string, fields map[string]reflect.Type) string {
	if _, ok := fields["allowed"]; !ok {
		return ""
	}
	for _, word := range actionWords {
		if _, own := fields[word]; !own && strings.EqualFold(key, word) {
			return word
		}
	}
	return ""
}

// checkKeys looks at the keys of raw's objects where t has fields, at every
// depth. What does not decode is left to json.Unmarshal, which says so.
func checkKeys(raw json.RawMessage, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		var object map[string]json.RawMessage
		if json.Unmarshal(raw, &object) != nil {
			return nil
		}
		fields := jsonFields(t)
		for key, value := range object {
			if actionWord(key, fields) != "" {
				return fmt.Errorf("the result answers \"allowed\" and carries %q too, which would be read as its outcome: the result does not say what it seems to", key)
			}
			if field, ok := fields[key]; ok {
				if err := checkKeys(value, field); err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				continue
			}
			for name := range fields {
				if strings.EqualFold(key, name) {
					return fmt.Errorf("key %q is not %q, but encoding/json would read it as that field: the result does not say what it seems to", key, name)
				}
			}
		}
	case reflect.Slice, reflect.Array:
		elem := t.Elem()
		for elem.Kind() == reflect.Pointer {
			elem = elem.Elem()
		}
		if elem.Kind() != reflect.Struct && elem.Kind() != reflect.Slice {
			return nil
		}
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return nil
		}
		for i, item := range items {
			if err := checkKeys(item, elem); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
	}
	return nil
}

// fieldsByType caches jsonFields: the decision types are few, and each is
// looked at on every decision.
var fieldsByType sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields are the names encoding/json gives t's fields (an embedded
// struct's fields as its own), with their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if cached, ok := fieldsByType.Load(t); ok {
		return cached.(map[string]reflect.Type)
	}
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for n, ft := range jsonFields(f.Type) {
				fields[n] = ft
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	fieldsByType.Store(t, fields)
	return fields
}

// CheckDecision holds a decision to what the engine's caller of its rule
// refuses of a result before acting on it (a broken bundle's answer: a
// shape not documented, an action no caller knows, no reason, an allowed
// that names nothing to sign). `ichor decisions replay` asks it of a
// candidate's decisions, so that a result every caller would refuse is
// reported as the failure it would be, not as the action it claims (review
// 255 F2: an answer of "allowed": true beside "action": "refused" replayed
// as refused). A rule no caller acts on (the record of an applied verdict)
// passes.
func CheckDecision(d Decision) error {
	var err error
	switch d.Path {
	case PathKubeletServing:
		_, err = parseCSR(d)
	case PathKubeletServingRejection:
		_, err = parseRejection(d)
	case PathKubeletServingLimits:
		_, err = parseLimits(d)
	case PathKubeletServingAudit:
		_, err = parseAudit(d)
	case PathKubeletClient:
		_, err = parseKubeletClient(d)
	case PathKubeconfig:
		_, err = parseKubeconfig(d)
	case PathCredentialRequirements:
		_, err = parseRequirements(d)
	case PathCredentialAdmission:
		_, err = parseAdmission(d)
	case PathCredentialIssuance, PathCredentialCheck:
		_, err = parseIssuance(d)
	case PathManualRecord:
		_, err = parseManualRecord(d)
	}
	return err
}
