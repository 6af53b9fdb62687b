package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/version"
)

func TestVersion(t *testing.T) {
	want := version.Get()

	code, stdout, stderr := run(t, "", "version")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, "ichor:    "+want.Version+"\n")
	assert.Contains(t, stdout, "go:       "+want.GoVersion+"\n")

	code, stdout, stderr = run(t, "", "version", "-o", "json")
	require.Equal(t, cli.ExitOK, code, stderr)
	var got version.Info
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	assert.Equal(t, want, got)

	code, stdout, stderr = run(t, "", "version", "-o", "xml")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, `unable to match a printer suitable for the output format "xml", allowed formats are: json,jsonpath,jsonpath-as-json,jsonpath-file,kyaml,text,yaml`)
}
