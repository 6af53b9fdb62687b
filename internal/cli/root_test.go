package cli_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/ichor-policy/internal/cli"
)

// TestWrongCommandLinesAreUsageErrors: whatever the command, a command line
// that cannot mean anything (an unknown command, an extra or missing
// argument, a flag's bad value, a named input file that is not there) exits
// 2 with the reason, having done nothing.
func TestWrongCommandLinesAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "ichor"`},
		{[]string{"polcy"}, `(did you mean policy?)`},
		{[]string{"policy", "bogus"}, `unknown command "bogus" for "ichor policy"`},
		{[]string{"bundle", "bogus"}, `unknown command "bogus" for "ichor bundle"`},
		{[]string{"render", "bogus"}, `unknown command "bogus" for "ichor render"`},
		{[]string{"decisions", "bogus"}, `unknown command "bogus" for "ichor decisions"`},
		{[]string{"cluster", "bogus"}, `unknown command "bogus" for "ichor cluster"`},
		{[]string{"completion", "bogus"}, `unknown command "bogus" for "ichor completion"`},
		{[]string{"completion", "bash", "extra"}, `unknown command "extra" for "ichor completion bash"`},
		{[]string{"version", "extra"}, `unknown command "extra" for "ichor version"`},
		{[]string{"manager", "extra"}, `unknown command "extra" for "ichor manager"`},
		{[]string{"bundle", "build", "extra"}, `unknown command "extra" for "ichor bundle build"`},
		{[]string{"policy", "doc", "extra"}, `unknown command "extra" for "ichor policy doc"`},
		{[]string{"policy", "check-csr", "extra", "-f", "-", "--nodename", "worker-1"}, "give the requests' NAMEs or -f FILE, not both"},
		{[]string{"policy", "check-client-csr", "extra", "-f", "-"}, "give the requests' NAMEs or -f FILE, not both"},
		{[]string{"render", "kubelet-serving", "a", "b"}, "accepts at most 1 arg(s), received 2"},
		{[]string{"cluster", "talosconfig"}, "accepts 1 arg(s), received 0"},
		{[]string{"cluster", "kubeconfig", "a", "b"}, "accepts 1 arg(s), received 2"},
		{[]string{"decisions", "show"}, "give the decision ID"},
		{[]string{"manager", "--zap-log-level", "bogus"}, `invalid argument "bogus" for "--zap-log-level" flag`},
		{[]string{"manager", "--zap-encoder", "xml"}, `invalid argument "xml" for "--zap-encoder" flag`},
		{[]string{"policy", "check-csr", "-f", "/nonexistent/csr.yaml", "--nodename", "worker-1"}, "read /nonexistent/csr.yaml: stat /nonexistent/csr.yaml: no such file"},
		{[]string{"policy", "check-client-csr", "-f", "/nonexistent/csr.yaml"}, "read /nonexistent/csr.yaml: stat /nonexistent/csr.yaml: no such file"},
		{[]string{"render", "kubelet-serving", "-f", "/nonexistent/cluster.yaml"}, "read /nonexistent/cluster.yaml: open /nonexistent/cluster.yaml: no such file"},
		{[]string{"bundle", "build", "--signing-key", "/nonexistent/key.pem", "--out", "/nonexistent/bundle.tar.gz"}, "--signing-key: stat /nonexistent/key.pem: no such file"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := run(t, "", tc.args...)
			assert.Equal(t, cli.ExitUsage, code, stderr)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

func TestGroupCommandsWithoutASubcommandPrintHelp(t *testing.T) {
	for _, group := range []string{"policy", "bundle", "render", "decisions", "cluster"} {
		code, stdout, stderr := run(t, "", group)
		assert.Equal(t, cli.ExitOK, code, stderr)
		assert.Contains(t, stdout, "Available Commands:")
	}
}

func TestManagerHelpNamesItsFlagsPlainly(t *testing.T) {
	code, stdout, stderr := run(t, "", "manager", "--help")
	assert.Equal(t, cli.ExitOK, code, stderr)
	// pflag takes back-quoted text in a usage as the value's name: the help
	// read "--bundle-key-id ichor bundle build --key-id" before.
	assert.Contains(t, stdout, `--bundle-key-id string`)
	assert.Contains(t, stdout, `(as "ichor bundle build --key-id" writes it)`)
	for _, flag := range []string{"--zap-log-level", "--zap-encoder", "--zap-devel", "--zap-stacktrace-level", "--zap-time-encoding"} {
		assert.Contains(t, stdout, flag)
	}
}
