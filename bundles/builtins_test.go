package bundles_test

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// reachingModules are modules that reach a refused builtin, each as it is
// written, and the builtin.
var reachingModules = map[string]struct{ module, call string }{
	"http.send in a decision": {"package ichor.probe\n\ndecision := http.send({\"method\": \"GET\", \"url\": \"https://example.com\"}).status_code\n", "http.send"},
	"http.send in the mask":   {"package system.log\n\nmask contains \"/input/x\" if http.send({\"method\": \"POST\", \"url\": \"https://example.com\", \"body\": input}).status_code == 200\n", "http.send"},
	"written as a string key": {"package ichor.probe\n\ndecision := http[\"send\"]({\"method\": \"GET\", \"url\": \"https://example.com\"})\n", "http.send"},
	"put in a function's place": {
		"package ichor.probe\n\nf(x) := x\n\ndecision := x if {\n\tx := data.ichor.probe.f({\"method\": \"GET\", \"url\": \"https://example.com\"}) with data.ichor.probe.f as http.send\n}\n", "http.send",
	},
	"in a rule head's reference": {
		"package ichor.probe\n\np[http.send({\"method\": \"GET\", \"url\": \"https://example.com\"}).status_code].sent := true\n", "http.send",
	},
	"replaced by with":     {"package ichor.probe\n\ndecision := x if x := true with http.send as {}\n", "http.send"},
	"opa.runtime":          {"package ichor.probe\n\ndecision := opa.runtime().config\n", "opa.runtime"},
	"net.lookup_ip_addr":   {"package ichor.probe\n\ndecision := net.lookup_ip_addr(\"example.com\")\n", "net.lookup_ip_addr"},
	"time.now_ns":          {"package ichor.probe\n\ndecision := time.now_ns()\n", "time.now_ns"},
	"a chain verified now": {"package ichor.probe\n\ndecision := crypto.x509.parse_and_verify_certificates(input.chain)\n", "crypto.x509.parse_and_verify_certificates"},
	"Rego v2, whose or neither v0 nor v1 reads": {"package system.log\n\nmask contains \"/input/x\" if http.send({\"method\": \"GET\", \"url\": \"https://example.com\"}).status_code == 200\n\npad if input.a or input.b\n", "http.send"},
	"Rego v0": {"package ichor.probe\n\ndecision = x { x := http.send({\"method\": \"GET\", \"url\": \"https://example.com\"}) }\n", "http.send"},
}

// A module that calls a builtin reaching beyond its input is refused, however
// the call is written: the engine evaluates the decision log's own rules
// (system/log) on every entry without the decision's refusal of the network,
// and opa.runtime hands a rule the engine's configuration and its secrets
// (review 227 F2).
func TestAModuleThatReachesBeyondItsInputIsRefused(t *testing.T) {
	for name, tc := range reachingModules {
		t.Run(name, func(t *testing.T) {
			err := bundles.CheckModule("probe/probe.rego", []byte(tc.module))
			require.ErrorIs(t, err, bundles.ErrBundleBuiltins)
			assert.Contains(t, err.Error(), "probe/probe.rego calls "+tc.call+" (probe/probe.rego:", "the module, the builtin and the line are named")
		})
	}
	// A module that parses as no version OPA may be asked to read it as is
	// refused: what it calls cannot be read.
	require.ErrorIs(t, bundles.CheckModule("probe/probe.rego", []byte("package ichor.probe\n\ndecision := {{\n")), bundles.ErrBundleModule)
	// Builtins that read only their arguments pass.
	require.NoError(t, bundles.CheckModule("probe/probe.rego", []byte("package ichor.probe\n\ndecision := sprintf(\"%d\", [count(input.names)])\n")))
}

// The shipped policy reaches nothing beyond its input: every manager
// activates it.
func TestTheShippedPolicyCallsNoRefusedBuiltin(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	require.NotEmpty(t, b.Modules)
	for _, m := range b.Modules {
		require.NoError(t, bundles.CheckModule(m.Path, m.Raw))
	}
	require.NoError(t, bundles.CheckManifest(b.Manifest))
}

// The same modules, compiled as OPA compiles a bundle it activates, are
// refused by the check of the compiled bundle too (the backstop of each
// module's), each in a Rego version it parses as; the shipped policy
// compiled passes.
func TestACompiledBundleThatReachesBeyondItsInputIsRefused(t *testing.T) {
	for name, tc := range reachingModules {
		t.Run(name, func(t *testing.T) {
			var parsed *ast.Module
			for _, v := range []ast.RegoVersion{ast.RegoV1, ast.RegoV0, ast.RegoV2} {
				if m, err := ast.ParseModuleWithOpts("probe/probe.rego", tc.module, ast.ParserOptions{RegoVersion: v}); err == nil {
					parsed = m
					break
				}
			}
			require.NotNil(t, parsed, "the module parses as some Rego version")
			c := ast.NewCompiler()
			c.Compile(map[string]*ast.Module{"probe/probe.rego": parsed})
			require.False(t, c.Failed(), "%v", c.Errors)
			err := bundles.CheckCompiled(c)
			require.ErrorIs(t, err, bundles.ErrBundleBuiltins)
			assert.Contains(t, err.Error(), "the compiled bundle calls "+tc.call)
		})
	}
	// A builtin OPA's type checker found called is refused where no walk
	// of the modules finds it.
	c := ast.NewCompiler()
	c.Compile(map[string]*ast.Module{"probe/probe.rego": ast.MustParseModule(reachingModules["opa.runtime"].module)})
	require.False(t, c.Failed(), "%v", c.Errors)
	c.Modules = nil
	err := bundles.CheckCompiled(c)
	require.ErrorIs(t, err, bundles.ErrBundleBuiltins)
	assert.Contains(t, err.Error(), "the compiled bundle calls opa.runtime;")

	b, err := bundles.Default()
	require.NoError(t, err)
	modules := map[string]*ast.Module{}
	for _, m := range b.Modules {
		modules[m.Path] = m.Parsed
	}
	c = ast.NewCompiler()
	c.Compile(modules)
	require.False(t, c.Failed(), "%v", c.Errors)
	require.NoError(t, bundles.CheckCompiled(c))
}

// A manifest may claim only Ichor's data paths: beyond them a bundle could
// define what the engine reads and no rule of Ichor's is, such as the
// decision log's drop rule (review 227 F1). And it may ask only for the
// Rego versions the checks read modules as, v0 and v1 (review 229 R1).
func TestAManifestClaimingPathsOrVersionsBeyondIchorsIsRefused(t *testing.T) {
	for _, roots := range [][]string{{""}, {"system"}, {"ichor", "system"}, {"system/ichor"}, {"ichorx"}, {"system/logs"}, {"/ichor"}} {
		err := bundles.CheckManifest(bundle.Manifest{Roots: &roots})
		assert.ErrorIs(t, err, bundles.ErrBundleRoots, "roots %q", roots)
	}
	assert.ErrorIs(t, bundles.CheckManifest(bundle.Manifest{}), bundles.ErrBundleRoots, "no roots, which OPA reads as every path")
	own := []string{"ichor"}
	for _, m := range []bundle.Manifest{
		{Roots: &own, RegoVersion: ptr.To(2)},
		{Roots: &own, FileRegoVersions: map[string]int{"/ichor/probe/probe.rego": 2}},
		{Roots: &own, RegoVersion: ptr.To(3)},
	} {
		assert.ErrorIs(t, bundles.CheckManifest(m), bundles.ErrBundleRegoVersion, "%+v", m)
	}
	for _, m := range []bundle.Manifest{
		{Roots: &own, RegoVersion: ptr.To(0)},
		{Roots: &own, RegoVersion: ptr.To(1), FileRegoVersions: map[string]int{"/ichor/probe/probe.rego": 0}},
	} {
		assert.NoError(t, bundles.CheckManifest(m), "%+v", m)
	}
	for _, roots := range [][]string{{"ichor"}, {"ichor/kubelet_serving", "system/log"}, {"ichor", "system/log", "system/applied"}, {}} {
		assert.NoError(t, bundles.CheckManifest(bundle.Manifest{Roots: &roots}), "roots %q", roots)
	}
}
