package credential_test

import (
	"strings"
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
// upgrade), or one whose pins were taken away, has neither: it verifies,
// saying no lifetime (the rule then compares nothing), only where unpinned
// records are accepted. One with a lifetime and no MAC of it, or another
// lifetime than its MAC covers, never verifies.
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
	}), credential.AcceptUnpinned)
	assert.True(t, ok, why)
	assert.Equal(t, credential.Admitted{DecisionID: "decision", LifetimeSeconds: 3600}, got)

	ok, got, why = credential.Verify(key, tcr, "cluster-uid", record(nil), credential.AcceptUnpinned)
	assert.True(t, ok, "an older webhook's record: %s", why)
	assert.Equal(t, credential.Admitted{DecisionID: "decision"}, got)

	ok, got, why = credential.Verify(key, tcr, "cluster-uid", record(nil), credential.RefuseUnpinned)
	assert.False(t, ok, "a record without the lifetime verified where pins are required")
	assert.Equal(t, credential.Admitted{DecisionID: "decision"}, got)
	assert.Equal(t, "the Event ns/ichor-admission-u carries no ichor.dev/lifetime-seconds annotation nor its MAC: the record of a webhook from before the pins, or one whose pins were taken away, and the manager requires them (--require-admission-pins)", why)

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
		for _, unpinned := range []credential.Unpinned{credential.AcceptUnpinned, credential.RefuseUnpinned} {
			ok, got, why := credential.Verify(key, tcr, "cluster-uid", record(annotations), unpinned)
			assert.False(t, ok, "%s: verified", name)
			assert.NotEmpty(t, why, name)
			assert.Zero(t, got.LifetimeSeconds, name)
		}
	}
}

// A record names the credential admitted under a MAC of its own, so the
// issuer signs what the Event named; one of an older webhook, or one whose
// pins were taken away, names none and verifies, the rule then comparing
// nothing, only where unpinned records are accepted. One with a credential
// and no MAC of it, another credential than its MAC covers, or a credential
// that is not a JSON object never verifies, and hands the rule no
// credential.
func TestARecordNamesTheCredentialAdmittedUnderItsMAC(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	tcr := &ichorv1alpha1.TalosCredentialRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "u"}}
	tcr.Spec.ClusterName = "demo"
	tcr.Spec.Purpose = ichorv1alpha1.PurposeTalosconfigReader
	const reader = `{"credential":"talosconfig","kind":"talos","talos_role":"os:reader"}`
	const operator = `{"credential":"talosconfig","kind":"talos","talos_role":"os:operator"}`
	mac, err := credential.MAC(key, tcr, "ns", "cluster-uid", "decision")
	require.NoError(t, err)
	lifetimeMAC, err := credential.LifetimeMAC(key, tcr, "ns", "cluster-uid", "decision", 3600)
	require.NoError(t, err)
	credentialMAC := func(text string) string {
		m, err := credential.CredentialMAC(key, tcr, "ns", "cluster-uid", "decision", text)
		require.NoError(t, err)
		return m
	}
	record := func(annotations map[string]string) *corev1.Event {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: credential.RecordName("u"), Annotations: map[string]string{
			credential.AnnotationDecisionID: "decision", credential.AnnotationMAC: mac,
			credential.AnnotationLifetime: "3600", credential.AnnotationLifetimeMAC: lifetimeMAC,
		}}}
		for k, v := range annotations {
			if v == "-" {
				delete(e.Annotations, k)
				continue
			}
			e.Annotations[k] = v
		}
		return e
	}

	pinned := map[string]string{credential.AnnotationCredential: reader, credential.AnnotationCredentialMAC: credentialMAC(reader)}
	for _, unpinned := range []credential.Unpinned{credential.AcceptUnpinned, credential.RefuseUnpinned} {
		ok, got, why := credential.Verify(key, tcr, "cluster-uid", record(pinned), unpinned)
		assert.True(t, ok, why)
		assert.Equal(t, credential.Admitted{DecisionID: "decision", LifetimeSeconds: 3600, Credential: []byte(reader)}, got)
	}

	// Without the lifetime's annotations (stripped, or a webhook between
	// the two), the credential is still checked and named where unpinned
	// records are accepted.
	withoutLifetime := map[string]string{
		credential.AnnotationLifetime: "-", credential.AnnotationLifetimeMAC: "-",
		credential.AnnotationCredential: reader, credential.AnnotationCredentialMAC: credentialMAC(reader),
	}
	ok, got, why := credential.Verify(key, tcr, "cluster-uid", record(withoutLifetime), credential.AcceptUnpinned)
	assert.True(t, ok, why)
	assert.JSONEq(t, reader, string(got.Credential))
	ok, got, _ = credential.Verify(key, tcr, "cluster-uid", record(withoutLifetime), credential.RefuseUnpinned)
	assert.False(t, ok, "a record without the lifetime verified where pins are required")
	assert.Nil(t, got.Credential)

	ok, got, why = credential.Verify(key, tcr, "cluster-uid", record(nil), credential.AcceptUnpinned)
	assert.True(t, ok, "an older webhook's record: %s", why)
	assert.Nil(t, got.Credential)
	ok, got, why = credential.Verify(key, tcr, "cluster-uid", record(nil), credential.RefuseUnpinned)
	assert.False(t, ok, "a record without the credential verified where pins are required")
	assert.Equal(t, credential.Admitted{DecisionID: "decision"}, got, "nothing of a record that does not verify is handed on")
	assert.Contains(t, why, "carries no ichor.dev/credential annotation nor its MAC")
	assert.Contains(t, why, "--require-admission-pins")

	long := `{"credential":"` + strings.Repeat("x", credential.MaxCredential) + `"}`
	for name, annotations := range map[string]map[string]string{
		"another credential written":       {credential.AnnotationCredential: operator, credential.AnnotationCredentialMAC: credentialMAC(reader)},
		"the credential's MAC taken away":  {credential.AnnotationCredential: reader},
		"the credential taken away":        {credential.AnnotationCredentialMAC: credentialMAC(reader)},
		"not an object, under its MAC":     {credential.AnnotationCredential: `["os:reader"]`, credential.AnnotationCredentialMAC: credentialMAC(`["os:reader"]`)},
		"null, under its MAC":              {credential.AnnotationCredential: `null`, credential.AnnotationCredentialMAC: credentialMAC(`null`)},
		"too long, under its MAC":          {credential.AnnotationCredential: long, credential.AnnotationCredentialMAC: credentialMAC(long)},
		"checked without the lifetime too": {credential.AnnotationLifetime: "-", credential.AnnotationLifetimeMAC: "-", credential.AnnotationCredential: operator, credential.AnnotationCredentialMAC: credentialMAC(reader)},
	} {
		for _, unpinned := range []credential.Unpinned{credential.AcceptUnpinned, credential.RefuseUnpinned} {
			ok, got, why := credential.Verify(key, tcr, "cluster-uid", record(annotations), unpinned)
			assert.False(t, ok, "%s: verified", name)
			assert.NotEmpty(t, why, name)
			assert.Nil(t, got.Credential, name)
		}
	}
}

// A name no TalosCluster can have (a request stored before the CRD's
// pattern) names a cluster that does not exist: the issuer answers it
// (ClusterNotFound), where the client's refusal to read it was an error
// retried for ever (review of 2026-12-06). The reader is never asked.
func TestAClusterNameNoClusterCanHaveDoesNotExist(t *testing.T) {
	for _, name := range []string{"prod/x", "../prod", "Prod", "a%2Fb", strings.Repeat("a", 254)} {
		facts, c, err := credential.Cluster(t.Context(), nil, "demo", name, nil)
		require.NoError(t, err, name)
		assert.False(t, facts.Exists, name)
		assert.Nil(t, c, name)
	}
}
