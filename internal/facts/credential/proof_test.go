package credential_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
)

// A record says the lifetime admitted, under its MAC; one written by a
// webhook from before the lifetime was recorded (a rolling upgrade) still
// verifies, saying none, and the rule then compares nothing.
func TestARecordSaysTheLifetimeAdmittedUnderItsMAC(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	tcr := &ichorv1alpha1.TalosCredentialRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "u"}}
	tcr.Spec.ClusterName = "demo"
	tcr.Spec.Purpose = ichorv1alpha1.PurposeTalosconfigReader
	record := func(lifetime int64, annotation string) *corev1.Event {
		mac, err := credential.MAC(key, tcr, "ns", "cluster-uid", "decision", lifetime)
		require.NoError(t, err)
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: credential.RecordName("u"), Annotations: map[string]string{
			credential.AnnotationDecisionID: "decision", credential.AnnotationMAC: mac,
		}}}
		if annotation != "" {
			e.Annotations[credential.AnnotationLifetime] = annotation
		}
		return e
	}

	ok, admitted, why := credential.Verify(key, tcr, "cluster-uid", record(3600, "3600"))
	assert.True(t, ok, why)
	assert.Equal(t, credential.Admitted{DecisionID: "decision", LifetimeSeconds: 3600}, admitted)

	ok, admitted, why = credential.Verify(key, tcr, "cluster-uid", record(0, ""))
	assert.True(t, ok, "an older webhook's record: %s", why)
	assert.Equal(t, credential.Admitted{DecisionID: "decision"}, admitted)

	for name, e := range map[string]*corev1.Event{
		"another lifetime written":         record(3600, "7200"),
		"the lifetime taken away":          record(3600, ""),
		"a lifetime added to an older one": record(0, "3600"),
	} {
		ok, _, why := credential.Verify(key, tcr, "cluster-uid", e)
		assert.False(t, ok, "%s: verified", name)
		assert.Contains(t, why, "does not match", name)
	}
}
