package release

import (
	"testing"

	"github.com/stretchr/testify/require"
	sigsyaml "sigs.k8s.io/yaml"
)

// krewPlugin is the part of a krew plugin manifest the tests read.
type krewPlugin struct {
	Spec struct {
		Version   string `json:"version"`
		Platforms []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

func parseKrew(t *testing.T, data []byte) krewPlugin {
	t.Helper()
	var p krewPlugin
	require.NoError(t, sigsyaml.Unmarshal(data, &p))
	return p
}
