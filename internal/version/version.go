// Package version says which ichor this is. A release build stamps Version
// at link time; any other build falls back to what the Go toolchain recorded
// (the module version, or the VCS revision), so a binary never reports an
// empty version.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is stamped by the release build:
//
//	go build -ldflags "-X github.com/ichor-dev/ichor-policy/internal/version.Version=v0.3.0" ./cmd/ichor
var Version string

// Revision is the commit the release build was made from, stamped as
// Version is: the build runs with -buildvcs=false (a stable build cache),
// so the toolchain records none.
var Revision string

// Info is what `ichor version -o json` prints and ichor_build_info carries.
type Info struct {
	// Version is the stamped version, else the main module's, else "devel".
	Version string `json:"version"`
	// Revision and Time are the VCS revision and commit time the toolchain
	// recorded, when it did (builds with -buildvcs=false record none).
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	// Modified is true when the work tree had uncommitted changes.
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
	// OPA is the version of the OPA library the binary embeds.
	OPA string `json:"opa,omitempty"`
}

const (
	module    = "github.com/ichor-dev/ichor-policy"
	opaModule = "github.com/open-policy-agent/opa"
	devel     = "devel"
)

// Get returns the binary's build information.
func Get() Info {
	info := Info{Version: Version, Revision: Revision, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if info.Version == "" {
			info.Version = devel
		}
		return info
	}
	fromBuildInfo(&info, bi)
	return info
}

func fromBuildInfo(info *Info, bi *debug.BuildInfo) {
	if info.Version == "" && bi.Main.Path == module && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if info.Revision == "" {
				info.Revision = s.Value
			}
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	if info.Version == "" {
		info.Version = devel
	}
	for _, dep := range bi.Deps {
		if dep.Path == opaModule || dep.Path == opaModule+"/v1" {
			info.OPA = dep.Version
			if dep.Replace != nil {
				info.OPA = dep.Replace.Version
			}
		}
	}
}
