package manager

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ichor-dev/ichor-policy/engine"
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

// TestRunRegistersBuildInfo: Run registers the gauge in controller-runtime's
// registry, the one the manager's /metrics serves, before it needs an API
// server. None answers here (nothing listens on port 1), so Run stops at its
// first request, with the gauge registered.
func TestRunRegistersBuildInfo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, Options{
		Config: &rest.Config{Host: "https://127.0.0.1:1"}, Log: io.Discard,
		Engine:      engine.Options{DecisionLog: io.Discard, Log: io.Discard},
		MetricsAddr: "0", ProbeAddr: "0",
	})
	require.ErrorContains(t, err, "connection refused")

	want := version.Get()
	require.NoError(t, testutil.GatherAndCompare(ctrlmetrics.Registry, strings.NewReader(`
# HELP ichor_build_info 1, labelled with the version and VCS revision of the ichor binary and the Go and OPA it was built with (as ichor version prints them).
# TYPE ichor_build_info gauge
ichor_build_info{go_version="`+want.GoVersion+`",opa_version="`+want.OPA+`",revision="`+want.Revision+`",version="`+want.Version+`"} 1
`), "ichor_build_info"))
}
