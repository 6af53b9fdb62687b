package version

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFromBuildInfo(t *testing.T) {
	opa := &debug.Module{Path: opaModule, Version: "v1.22.4"}
	vcs := []debug.BuildSetting{
		{Key: "vcs.revision", Value: "9e9c8fa0c1d2"},
		{Key: "vcs.time", Value: "2026-11-29T13:08:07Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	for _, tc := range []struct {
		name    string
		stamped string
		bi      debug.BuildInfo
		want    Info
	}{
		{
			name:    "the stamped version wins over the module's",
			stamped: "v0.3.0",
			bi:      debug.BuildInfo{Main: debug.Module{Path: module, Version: "v0.2.0"}, Deps: []*debug.Module{opa}, Settings: vcs},
			want:    Info{Version: "v0.3.0", Revision: "9e9c8fa0c1d2", Time: "2026-11-29T13:08:07Z", Modified: true, OPA: "v1.22.4"},
		},
		{
			name: "go install of a tagged module: the module's version",
			bi:   debug.BuildInfo{Main: debug.Module{Path: module, Version: "v0.2.0"}, Deps: []*debug.Module{opa}},
			want: Info{Version: "v0.2.0", OPA: "v1.22.4"},
		},
		{
			name: "a work tree build without -ldflags: devel, with the revision",
			bi:   debug.BuildInfo{Main: debug.Module{Path: module, Version: "(devel)"}, Settings: vcs[:1]},
			want: Info{Version: "devel", Revision: "9e9c8fa0c1d2"},
		},
		{
			// A test binary or another module embedding this one: that
			// module's version is not ichor's.
			name: "another main module: devel",
			bi:   debug.BuildInfo{Main: debug.Module{Path: "example.com/other", Version: "v9.9.9"}},
			want: Info{Version: "devel"},
		},
		{
			name: "a replaced OPA: the replacement's version",
			bi: debug.BuildInfo{Main: debug.Module{Path: module}, Deps: []*debug.Module{
				{Path: opaModule, Version: "v1.22.4", Replace: &debug.Module{Path: "example.com/opa", Version: "v1.22.5-fix"}},
			}},
			want: Info{Version: "devel", OPA: "v1.22.5-fix"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := Info{Version: tc.stamped}
			fromBuildInfo(&info, &tc.bi)
			assert.Equal(t, tc.want, info)
		})
	}
}

func TestGetNeverReportsAnEmptyVersion(t *testing.T) {
	info := Get()
	assert.NotEmpty(t, info.Version)
	assert.NotEmpty(t, info.GoVersion)
}
