package chart

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// TestAVerdictIsWrittenOnce (review 29 M1) installs the chart into a real
// API server: whoever may write a request's approval can give an undecided
// kubelet request its verdict, but not change the reason or message of the
// verdict it carries (a person's approval rewritten as Ichor's, or Ichor's
// as a person's); another signer's requests are not the chart's business.
func TestAVerdictIsWrittenOnce(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	cfg, _ := installedChart(t)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx := t.Context()
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	submit := func(name, signer string) *certificatesv1.CertificateSigningRequest {
		t.Helper()
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), DNSNames: []string{"worker-1"}})
		require.NoError(t, err)
		obj := csrgen.ServingObject(name, "worker-1", req)
		obj.Spec.SignerName = signer
		obj.Spec.Username, obj.Spec.Groups = "", nil // the API server sets who asked
		got, err := csrs.Create(ctx, obj, metav1.CreateOptions{})
		require.NoError(t, err)
		return got
	}
	verdict := func(csr *certificatesv1.CertificateSigningRequest, kind certificatesv1.RequestConditionType, reason, message string) error {
		t.Helper()
		now, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		require.NoError(t, err)
		now.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
			Type: kind, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastUpdateTime: metav1.Now(),
		}}
		_, err = csrs.UpdateApproval(ctx, csr.Name, now, metav1.UpdateOptions{})
		return err
	}
	refused := func(err error) bool {
		// A rewrite to an approver's reason is also refused as a new one
		// (<release>-approver-messages): either says no.
		return err != nil && (strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+release+"-verdicts'") ||
			strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+release+"-approver-messages'"))
	}

	// The policy is in force once a rewrite it forbids is refused by it
	// (each probe's verdict is another, so one made before is a change).
	probe := submit("csr-probe", certificatesv1.KubeletServingSignerName)
	require.NoError(t, verdict(probe, certificatesv1.CertificateApproved, "IchorManualApproval", "probe 0"))
	n := 0
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		n++
		return refused(verdict(probe, certificatesv1.CertificateApproved, "IchorManualApproval", "probe "+strconv.Itoa(n))), nil
	}), "the policy is not enforced, or does not type-check")

	byHand := submit("csr-by-hand", certificatesv1.KubeletServingSignerName)
	require.NoError(t, verdict(byHand, certificatesv1.CertificateApproved, "IchorManualApproval", "by ada, by hand with ichor: moved"), "a first verdict")
	assert.True(t, refused(verdict(byHand, certificatesv1.CertificateApproved, "IchorKubeletServing", "by Ichor's policy (decision 0b6f)")), "a person's approval rewritten as Ichor's")
	assert.True(t, refused(verdict(byHand, certificatesv1.CertificateApproved, "IchorManualApproval", "by bob, by hand with ichor: moved")), "the message rewritten")
	got, err := csrs.Get(ctx, byHand.Name, metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, got.Status.Conditions, 1)
	assert.Equal(t, "by ada, by hand with ichor: moved", got.Status.Conditions[0].Message)

	client := submit("csr-client", certificatesv1.KubeAPIServerClientKubeletSignerName)
	require.NoError(t, verdict(client, certificatesv1.CertificateDenied, "ByHand", "denied by ada"), "a first denial")
	assert.True(t, refused(verdict(client, certificatesv1.CertificateDenied, "IchorManualDenial", "by ada, by hand with ichor: no")), "a denial rewritten")

	// The same verdict written again is no change.
	require.NoError(t, verdict(client, certificatesv1.CertificateDenied, "ByHand", "denied by ada"))

	other := submit("csr-other", "example.com/other")
	require.NoError(t, verdict(other, certificatesv1.CertificateApproved, "Fine", "one"))
	require.NoError(t, verdict(other, certificatesv1.CertificateApproved, "Fine", "two"), "another signer's verdict is not the chart's business")
}

// TestOnlyTheManagerWritesAVerdictThatReadsAsIchors (review 62 M1): the
// recorder webhook that refuses a person's verdict ending as Ichor's
// approvers' messages do fails open, so the API server holds that line
// itself. A person's approval or denial with that ending is refused;
// without it, or written by the manager's ServiceAccount, it is not.
func TestOnlyTheManagerWritesAVerdictThatReadsAsIchors(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	cfg, _ := installedChart(t)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	asManager := rest.CopyConfig(cfg)
	asManager.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + release}
	manager, err := kubernetes.NewForConfig(asManager)
	require.NoError(t, err)
	ctx := t.Context()

	submit := func(name, signer string) {
		t.Helper()
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), DNSNames: []string{"worker-1"}})
		require.NoError(t, err)
		obj := csrgen.ServingObject(name, "worker-1", req)
		obj.Spec.SignerName = signer
		obj.Spec.Username, obj.Spec.Groups = "", nil
		_, err = cs.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	reasoned := func(as kubernetes.Interface, name string, kind certificatesv1.RequestConditionType, reason, message string) error {
		t.Helper()
		csrs := as.CertificatesV1().CertificateSigningRequests()
		now, err := cs.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		now.Status.Conditions = append(now.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: kind, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastUpdateTime: metav1.Now(),
		})
		_, err = csrs.UpdateApproval(ctx, name, now, metav1.UpdateOptions{})
		return err
	}
	verdict := func(as kubernetes.Interface, name string, kind certificatesv1.RequestConditionType, message string) error {
		t.Helper()
		return reasoned(as, name, kind, "ByHand", message)
	}
	refused := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+release+"-approver-messages'")
	}
	const ichors = "approved by policy (decision 0b6f5e0c-8a5e-4e6a-9d1b-3c2f6a7b8c9d, policy revision sha256:bfd656d1af43d1a7)"

	// The policy is in force once it refuses what it forbids.
	n := 0
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		n++
		name := "csr-probe-" + strconv.Itoa(n)
		submit(name, certificatesv1.KubeletServingSignerName)
		return refused(verdict(cs, name, certificatesv1.CertificateApproved, ichors)), nil
	}), "the policy is not enforced, or does not type-check")

	submit("csr-client", certificatesv1.KubeAPIServerClientKubeletSignerName)
	assert.True(t, refused(verdict(cs, "csr-client", certificatesv1.CertificateDenied, "no "+ichors)), "a person's denial of a client request read as Ichor's")
	// The tail followed by nothing a person reads is Ichor's to them
	// (review of 2026-12-06: white space, then a no-break space, passed),
	// and so is an approver's reason.
	for _, after := range []string{" \n", "\u00a0", "\u200b", "\u2028", "\u3000", ".", "\u3002", "\u0301", " !\t"} {
		assert.True(t, refused(verdict(cs, "csr-client", certificatesv1.CertificateDenied, ichors+after)), "a tail followed by %q", after)
	}
	assert.True(t, refused(reasoned(cs, "csr-client", certificatesv1.CertificateDenied, "IchorKubeletClient", "checked by hand")), "an approver's reason")
	// Failed through /approval stops the signer as a denial would, and no
	// one's decision is recorded (review of 2026-12-06).
	assert.True(t, refused(reasoned(cs, "csr-client", certificatesv1.CertificateFailed, "ByHand", "failed by hand")), "a Failed condition through /approval")
	// A decision quoted with words after it (a person overruling it), or a
	// little off, is a person's to write.
	require.NoError(t, verdict(cs, "csr-client", certificatesv1.CertificateDenied, "overrules "+ichors+": node retired"))

	submit("csr-serving", certificatesv1.KubeletServingSignerName)
	require.NoError(t, reasoned(manager, "csr-serving", certificatesv1.CertificateApproved, "IchorKubeletServing", ichors), "the manager's own verdict")

	submit("csr-other", "example.com/other")
	require.NoError(t, verdict(cs, "csr-other", certificatesv1.CertificateApproved, ichors), "another signer's verdict is not the chart's business")
}
