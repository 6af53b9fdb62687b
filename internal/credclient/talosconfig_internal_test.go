package credclient

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// talosHome makes HOME a fresh directory and TALOSCONFIG a file in it that
// does not exist; it returns the two places talosctl looks.
func talosHome(t *testing.T) (fromEnv, inHome string) {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("TALOS_HOME", "")
	require.NoError(t, os.Unsetenv("TALOS_HOME"))
	fromEnv = filepath.Join(home, "from-env", "talosconfig")
	t.Setenv("TALOSCONFIG", fromEnv)
	return fromEnv, filepath.Join(home, ".talos", "config")
}

func saveTalosconfig(t *testing.T, path string, endpoints ...string) []byte {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	cfg := &clientconfig.Config{Context: "prod", Contexts: map[string]*clientconfig.Context{"prod": {Endpoints: endpoints}}}
	require.NoError(t, cfg.Save(path))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// The current talosconfig is the one talosctl reads: with $TALOSCONFIG
// naming no file, ~/.talos/config. Before (review of the writing commands,
// #6), it was $TALOSCONFIG all the same, so --out ~/.talos/config --force
// replaced the talosconfig talosctl used; and finding it created nothing.
func TestTheCurrentTalosconfigIsTheOneTalosctlReads(t *testing.T) {
	fromEnv, inHome := talosHome(t)

	p, err := talosconfigInUse()
	require.NoError(t, err)
	assert.Equal(t, fromEnv, p.Path, "with none, the one talosctl would create")
	assert.NoFileExists(t, fromEnv)
	assert.NoFileExists(t, inHome)

	before := saveTalosconfig(t, inHome, "10.5.0.2")
	p, err = talosconfigInUse()
	require.NoError(t, err)
	assert.Equal(t, inHome, p.Path)
	opened, err := clientconfig.Open("")
	require.NoError(t, err)
	assert.Equal(t, opened.Path().Path, p.Path, "talosctl's own lookup finds another")
	assert.NoFileExists(t, fromEnv)

	_, err = Talosconfig(t.Context(), Request{Cluster: "demo", Out: inHome, Force: true})
	require.Error(t, err)
	assert.True(t, usage.Is(err), "%v", err)
	assert.Contains(t, err.Error(), "it is the file you use now ("+inHome+")")
	after, err := os.ReadFile(inHome)
	require.NoError(t, err)
	assert.Equal(t, before, after)

	saveTalosconfig(t, fromEnv, "10.5.0.3")
	p, err = talosconfigInUse()
	require.NoError(t, err)
	assert.Equal(t, fromEnv, p.Path, "$TALOSCONFIG first, once it exists")
}

// Reading the current talosconfig's endpoints, and finding the file to
// merge into, write nothing: machinery's clientconfig.Open, used for both
// before, created an empty talosconfig where there was none, so a command
// refused (no endpoints, a request denied) left one behind.
func TestLookingForATalosconfigWritesNone(t *testing.T) {
	fromEnv, inHome := talosHome(t)
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	c := fake.NewClientBuilder().WithScheme(scheme).Build()

	_, _, err = talosEndpoints(t.Context(), c, "team-a", "demo", nil, fromEnv)
	require.Error(t, err)
	assert.True(t, usage.Is(err), "%v", err)
	assert.Contains(t, err.Error(), "no Talos endpoints for cluster team-a/demo")
	assert.NoFileExists(t, fromEnv)

	target, err := mergeTarget()
	require.NoError(t, err)
	assert.Equal(t, fromEnv, target)
	assert.NoFileExists(t, fromEnv)
	assert.NoFileExists(t, inHome)
	add := &clientconfig.Config{Context: "demo-reader", Contexts: map[string]*clientconfig.Context{"demo-reader": {Endpoints: []string{"10.5.0.2"}}}}
	merged, name, err := mergeInto(target, add, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "demo-reader", name)
	assert.Equal(t, []string{"10.5.0.2"}, merged.Contexts["demo-reader"].Endpoints)
	assert.NoFileExists(t, fromEnv, "the merge writes only once the credential is issued")

	saveTalosconfig(t, fromEnv, "10.5.0.9")
	endpoints, source, err := talosEndpoints(t.Context(), c, "team-a", "demo", nil, fromEnv)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.5.0.9"}, endpoints)
	assert.Equal(t, "the current talosconfig "+fromEnv, source)

	require.NoError(t, os.WriteFile(fromEnv, nil, 0o600))
	merged, _, err = mergeInto(fromEnv, add, io.Discard)
	require.NoError(t, err, "an empty file is an empty talosconfig")
	assert.Len(t, merged.Contexts, 1)
}

// The places machinery's lookup passes over, or follows, are passed over and
// followed here too (review of 2026-12-06): an empty $TALOSCONFIG is none
// (it made --merge target "."), a link to a file not made yet is merged into
// the file it names (not replaced by one), and a talosconfig that may not be
// written (the service account's, mounted read-only) has the default output
// written beside the first that may, known before anything is asked for.
func TestTheTalosconfigPlacesTalosctlSkipsOrFollows(t *testing.T) {
	_, inHome := talosHome(t)
	t.Setenv("TALOSCONFIG", "")
	p, err := talosconfigInUse()
	require.NoError(t, err)
	assert.Equal(t, inHome, p.Path, "an empty $TALOSCONFIG is no place")
	target, err := mergeTarget()
	require.NoError(t, err)
	assert.Equal(t, inHome, target)

	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(filepath.Join("elsewhere", "talosconfig"), link))
	t.Setenv("TALOSCONFIG", link)
	target, err = mergeTarget()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "elsewhere", "talosconfig"), target, "the link's own place")
	assert.NoFileExists(t, target)

	beside, err := writableTalosconfig(clientconfig.Path{Path: "/var/run/secrets/talos.dev/config", WriteAllowed: false})
	require.NoError(t, err)
	assert.Equal(t, link, beside)
}
