package cli_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
)

// complete is what the shell's completion offers for the command line
// (cobra's hidden __complete command, which the completion scripts call).
func complete(t *testing.T, args ...string) []string {
	t.Helper()
	code, stdout, stderr := run(t, "", append([]string{"__complete"}, args...)...)
	require.Equal(t, cli.ExitOK, code, stderr)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if l != "" && !strings.HasPrefix(l, ":") {
			out = append(out, l)
		}
	}
	return out
}

// TestCompletionOfFlagValues: the flags that take one of a few values offer
// them.
func TestCompletionOfFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"decisions", "list", "-o", ""}, []string{"table", "wide", "name", "json", "yaml", "jsonpath="}},
		{[]string{"decisions", "replay", "-o", ""}, []string{"table", "wide", "json", "yaml", "kyaml", "jsonpath=", "jsonpath-file=", "jsonpath-as-json="}},
		{[]string{"version", "-o", ""}, []string{"text", "json", "yaml", "jsonpath="}},
		{[]string{"audit", "kubelet-serving", "-o", ""}, []string{"table", "wide", "name", "json", "yaml", "jsonpath="}},
		{[]string{"policy", "check-csr", "-o", ""}, []string{"table", "wide", "name", "json", "yaml", "jsonpath="}},
		{[]string{"cluster", "admins", "list", "-o", ""}, []string{"table", "wide", "name", "json", "yaml", "jsonpath="}},
		{[]string{"decisions", "list", "--action", ""}, []string{"approve", "deny", "pending", "allowed", "refused"}},
		{[]string{"decisions", "list", "--policy", "kubelet-"}, []string{"kubelet-client", "kubelet-serving"}},
		{[]string{"policy", "check-client-csr", "--authorized", ""}, []string{"selfnodeclient", "nodeclient", "none"}},
		{[]string{"render", "kubelet-serving", "--role", ""}, []string{"controlplane", "worker"}},
		{[]string{"decisions", "replay", "--bundle-key-algorithm", "ES"}, []string{"ES256", "ES384", "ES512"}},
		{[]string{"decisions", "replay", "--fail-on", ""}, []string{"any", "reasons-changed", "to-approve", "from-deny", "deny-to-approve", "allowed-to-refused"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got := complete(t, tc.args...)
			for _, w := range tc.want {
				assert.Contains(t, got, w)
			}
		})
	}
	// Only what a command prints is offered: a replay's report has no name,
	// a version is no table.
	assert.NotContains(t, complete(t, "decisions", "replay", "-o", ""), "name")
	assert.NotContains(t, complete(t, "version", "-o", ""), "table")
	// Every --fail-on value offered is taken.
	for _, v := range complete(t, "decisions", "replay", "--fail-on", "") {
		assert.NoError(t, decisionlog.CheckFailOn(v))
	}
	assert.NotContains(t, complete(t, "decisions", "replay", "--fail-on", ""), "approve-to-approve")
	// Where --policy is a directory, it completes files, not rule names.
	assert.NotContains(t, complete(t, "bundle", "build", "--policy", "kubelet-"), "kubelet-serving")
	assert.NotContains(t, complete(t, "policy", "doc", "--policy", "kubelet-"), "kubelet-serving")
}
