package kubeletserving

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// revisionDecider refuses every kubeconfig, under the revision it is told.
type revisionDecider struct {
	revision string
	asked    int
}

func (d *revisionDecider) Revision() string { return d.revision }

func (d *revisionDecider) Kubeconfig(context.Context, engine.KubeconfigInput) (engine.KubeconfigDecision, error) {
	d.asked++
	return engine.KubeconfigDecision{Allowed: false, Revision: d.revision, DecisionID: "d"}, nil
}

func (d *revisionDecider) KubeletServing(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error) {
	panic("not asked")
}

func (d *revisionDecider) KubeletServingRejection(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error) {
	panic("not asked")
}

func (d *revisionDecider) KubeletServingLimits(context.Context) (engine.KubeletServingLimits, error) {
	panic("not asked")
}

func (d *revisionDecider) RecordApplied(context.Context, engine.Applied) error {
	panic("not asked")
}

// A verdict lasts as long as its content and the bundle that gave it: a new
// bundle judges the same kubeconfig again.
func TestKubeconfigVerdictIsJudgedAgainByANewBundle(t *testing.T) {
	d := &revisionDecider{revision: "r1"}
	r := &Reconciler{Engine: d}
	c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	data := []byte("apiVersion: v1\nkind: Config\n")
	sum := sha256.Sum256(data)
	judge := func() {
		t.Helper()
		_, err := r.judgeKubeconfig(t.Context(), c, sum, data, r.revision())
		var refused *KubeconfigRefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, d.revision, refused.Decision.Revision)
	}
	judge()
	judge()
	assert.Equal(t, 1, d.asked, "the same content under the same bundle was judged again")
	d.revision = "r2"
	judge()
	assert.Equal(t, 2, d.asked, "a new bundle did not judge the kubeconfig again")
	judge()
	assert.Equal(t, 2, d.asked)
}
