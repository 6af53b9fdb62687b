// Package credentials is the issuer of TalosCredentialRequests (ADR 0124,
// KEP-4214).
//
// For a request not answered yet it asks the issuance decision again (so a
// request admitted under an older policy, or created while the webhook was
// bypassed, is held to the current caps), signs what the decision names for
// the requester's public key, and answers in the status: the certificate, the
// trust bundle, the expiry and the Ready condition (Issued, Refused with the
// policy's reasons, or Failed). A refusal carries no certificate. Talos
// credentials are signed by the cluster's OS CA with the Talos role as the only
// O=; Kubernetes credentials by the cluster's Kubernetes CA with the decision's
// groups as O= and its common name as CN. During a CA rotation the current CA
// signs and the trust bundle holds the current and the previous one.
//
// A credential whose groups include AdminGroup is useful only while the
// ClusterRoleBinding AdminBinding exists. It is installed with Ichor; the
// controller only checks it, and issues no such credential while it is
// missing, so deleting it revokes every such credential at once and for good.
//
// A request is deleted Retention (two minutes) after it was answered.
package credentials

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"slices"
	"time"

	siderox509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/clustersecrets"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/taloscert"
)

// DefaultRetention is how long an answered request is kept (ADR 0108): long
// enough for the requester to read the answer, short enough that requests do
// not pile up.
const DefaultRetention = 2 * time.Minute

// The revocable cluster-admin group of KEP-4214 and the binding that gives it
// cluster-admin in the cluster the controller runs against.
const (
	AdminGroup   = "ichor:cluster-admins"
	AdminBinding = "ichor:cluster-admins"
	// AdminClusterRole is the built-in role the binding grants.
	AdminClusterRole = "cluster-admin"
)

// LabelManagedBy marks the binding the controller created.
const LabelManagedBy = "app.kubernetes.io/managed-by"

// +kubebuilder:rbac:groups=ichor.dev,resources=taloscredentialrequests,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=ichor.dev,resources=taloscredentialrequests/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterrolebindings,resourceNames=ichor:cluster-admins,verbs=get

// Reconciler issues TalosCredentialRequests.
type Reconciler struct {
	// Client reads requests and clusters and writes status, the deletion and
	// the admin binding.
	Client client.Client
	// APIReader reads the secrets Secret directly, so the manager needs get
	// on that Secret only.
	APIReader client.Reader
	Engine    *engine.Engine

	// Retention is how long an answered request is kept; DefaultRetention
	// if zero.
	Retention time.Duration
	// Now is the clock; time.Now if nil.
	Now func() time.Time
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Engine == nil {
		return errors.New("credentials controller: no engine")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("credentials").
		For(&ichorv1alpha1.TalosCredentialRequest{}).
		Complete(r)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) retention() time.Duration {
	if r.Retention > 0 {
		return r.Retention
	}
	return DefaultRetention
}

// Reconcile answers a new request, and deletes an answered one once its
// retention has passed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// controller-runtime's logger already names the request.
	var tcr ichorv1alpha1.TalosCredentialRequest
	if err := r.Client.Get(ctx, req.NamespacedName, &tcr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ready := meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady); ready != nil {
		return r.expire(ctx, &tcr, ready)
	}
	answer, err := r.answer(ctx, &tcr)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.Client.Status().Update(ctx, answer); err != nil {
		return reconcile.Result{}, fmt.Errorf("write the answer: %w", err)
	}
	return reconcile.Result{RequeueAfter: r.retention()}, nil
}

// expire deletes a request whose answer is older than the retention.
func (r *Reconciler) expire(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, ready *metav1.Condition) (reconcile.Result, error) {
	left := ready.LastTransitionTime.Add(r.retention()).Sub(r.now())
	if left > 0 {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	// Preconditioned on the UID, so a new request of the same name is not
	// deleted in its place.
	err := r.Client.Delete(ctx, tcr, client.Preconditions{UID: &tcr.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("delete the answered request: %w", err)
	}
	log.FromContext(ctx).V(1).Info("deleted the answered request", "answered", ready.LastTransitionTime)
	return reconcile.Result{}, nil
}

// answer returns the request with its status answered: issued, refused or
// failed. An error means the answer could not be found yet (the API server
// did not answer, the engine failed) and the request is retried.
func (r *Reconciler) answer(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest) (*ichorv1alpha1.TalosCredentialRequest, error) {
	logger := log.FromContext(ctx)
	out := tcr.DeepCopy()
	out.Status.ObservedGeneration = tcr.Generation

	keyFacts, publicKey := engine.ParsePublicKey(tcr.Spec.PublicKey)
	d, err := r.Engine.Issuance(ctx, engine.CredentialIssuanceInput{
		Purpose:    string(tcr.Spec.Purpose),
		TTLSeconds: ttlSeconds(tcr.Spec.TTL),
		PublicKey:  keyFacts,
	})
	if err != nil {
		return nil, fmt.Errorf("decide issuance: %w", err)
	}
	logger = logger.WithValues("decision_id", d.DecisionID, "purpose", d.Purpose, "allowed", d.Allowed)
	if !d.Allowed {
		logger.Info("refused")
		setReady(out, r.now(), metav1.ConditionFalse, ichorv1alpha1.ReasonRefused, fmt.Sprintf("%s (decision %s)", engine.Messages(d.Reasons), d.DecisionID))
		return out, nil
	}

	issued, err := r.issue(ctx, tcr, d, publicKey)
	var failed *failure
	switch {
	case errors.As(err, &failed):
		logger.Error(err, "failed")
		setReady(out, r.now(), metav1.ConditionFalse, ichorv1alpha1.ReasonFailed, fmt.Sprintf("%v (decision %s)", err, d.DecisionID))
		return out, nil
	case err != nil:
		return nil, err
	}
	out.Status.Certificate = string(issued.certificate)
	out.Status.TrustBundle = string(issued.trustBundle)
	out.Status.ExpiresAt = &metav1.Time{Time: issued.notAfter}
	setReady(out, r.now(), metav1.ConditionTrue, ichorv1alpha1.ReasonIssued, fmt.Sprintf("%s; expires at %s (decision %s)",
		engine.Messages(d.Reasons), issued.notAfter.UTC().Format(time.RFC3339), d.DecisionID))
	logger.Info("issued", "expiresAt", issued.notAfter)
	return out, nil
}

// failure is an error that answers the request (Failed) rather than being
// retried: the cluster or its secrets are missing or unusable, or the
// decision names something this controller cannot sign.
type failure struct{ err error }

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func failf(format string, args ...any) error {
	return &failure{fmt.Errorf(format, args...)}
}

// permanent is a failure when retrying will not change the answer: the API
// server said not found, forbidden or invalid, or the secrets bundle is
// unusable. Anything else (a timeout, a refused connection, a conflict) is
// the error to retry.
func permanent(err error) error {
	if err == nil {
		return nil
	}
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		errors.Is(err, clustersecrets.ErrInvalid) {
		return &failure{err}
	}
	return err
}

type issued struct {
	certificate []byte
	trustBundle []byte
	notAfter    time.Time
}

func (r *Reconciler) issue(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, d engine.CredentialIssuance, publicKey crypto.PublicKey) (issued, error) {
	var cluster ichorv1alpha1.TalosCluster
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: tcr.Namespace, Name: tcr.Spec.ClusterName}, &cluster); err != nil {
		return issued{}, permanent(fmt.Errorf("TalosCluster %s/%s: %w", tcr.Namespace, tcr.Spec.ClusterName, err))
	}
	bundles, err := clustersecrets.Load(ctx, r.APIReader, &cluster)
	if err != nil {
		return issued{}, permanent(err)
	}
	// Whole seconds (the rule refuses anything else); NotBefore is now,
	// truncated, so NotAfter is exactly the lifetime later.
	lifetime := time.Duration(d.LifetimeSeconds) * time.Second
	notBefore := r.now().Truncate(time.Second)
	cert := d.Certificate

	switch cert.Kind {
	case engine.CertificateKindTalos:
		ca, err := taloscert.ParseCA(bundles.Current.Certs.OS.Crt, bundles.Current.Certs.OS.Key)
		if err != nil {
			return issued{}, failf("cluster %s/%s: %w", cluster.Namespace, cluster.Name, err)
		}
		pemCert, err := ca.Issue(taloscert.ClientCertificate{
			Role:       cert.TalosRole,
			PublicKey:  publicKey,
			CommonName: "ichor-credential:" + d.Purpose,
			NotBefore:  notBefore,
			Lifetime:   lifetime,
		})
		if err != nil {
			return issued{}, failf("sign the %s certificate: %w", cert.TalosRole, err)
		}
		return issued{certificate: pemCert, trustBundle: trust(bundles.Current.Certs.OS, osCA(bundles.Previous)), notAfter: notBefore.Add(lifetime)}, nil

	case engine.CertificateKindKubernetes:
		if cluster.Spec.KubeconfigRef != nil {
			// The admin binding would have to be kept in that cluster, through
			// a client this controller does not build yet.
			return issued{}, failf("cluster %s/%s judges another API server (spec.kubeconfigRef); Kubernetes credentials are only issued for the cluster Ichor runs in", cluster.Namespace, cluster.Name)
		}
		if slices.Contains(cert.Groups, AdminGroup) {
			if err := r.checkAdminBinding(ctx); err != nil {
				return issued{}, err
			}
		}
		ca, err := taloscert.ParseCA(bundles.Current.Certs.K8s.Crt, bundles.Current.Certs.K8s.Key)
		if err != nil {
			return issued{}, failf("the Kubernetes CA: %w", err)
		}
		pemCert, err := ca.IssueKubernetes(taloscert.KubernetesClientCertificate{
			CommonName: cert.CommonName, Groups: cert.Groups, PublicKey: publicKey, NotBefore: notBefore, Lifetime: lifetime,
		})
		if err != nil {
			return issued{}, failf("sign the Kubernetes client certificate: %w", err)
		}
		return issued{certificate: pemCert, trustBundle: trust(bundles.Current.Certs.K8s, k8sCA(bundles.Previous)), notAfter: notBefore.Add(lifetime)}, nil

	default:
		return issued{}, failf("the decision names a certificate of kind %q, which this controller does not sign", cert.Kind)
	}
}

// checkAdminBinding refuses an admin kubeconfig while the binding of
// AdminGroup to cluster-admin is missing. The binding is installed with Ichor
// (the Helm chart) and never created here: deleting it is how every admin
// kubeconfig is revoked at once (KEP-4214), and a controller that recreated it
// on the next issuance would silently restore the revoked ones, a leaked one
// included. An operator restores it, after rotating the Kubernetes CA.
func (r *Reconciler) checkAdminBinding(ctx context.Context) error {
	var binding rbacv1.ClusterRoleBinding
	err := r.APIReader.Get(ctx, client.ObjectKey{Name: AdminBinding}, &binding)
	switch {
	case apierrors.IsNotFound(err):
		return failf("the ClusterRoleBinding %s does not exist, so admin kubeconfigs are revoked: "+
			"after a compromise rotate the Kubernetes CA, then restore the binding (kubectl create clusterrolebinding %s --clusterrole=%s --group=%s, or reinstall the chart)",
			AdminBinding, AdminBinding, AdminClusterRole, AdminGroup)
	case err != nil:
		return fmt.Errorf("get ClusterRoleBinding %s: %w", AdminBinding, err)
	}
	return nil
}

// trust is the current CA certificate, then the previous one when a
// rotation is in progress and it differs.
func trust(current, previous *siderox509.PEMEncodedCertificateAndKey) []byte {
	out := slices.Clone(current.Crt)
	if previous != nil && len(previous.Crt) > 0 && string(previous.Crt) != string(current.Crt) {
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		out = append(out, previous.Crt...)
	}
	return out
}

func osCA(previous *secrets.Bundle) *siderox509.PEMEncodedCertificateAndKey {
	if previous == nil || previous.Certs == nil {
		return nil
	}
	return previous.Certs.OS
}

func k8sCA(previous *secrets.Bundle) *siderox509.PEMEncodedCertificateAndKey {
	if previous == nil || previous.Certs == nil {
		return nil
	}
	return previous.Certs.K8s
}

// setReady answers the request. Only an issued answer carries a
// certificate.
func setReady(tcr *ichorv1alpha1.TalosCredentialRequest, now time.Time, status metav1.ConditionStatus, reason, message string) {
	if reason != ichorv1alpha1.ReasonIssued {
		tcr.Status.Certificate, tcr.Status.TrustBundle, tcr.Status.ExpiresAt = "", "", nil
	}
	meta.SetStatusCondition(&tcr.Status.Conditions, metav1.Condition{
		Type:               ichorv1alpha1.ConditionReady,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: tcr.Generation,
		// The retention is counted from here, on the reconciler's clock.
		LastTransitionTime: metav1.NewTime(now),
	})
}

func ttlSeconds(ttl *metav1.Duration) *float64 {
	if ttl == nil {
		return nil
	}
	s := ttl.Seconds()
	return &s
}
