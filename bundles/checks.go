package bundles

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
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

// ErrBundleRoots is a bundle whose manifest claims data paths beyond Roots
// (or none, which OPA reads as every path). OPA keeps a bundle to the roots
// its manifest declares; beyond Ichor's, a bundle could define what the
// engine reads and no rule of Ichor's is: the decision log's drop rule,
// which takes entries out of the log without a trace (review 227 F1).
var ErrBundleRoots = errors.New("bundle manifest claims data paths beyond Ichor's (ichor, system/log, system/applied)")

// ErrBundleRegoVersion is a bundle whose manifest asks OPA to read a module
// as a Rego version other than v0 and v1: v2 (experimental in this OPA)
// reads `and` and `or` as keywords, and whatever a later OPA adds is a
// language this manager's checks (CheckModule) have not read (review 229
// R1).
var ErrBundleRegoVersion = errors.New("bundle manifest asks for a Rego version other than v0 and v1")

// CheckManifest says why a manifest may not be activated: a root beyond
// Roots (ErrBundleRoots: each must be one of Roots or under one), or a Rego
// version other than v0 and v1 (ErrBundleRegoVersion).
func CheckManifest(m bundle.Manifest) error {
	if m.Roots == nil {
		return fmt.Errorf("%w: it declares no roots, which OPA reads as every path; build it with ichor bundle build", ErrBundleRoots)
	}
	for _, root := range *m.Roots {
		if !slices.ContainsFunc(Roots, func(own string) bool { return root == own || strings.HasPrefix(root, own+"/") }) {
			return fmt.Errorf("%w: root %.64q", ErrBundleRoots, root)
		}
	}
	if m.RegoVersion != nil && *m.RegoVersion != 0 && *m.RegoVersion != 1 {
		return fmt.Errorf("%w: rego_version %d", ErrBundleRegoVersion, *m.RegoVersion)
	}
	for file, version := range m.FileRegoVersions {
		if version != 0 && version != 1 {
			return fmt.Errorf("%w: %.64q at %d", ErrBundleRegoVersion, file, version)
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

// ErrBundleBuiltins is a bundle whose rules call a builtin that reaches
// beyond the input: the network (http.send, net.lookup_ip_addr), the process
// (opa.runtime, which returns the engine's whole configuration: a decision
// log's password, a bundle URL's signed query, a verification secret), the
// clock or chance (time.now_ns, rand.intn, uuid.rfc4122, a certificate chain
// verified now). Every fact of a decision is in its input, so that a logged
// decision replays exactly; and the decision log's own rules (system/log)
// are evaluated by OPA's plugin, without the decision's refusal of the
// network, on every entry, so that a mask calling http.send would send every
// decision out (review 227 F2).
var ErrBundleBuiltins = errors.New("bundle calls a builtin that reaches beyond its input (the network, the process, the clock)")

// RefusedBuiltin says whether a rule may not call the builtin name: OPA marks
// it non-deterministic, or it reads the clock all the same (clockReaders).
func RefusedBuiltin(name string) bool {
	return refusedBuiltins()[name]
}

var refusedBuiltins = sync.OnceValue(func() map[string]bool {
	refused := map[string]bool{}
	for _, bi := range ast.CapabilitiesForThisVersion().Builtins {
		if bi.Nondeterministic || slices.Contains(clockReaders, bi.Name) {
			refused[bi.Name] = true
		}
	}
	return refused
})

// clockReaders are builtins OPA does not mark non-deterministic that read
// the clock all the same: OPA v1.22.4 verifies a chain at the time of the
// call (x509.VerifyOptions without CurrentTime), so a certificate in a
// bundle's data that expires next month turns its verdict then, while a
// replay today sees none of it.
var clockReaders = []string{
	"crypto.x509.parse_and_verify_certificates",
	"crypto.x509.parse_and_verify_certificates_with_options",
}

// RefusedCalls are the references to a refused builtin (RefusedBuiltin) in
// a module, each with where it is: a call, a `with` that replaces one, or
// one put in a function's place by `with`, all of which OPA calls; and one
// in a rule head's reference (p[http.send(...)].q), which OPA's walk does
// not visit and its compiler moves into the rule's body (review 228 N1).
func RefusedCalls(m *ast.Module) []string {
	var calls []string
	refused := func(r ast.Ref) bool {
		if name := r.String(); RefusedBuiltin(name) {
			at := ""
			if loc := r[0].Location; loc != nil {
				at = fmt.Sprintf(" (%s:%d)", loc.File, loc.Row)
			}
			calls = append(calls, name+at)
		}
		return false
	}
	ast.WalkRefs(m, refused)
	ast.WalkRules(m, func(rule *ast.Rule) bool {
		for _, t := range rule.Head.Reference {
			ast.WalkRefs(t, refused)
		}
		return false
	})
	return calls
}

// ErrBundleModule is a module that parses as no Rego version this manager
// reads: what it would call cannot be checked.
var ErrBundleModule = errors.New("bundle module parses as no Rego version (v0, v1, v2) the manager can check")

// regoVersions are the versions a manifest may ask OPA to read a module as
// (ast.RegoVersionFromIntStrict: 0, 1, 2).
var regoVersions = []ast.RegoVersion{ast.RegoV0, ast.RegoV1, ast.RegoV2}

// CheckModule says why a module may not be activated: its METADATA declares
// labels (ErrBundleLabels), or it calls a refused builtin (ErrBundleBuiltins).
// It is read as each Rego version a bundle's manifest may ask for
// (rego_version, file_rego_versions), and checked as each it parses as:
// read as v1 alone, a v0 module's labels got through (review 178), and a v2
// module's calls, v2 reading `or` as a keyword (review 229 R1). One that
// parses as none is refused (ErrBundleModule): OPA parses as the manifest
// says, with the same options.
func CheckModule(id string, module []byte) error {
	parsed := false
	for _, version := range regoVersions {
		m, err := ast.ParseModuleWithOpts(id, string(module), ast.ParserOptions{ProcessAnnotation: true, RegoVersion: version})
		if err != nil {
			continue
		}
		parsed = true
		// Only a METADATA block holds annotations, and the word is read as
		// it is; "labels" is not: YAML spells a key with escapes too
		// ("\x6cabels"), which passed a look for the word (review 179).
		for _, a := range m.Annotations {
			if len(a.Labels) > 0 {
				return fmt.Errorf("%w: %s, line %d", ErrBundleLabels, id, a.Location.Row)
			}
		}
		if calls := RefusedCalls(m); len(calls) > 0 {
			slices.Sort(calls)
			return fmt.Errorf("%w: %s calls %s; a rule takes every fact from its input", ErrBundleBuiltins, id, strings.Join(slices.Compact(calls), ", "))
		}
	}
	if !parsed {
		return fmt.Errorf("%w: %s", ErrBundleModule, id)
	}
	return nil
}

// CheckCompiled refuses a compiled bundle that reaches a refused builtin
// (ErrBundleBuiltins) as OPA will evaluate it: the builtins its type checker
// found called (the compiler's Required capabilities), and every reference
// RefusedCalls finds in its modules as compiled, after the compiler moved
// what a rule head computes into the rule's body and rewrote each `with`. It
// is the backstop of CheckModule, which reads each module as written: a form
// that walk does not see (as a rule head's reference was not, review 228 N1)
// and that the compiler turns into a call is refused here, whatever way the
// module took into the store.
func CheckCompiled(c *ast.Compiler) error {
	// The walk names where each is; the type checker only what it is.
	var calls []string
	for _, m := range c.Modules {
		calls = append(calls, RefusedCalls(m)...)
	}
	if len(calls) == 0 && c.Required != nil {
		for _, bi := range c.Required.Builtins {
			if RefusedBuiltin(bi.Name) {
				calls = append(calls, bi.Name)
			}
		}
	}
	if len(calls) > 0 {
		slices.Sort(calls)
		return fmt.Errorf("%w: the compiled bundle calls %s; a rule takes every fact from its input", ErrBundleBuiltins, strings.Join(slices.Compact(calls), ", "))
	}
	return nil
}
