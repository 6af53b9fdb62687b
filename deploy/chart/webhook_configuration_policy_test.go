package chart

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// TestTheManagerChangesOnlyItsWebhooksCABundle (the hostile review of
// 2026-12-05) installs the chart into a real API server and acts as the
// manager's service account, which RBAC lets patch its webhook
// configuration: the chart's ValidatingAdmissionPolicy lets it set each
// webhook's CA bundle, as webhookcerts does, and nothing else (another
// server, wider rules, failing every write); an administrator's changes are
// not the policy's business.
func TestTheManagerChangesOnlyItsWebhooksCABundle(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	cfg, _ := installedChart(t)
	admin, err := client.New(cfg, client.Options{})
	require.NoError(t, err)
	manager := asTheManager(t, cfg)
	ctx := t.Context()
	const policy = release + "-webhook-configuration"
	refused := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
	}
	// change has the manager patch its configuration with edit applied to
	// a copy of what is stored.
	change := func(edit func(*admissionregistrationv1.ValidatingWebhookConfiguration), opts ...client.PatchOption) error {
		t.Helper()
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		require.NoError(t, admin.Get(ctx, client.ObjectKey{Name: release + "-webhook"}, &vwc))
		require.NotEmpty(t, vwc.Webhooks)
		orig := vwc.DeepCopy()
		edit(&vwc)
		return manager.Patch(ctx, &vwc, client.MergeFrom(orig), opts...)
	}
	widen := func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
		vwc.Webhooks[0].Rules = append(vwc.Webhooks[0].Rules, admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
		})
	}

	// The policy is in force once a change it forbids is refused by it; its
	// expressions must type-check.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := admin.Get(ctx, client.ObjectKey{Name: policy}, &p); err != nil {
			return false, err
		}
		if tc := p.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
			return false, assert.AnError
		}
		return refused(change(widen, client.DryRunAll)), nil
	}), "the policy is not enforced, or does not type-check")

	for what, edit := range map[string]func(*admissionregistrationv1.ValidatingWebhookConfiguration){
		"wider rules": widen,
		"another server": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.Webhooks[0].ClientConfig.Service = nil
			vwc.Webhooks[0].ClientConfig.URL = ptr.To("https://collector.example.com/")
		},
		"another path": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.Webhooks[0].ClientConfig.Service.Path = ptr.To("/elsewhere")
		},
		"fail open": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		},
		"no match conditions": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			for i := range vwc.Webhooks {
				vwc.Webhooks[i].MatchConditions = nil
			}
		},
		"a selector": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.Webhooks[0].NamespaceSelector.MatchLabels = map[string]string{"skip": "me"}
		},
		"a webhook less": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.Webhooks = vwc.Webhooks[1:]
		},
		"an owner the garbage collector would follow": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Namespace", Name: "gone", UID: "00000000-0000-0000-0000-000000000000"}}
		},
		"a finalizer": func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
			vwc.Finalizers = []string{"example.com/hold"}
		},
	} {
		assert.True(t, refused(change(edit)), "the manager's change was not refused: %s", what)
	}

	// What webhookcerts does: the CA bundle of every webhook.
	require.NoError(t, change(func(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
		for i := range vwc.Webhooks {
			vwc.Webhooks[i].ClientConfig.CABundle = []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
		}
	}))
	// An administrator's change is not matched.
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, admin.Get(ctx, client.ObjectKey{Name: release + "-webhook"}, &vwc))
	orig := vwc.DeepCopy()
	vwc.Webhooks[0].TimeoutSeconds = ptr.To[int32](5)
	require.NoError(t, admin.Patch(ctx, &vwc, client.MergeFrom(orig)))
}
