package manager

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// Ichor's own purposes go to ServiceAccounts of the namespaces given, else
// of the manager's own (review 254 F4); a manager outside a pod that is
// given none is refused at start, not handed "any" (review 258 F8). A name
// that is no namespace's is refused at start.
func TestTheComponentNamespacesAreTheManagersOwnUnlessGiven(t *testing.T) {
	for name, tc := range map[string]struct {
		o    Options
		want []string
	}{
		"the manager's own":    {o: Options{Namespace: "ichor-system"}, want: []string{"ichor-system"}},
		"given":                {o: Options{Namespace: "ichor-system", ComponentNamespaces: []string{"ichor-ui", "ichor-system"}}, want: []string{"ichor-ui", "ichor-system"}},
		"outside a pod, given": {o: Options{ComponentNamespaces: []string{"ichor-ui"}}, want: []string{"ichor-ui"}},
	} {
		got, err := componentNamespaces(tc.o)
		require.NoError(t, err, name)
		assert.Equal(t, tc.want, got, name)
	}
	_, err := componentNamespaces(Options{})
	require.Error(t, err, "outside a pod, none")
	assert.True(t, usage.Is(err))
	assert.Contains(t, err.Error(), "POD_NAMESPACE")
	for _, bad := range []string{"Ichor", "a:b", ""} {
		_, err := componentNamespaces(Options{Namespace: "ichor-system", ComponentNamespaces: []string{bad}})
		require.Error(t, err, bad)
		assert.True(t, usage.Is(err), bad)
		assert.Contains(t, err.Error(), "--component-namespaces")
	}
}
