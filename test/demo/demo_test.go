package demo_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/test/demo"
)

// TestDemoTellsTheStory runs `make demo`'s scenario non-interactively: the
// honest kubelets get certificates, the compromised one is denied, the
// stranger stays pending, and the node whose Talos API was down is approved
// once it answers.
func TestDemoTellsTheStory(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ichor")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/ichor")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	var story bytes.Buffer
	res, err := demo.Run(t.Context(), demo.Options{
		Out: &story, Ichor: bin, WorkDir: t.TempDir(), Timeout: 4 * time.Minute,
	})
	t.Log(story.String())
	require.NoError(t, err)

	assert.Equal(t, []string{"cp-1", "worker-1", "worker-3"}, res.Certified)
	assert.Contains(t, res.Verdicts["worker-2"], "deny")
	assert.NotContains(t, res.Verdicts["worker-2"], "approve")
	require.NotEmpty(t, res.Verdicts["stranger-1"])
	for _, v := range res.Verdicts["stranger-1"] {
		assert.Equal(t, "pending", v, "a request for an unmanaged node is never decided")
	}
	assert.Equal(t, "pending", res.Verdicts["worker-3"][0])
	assert.Contains(t, story.String(), "IPNotNode: IP address 10.5.0.3 is not one of the node's addresses")
}
