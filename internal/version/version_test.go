package version

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestMakefileStampsTheVersion links a program with the LDFLAGS that `make
// build` uses, so a renamed package or variable breaks here rather than in a
// release that reports devel.
func TestMakefileStampsTheVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("links a program")
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make")
	}
	const want, revision = "v0.0.0-stamp-test", "0123456789abcdef0123456789abcdef01234567"
	dryRun, err := exec.Command(makeBin, "-C", "../..", "-n", "build", "VERSION="+want, "REVISION="+revision).CombinedOutput()
	require.NoError(t, err, "%s", dryRun)
	m := regexp.MustCompile(`-ldflags "([^"]*)"`).FindSubmatch(dryRun)
	require.NotNil(t, m, "make build passes no -ldflags:\n%s", dryRun)

	bin := filepath.Join(t.TempDir(), "printversion")
	out, err := exec.Command("go", "build", "-ldflags", string(m[1]), "-o", bin, "./testdata/printversion").CombinedOutput()
	require.NoError(t, err, "%s", out)
	got, err := exec.Command(bin).Output()
	require.NoError(t, err)
	assert.Equal(t, want+" "+revision, strings.TrimSpace(string(got)))
}
