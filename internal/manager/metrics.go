package manager

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ichor-dev/ichor-policy/internal/version"
)

// registerBuildInfo registers ichor_build_info, the usual constant 1 whose
// labels say which binary serves: a dashboard joins it to tell a rollout's
// old and new replicas apart, and OPA's version beside Ichor's, since the
// decision log's labels.version is OPA's.
func registerBuildInfo(reg prometheus.Registerer, info version.Info) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ichor_build_info",
		Help: "1, labelled with the version and VCS revision of the ichor binary and the Go and OPA it was built with (as ichor version prints them).",
		ConstLabels: prometheus.Labels{
			"version": info.Version, "revision": info.Revision, "go_version": info.GoVersion, "opa_version": info.OPA,
		},
	})
	g.Set(1)
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register ichor_build_info: %w", err)
	}
	return nil
}
