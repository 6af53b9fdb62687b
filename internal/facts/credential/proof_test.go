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

// A record says the lifetime admitted under a MAC of its own, beside the
// MAC an older issuer reads; one written by an older webhook (a rolling
// upgrade) has neither and still verifies, saying no lifetime, and the rule
// then compares nothing. One with a lifetime and no MAC of it, or another
// lifetime than its MAC covers, does not verify.
func TestARecordSaysTheLifetimeAdmittedUnderItsMAC(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	tcr := &ichorv1alpha1.TalosCredentialRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "u"}}
	tcr.Spec.ClusterName = "demo"
	tcr.Spec.Purpose = ichorv1alpha1.PurposeTalosconfigReader
	mac, err := credential.MAC(key, tcr, "ns", "cluster-uid", "decision")
	require.NoError(t, err)
	lifetimeMAC, err := credential.LifetimeMAC(key, tcr, "ns", "cluster-uid", "decision", 3600)
	require.NoError(t, err)
	record := func(annotations map[string]string) *corev1.Event {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: credential.RecordName("u"), Annotations: map[string]string{
			credential.AnnotationDecisionID: "decision", credential.AnnotationMAC: mac,
		}}}
		for k, v := range annotations {
			e.Annotations[k] = v
		}
		return e
	}

	ok, got, why := credential.Verify(key, tcr, "cluster-uid", record(map[string]string{
		credential.AnnotationLifetime: "3600", credential.AnnotationLifetimeMAC: lifetimeMAC,
	}))
	assert.True(t, ok, why)
	assert.Equal(t, credential.Admitted{DecisionID: "decision", LifetimeSeconds: 3600}, got)

	ok, got, why = credential.Verify(key, tcr, "cluster-uid", record(nil))
	assert.True(t, ok, "an older webhook's record: %s", why)
	assert.Equal(t, credential.Admitted{DecisionID: "decision"}, got)

	for name, annotations := range map[string]map[string]string{
		"another lifetime written":      {credential.AnnotationLifetime: "7200", credential.AnnotationLifetimeMAC: lifetimeMAC},
		"the lifetime's MAC taken away": {credential.AnnotationLifetime: "3600"},
		"the lifetime taken away":       {credential.AnnotationLifetimeMAC: lifetimeMAC},
		"leading zeros":                 {credential.AnnotationLifetime: "03600", credential.AnnotationLifetimeMAC: lifetimeMAC},
		"a sign":                        {credential.AnnotationLifetime: "+3600", credential.AnnotationLifetimeMAC: lifetimeMAC},
		"a fraction":                    {credential.AnnotationLifetime: "3600.0", credential.AnnotationLifetimeMAC: lifetimeMAC},
		"none":                          {credential.AnnotationLifetime: "", credential.AnnotationLifetimeMAC: lifetimeMAC},
		"the MAC of another request":    {credential.AnnotationMAC: "x", credential.AnnotationLifetime: "3600", credential.AnnotationLifetimeMAC: lifetimeMAC},
	} {
		ok, got, why := credential.Verify(key, tcr, "cluster-uid", record(annotations))
		assert.False(t, ok, "%s: verified", name)
		assert.NotEmpty(t, why, name)
		assert.Zero(t, got.LifetimeSeconds, name)
	}
}
