package engine_test

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
)

func kubeconfigInput(t *testing.T, extra string, allowInsecure bool, id *kubeconfig.Identity) engine.KubeconfigInput {
	t.Helper()
	doc := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://10.0.0.1:6443
` + extra + `contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
users:
- name: u
  user:
    token: the-token-itself
`
	d := kubeconfig.Read([]byte(doc))
	require.True(t, d.Facts.Parsed, d.Facts.Error)
	return engine.KubeconfigInput{
		Cluster:        engine.KubeconfigCluster{Namespace: "tenant", Name: "workload"},
		Kubeconfig:     d.Facts,
		Settings:       engine.KubeconfigSettings{AllowInsecureSkipTLSVerify: allowInsecure},
		ServerIdentity: id,
	}
}

// The two steps through the real engine and the default bundle, and the
// operator's flag for insecure-skip-tls-verify; the token itself is never
// in the decision log.
func TestKubeconfigDecisionStepsAndTheInsecureFlag(t *testing.T) {
	e, log := newEngine(t)
	ctx := t.Context()
	ca := "    certificate-authority-data: " + base64.StdEncoding.EncodeToString([]byte("ca")) + "\n"

	first, err := e.Kubeconfig(ctx, kubeconfigInput(t, ca, false, nil))
	require.NoError(t, err)
	assert.False(t, first.Allowed)
	assert.True(t, first.CheckIdentity)
	assert.NotEmpty(t, first.DecisionID)

	final, err := e.Kubeconfig(ctx, kubeconfigInput(t, ca, false, &kubeconfig.Identity{LocalCAKnown: true}))
	require.NoError(t, err)
	assert.True(t, final.Allowed, final.Reasons.String())
	assert.Equal(t, []string{"KubeconfigAllowed"}, final.Reasons.Codes())

	local, err := e.Kubeconfig(ctx, kubeconfigInput(t, ca, false, &kubeconfig.Identity{SameKeyAsLocal: true, LocalCAKnown: true}))
	require.NoError(t, err)
	assert.False(t, local.Allowed)
	assert.Equal(t, []string{"ServerIsLocal"}, local.Reasons.Codes())

	insecure := "    insecure-skip-tls-verify: true\n"
	refused, err := e.Kubeconfig(ctx, kubeconfigInput(t, insecure, false, nil))
	require.NoError(t, err)
	assert.False(t, refused.CheckIdentity)
	assert.Equal(t, []string{"InsecureSkipTLSVerify"}, refused.Reasons.Codes())
	assert.Contains(t, refused.ConditionMessage(), "decision "+refused.DecisionID)

	allowed, err := e.Kubeconfig(ctx, kubeconfigInput(t, insecure, true, &kubeconfig.Identity{}))
	require.NoError(t, err)
	assert.True(t, allowed.Allowed, allowed.Reasons.String())

	assert.NotContains(t, log.String(), "the-token-itself")
	assert.Contains(t, log.String(), engine.PathKubeconfig)
}
