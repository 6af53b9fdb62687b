package chart

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
)

// `ichor decisions --from-cluster` finds the manager's pods by a label
// selector and reads one container's log; both must be what the chart
// renders.
func TestDecisionsFromClusterSelectsTheManagersPods(t *testing.T) {
	selector, err := labels.Parse(decisionlog.ManagerSelector)
	require.NoError(t, err)

	dep := render(t).deployment(t)

	assert.True(t, selector.Matches(labels.Set(dep.Spec.Template.Labels)), "%s selects the manager's pods (%v)", selector, dep.Spec.Template.Labels)
	assert.True(t, selector.Matches(labels.Set(dep.Spec.Selector.MatchLabels)), "%s is among the Deployment's own selector labels (%v)", selector, dep.Spec.Selector.MatchLabels)
	assert.True(t, slices.ContainsFunc(dep.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == decisionlog.ManagerContainer }),
		"the manager's container is named %s", decisionlog.ManagerContainer)
}
