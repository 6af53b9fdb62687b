package bundles

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
)

// What every manager refuses to activate, checked by the engine at
// activation and by `ichor bundle push` before anything is pushed.

// ErrBundleRevision is a bundle whose revision holds what the approvers
// cannot write into a condition's tail and read back (a parenthesis), or
// what a terminal would take for a command (a control character), or is
// longer than MaxBundleRevision. The revision names the policy in every
// decision's entry and on every verdict's condition ("(decision ID, policy
// revision R)"), which is how an approver's verdict is told from a
// person's (engine.DecisionOfMessage): a revision with a ")" made Ichor's
// own verdicts read as a person's (review 18).
var ErrBundleRevision = errors.New("bundle revision is empty, or not printable ASCII without parentheses")

// MaxBundleRevision is the longest bundle revision taken: a digest, a
// version or a commit id, with room to spare.
const MaxBundleRevision = 256

// CheckRevision says why a bundle's revision may not be activated.
func CheckRevision(revision string) error {
	if revision == "" {
		// The engine keeps the revision in service until another is
		// activated, and the approvers' remembered verdicts hold while it
		// does: a bundle without one (opa build's default) would decide
		// under the previous one's name, its verdicts kept (review 162).
		return fmt.Errorf("%w: the manifest names none; build the bundle with ichor bundle build, or opa build --revision", ErrBundleRevision)
	}
	if len(revision) > MaxBundleRevision {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrBundleRevision, len(revision), MaxBundleRevision)
	}
	for i := range len(revision) {
		if c := revision[i]; c < 0x20 || c > 0x7e || c == '(' || c == ')' {
			return fmt.Errorf("%w: %q", ErrBundleRevision, revision)
		}
	}
	return nil
}

// ErrBundleLabels is a bundle whose METADATA declares labels. OPA v1.22.4's
// SDK records the labels of the rules a query evaluates into the tracker of
// that query's first decision, which it keeps in the prepared query it caches
// (sdk/opa.go, evaluate); every later decision writes that one tracker's maps
// from its own goroutine, and concurrent map writes end the process. Such a
// bundle is refused at activation, the last good one keeps deciding.
var ErrBundleLabels = errors.New("bundle declares METADATA labels, which this OPA records unsafely under concurrent decisions")

// RefuseLabels is ErrBundleLabels for a module whose METADATA declares
// labels. A module is read as Rego v1, or else as v0, which a bundle's
// manifest may ask for (rego_version, file_rego_versions): read as v1 alone,
// a v0 module's labels got through (review 178). A module that parses as
// neither is left to OPA's compiler, which refuses it with its own error.
func RefuseLabels(id string, module []byte) error {
	// Only a METADATA block holds annotations, and the word is read as it
	// is; "labels" is not: YAML spells a key with escapes too ("\x6cabels"),
	// which passed a look for the word (review 179).
	if !bytes.Contains(module, []byte("METADATA")) {
		return nil
	}
	m, err := ast.ParseModuleWithOpts(id, string(module), ast.ParserOptions{ProcessAnnotation: true, RegoVersion: ast.RegoV1})
	if err != nil {
		m, err = ast.ParseModuleWithOpts(id, string(module), ast.ParserOptions{ProcessAnnotation: true, RegoVersion: ast.RegoV0})
	}
	if err != nil {
		return nil //nolint:nilerr // OPA's compiler refuses a module that does not parse, with its own error
	}
	for _, a := range m.Annotations {
		if len(a.Labels) > 0 {
			return fmt.Errorf("%w: %s, line %d", ErrBundleLabels, id, a.Location.Row)
		}
	}
	return nil
}
