package manager

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/version"
)

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	info := version.Info{Version: "v0.3.0", Revision: "9e9c8fa", GoVersion: "go1.26.8", OPA: "v1.22.4"}

	require.NoError(t, registerBuildInfo(reg, info))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ichor_build_info 1, labelled with the version and VCS revision of the ichor binary and the Go and OPA it was built with (as ichor version prints them).
# TYPE ichor_build_info gauge
ichor_build_info{go_version="go1.26.8",opa_version="v1.22.4",revision="9e9c8fa",version="v0.3.0"} 1
`), "ichor_build_info"))
}
