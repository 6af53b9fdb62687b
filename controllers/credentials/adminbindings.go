package credentials

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
)

// An admin's own ClusterRoleBinding (issue 23). The rule names it (identity
// and nonce) and says whether it is to be made; the controller makes it
// exactly as decided, labelled as Ichor's and with no owner: a
// TalosCredentialRequest is deleted two minutes after it is answered, and the
// binding must outlive it, and a cluster-scoped object cannot be owned by a
// namespaced TalosCluster. Revocation (`ichor cluster admins revoke`, or the
// manager under --admin-kubeconfigs=false) deletes it; uninstalling Ichor
// does not (docs/credentials.md says how to remove them first).
const (
	// LabelAdminBinding marks an admin's own binding; only bindings that
	// carry it are facts of the rule and are listed by `ichor cluster admins`.
	LabelAdminBinding = "ichor.dev/admin-binding"
	// LabelManagedBy says who made it.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is LabelManagedBy's value on what the manager makes.
	ManagedBy = "ichor-policy"

	// AnnotationAdminUsername is the person's username as the API server
	// authenticated them (spec.requester), written by the manager.
	AnnotationAdminUsername = "ichor.dev/admin-username"
	// AnnotationAdminIdentity is the common name of their certificates.
	AnnotationAdminIdentity = "ichor.dev/admin-identity"
	// AnnotationDecisionID is the issuance decision that made the binding.
	AnnotationDecisionID = "ichor.dev/decision-id"
	// AnnotationCertificateExpiry is the latest expiry (RFC 3339) of a
	// certificate issued with the binding's group.
	AnnotationCertificateExpiry = "ichor.dev/certificate-expiry"
	// AnnotationRevokedBy names who revokes the binding, written by the
	// manager right before it deletes it for the operator. A person's
	// revocation leaves it unset (see RevokeBinding); the API server's audit
	// log records the DELETE and its user.
	AnnotationRevokedBy = "ichor.dev/revoked-by"

	// MaxAdminBindings bounds the bindings listed as facts of one decision.
	MaxAdminBindings = 1000
)

// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterrolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=cluster-admin,verbs=bind

// adminIdentity gathers the admins' bindings (Ichor's label) and draws the
// nonce a new one would be named with.
func (r *Reconciler) adminIdentity(ctx context.Context) (engine.AdminIdentityFacts, error) {
	var list rbacv1.ClusterRoleBindingList
	if err := r.APIReader.List(ctx, &list, AdminBindingLabels, client.Limit(MaxAdminBindings)); err != nil {
		return engine.AdminIdentityFacts{}, fmt.Errorf("list the admins' ClusterRoleBindings: %w", err)
	}
	if list.Continue != "" {
		return engine.AdminIdentityFacts{}, fmt.Errorf("more than %d ClusterRoleBindings carry %s", MaxAdminBindings, LabelAdminBinding)
	}
	facts := engine.AdminIdentityFacts{Bindings: make([]engine.AdminBindingFacts, 0, len(list.Items))}
	for i := range list.Items {
		facts.Bindings = append(facts.Bindings, BindingFacts(&list.Items[i]))
	}
	nonce := r.Nonce
	if nonce == nil {
		nonce = Nonce
	}
	var err error
	if facts.Nonce, err = nonce(); err != nil {
		return engine.AdminIdentityFacts{}, err
	}
	return facts, nil
}

// BindingFacts are a binding's name, role and subjects, as the rule reads
// them.
func BindingFacts(b *rbacv1.ClusterRoleBinding) engine.AdminBindingFacts {
	f := engine.AdminBindingFacts{
		Name:     b.Name,
		RoleRef:  engine.RoleRefFacts{APIGroup: b.RoleRef.APIGroup, Kind: b.RoleRef.Kind, Name: b.RoleRef.Name},
		Subjects: make([]engine.BindingSubjectFacts, 0, len(b.Subjects)),
	}
	for _, s := range b.Subjects {
		f.Subjects = append(f.Subjects, engine.BindingSubjectFacts{APIGroup: s.APIGroup, Kind: s.Kind, Name: s.Name, Namespace: s.Namespace})
	}
	return f
}

const nonceAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// Nonce is ten lowercase letters or digits from crypto/rand.
func Nonce() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw a nonce: %w", err)
	}
	var out strings.Builder
	for _, c := range b {
		// 256 is not a multiple of 36; the slight bias costs nothing here,
		// the nonce need only be unpredictable enough not to repeat.
		out.WriteByte(nonceAlphabet[int(c)%len(nonceAlphabet)])
	}
	return out.String(), nil
}

// bind makes the person's binding when the decision says so, and returns
// the decision's binding (nil for a credential without one).
func (r *Reconciler) bind(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, d engine.CredentialIssuance) (*engine.AdminBindingDecision, error) {
	b := d.AdminBinding
	if b == nil || !b.Create {
		return b, nil
	}
	if b.Name == "" || b.Group == "" || b.ClusterRole == "" {
		return nil, failf("the decision names an admin binding without a name, group or role")
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name:   b.Name,
			Labels: map[string]string{LabelAdminBinding: "true", LabelManagedBy: ManagedBy},
			Annotations: map[string]string{
				AnnotationAdminUsername: b.Username,
				AnnotationAdminIdentity: b.Identity,
				AnnotationDecisionID:    d.DecisionID,
			},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.ClusterRole},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.Group}},
	}
	// A name already taken (a nonce drawn twice, or a race with another
	// issuer) is retried: the next decision sees the binding that exists.
	if err := r.Client.Create(ctx, binding); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create ClusterRoleBinding %s: %w", b.Name, err)
		}
		return nil, permanent(fmt.Errorf("create ClusterRoleBinding %s: %w", b.Name, err))
	}
	log.FromContext(ctx).Info("made the admin binding", "binding", b.Name, "identity", b.Identity,
		"request", types.NamespacedName{Namespace: tcr.Namespace, Name: tcr.Name})
	return b, nil
}

// recordExpiry writes the latest certificate expiry on the binding, for
// `ichor cluster admins list`. It is a note, not a control: failing to write
// it is logged and the certificate is still handed out.
func (r *Reconciler) recordExpiry(ctx context.Context, b *engine.AdminBindingDecision, notAfter time.Time) {
	logger := log.FromContext(ctx).WithValues("binding", b.Name)
	var current rbacv1.ClusterRoleBinding
	if err := r.APIReader.Get(ctx, client.ObjectKey{Name: b.Name}, &current); err != nil {
		logger.Error(err, "read the admin binding to record the certificate's expiry")
		return
	}
	if was, err := time.Parse(time.RFC3339, current.Annotations[AnnotationCertificateExpiry]); err == nil && !notAfter.After(was) {
		return
	}
	patch := client.MergeFrom(current.DeepCopy())
	if current.Annotations == nil {
		current.Annotations = map[string]string{}
	}
	current.Annotations[AnnotationCertificateExpiry] = notAfter.UTC().Format(time.RFC3339)
	if err := r.Client.Patch(ctx, &current, patch); err != nil {
		logger.Error(err, "record the certificate's expiry on the admin binding")
	}
}

// RevokedByUnknown is the revoker of a binding deleted without a name on
// it: a person, whom the API server's audit log names (the user of the
// DELETE), and whose `ichor cluster admins revoke` wrote an Event of its own.
const RevokedByUnknown = "a person the manager cannot see: the API server's audit log names the user of the DELETE"

// RevokedByOperator is what the manager writes in AnnotationRevokedBy when
// it removes the bindings itself.
const RevokedByOperator = "the operator (--admin-kubeconfigs=false, chart value adminCredentials.enabled=false)"

// RemoveAdminBindings deletes every admin's binding, naming revokedBy on each
// first: the operator revoked admin kubeconfigs. Each is deleted with a
// precondition on what was annotated, so a binding replaced in between is
// left to the next pass.
func RemoveAdminBindings(ctx context.Context, c client.Client, revokedBy string) (int, error) {
	var list rbacv1.ClusterRoleBindingList
	if err := c.List(ctx, &list, AdminBindingLabels); err != nil {
		return 0, fmt.Errorf("list the admins' ClusterRoleBindings: %w", err)
	}
	removed := 0
	var errs []error
	for i := range list.Items {
		if !Revocable(&list.Items[i]) {
			continue
		}
		if err := RevokeBinding(ctx, c, &list.Items[i], revokedBy); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// RevokeBinding deletes the binding with c's rights, preconditioned on its
// uid (and on the version annotated, when it is). With revokedBy, it first
// annotates the binding with who revokes it: the manager does, for the
// operator. A person's revocation (`ichor cluster admins revoke`) does not:
// changing a binding to cluster-admin in any way, an annotation included,
// needs bind on cluster-admin, which deleting it does not, and a revoker
// should not need the power to grant cluster-admin.
func RevokeBinding(ctx context.Context, c client.Client, b *rbacv1.ClusterRoleBinding, revokedBy string) error {
	if revokedBy != "" {
		patch := client.MergeFromWithOptions(b.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if b.Annotations == nil {
			b.Annotations = map[string]string{}
		}
		b.Annotations[AnnotationRevokedBy] = revokedBy
		if err := c.Patch(ctx, b, patch); err != nil {
			return fmt.Errorf("annotate ClusterRoleBinding %s with its revoker: %w", b.Name, err)
		}
	}
	pre := client.Preconditions{UID: &b.UID}
	if revokedBy != "" {
		pre.ResourceVersion = &b.ResourceVersion
	}
	if err := c.Delete(ctx, b, pre); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ClusterRoleBinding %s: %w", b.Name, err)
	}
	return nil
}

// Revocation is what the decision log and the Event say of a deleted admin
// binding: whose it was (the manager's annotations), and who revoked it (the
// revoker's annotation, else unknown).
func Revocation(b *rbacv1.ClusterRoleBinding) (username, revokedBy string) {
	username = b.Annotations[AnnotationAdminUsername]
	if username == "" {
		username = "(unknown user)"
	}
	revokedBy = b.Annotations[AnnotationRevokedBy]
	if revokedBy == "" {
		revokedBy = RevokedByUnknown
	}
	return username, revokedBy
}

// AdminBindings watches the admins' bindings. It records each deletion: an
// applied record in the decision log, of the issuance decision that made the
// binding, whose action names whom and by whom, and a Normal Event
// AdminRevoked on the binding (in namespace default, where the API server
// keeps a cluster-scoped object's Events). While admin kubeconfigs are
// revoked by the operator (--admin-kubeconfigs=false) it deletes every admin
// binding, at start (the informer's first list) and whenever one appears, so
// the chart value adminCredentials.enabled=false removes them under every
// installer, without a hook.
//
// Whom is the manager's own annotation. Who revoked is the operator when the
// manager deleted it (AnnotationRevokedBy); for a person's DELETE the manager
// cannot know: nothing of the deleting user reaches the object, so the
// record says so and points to the API server's audit log, the record of the
// deleter that no client writes, beside the Event the revoker's CLI wrote
// with their own rights. A deletion made while the manager was not running
// is not seen (the informer lists what exists).
type AdminBindings struct {
	// Client deletes bindings (cached reads, label-selected by the manager).
	Client client.Client
	// Engine writes the decision log's record.
	Engine interface {
		RecordApplied(ctx context.Context, decisionID, object, action string) error
	}
	// Recorder writes the Event; nil writes none.
	Recorder events.EventRecorder
	// AdminKubeconfigs is false when the operator revoked admin kubeconfigs.
	AdminKubeconfigs bool
	// Revocations, when set, records each deletion instead of the applied
	// record and the Event above: the record of a person's act
	// (internal/manualact), written once per act, by the webhook that saw
	// who deleted or else here with the revoker unknown.
	Revocations interface {
		Revoked(ctx context.Context, b *rbacv1.ClusterRoleBinding)
	}
}

// SetupWithManager registers the watch.
func (a *AdminBindings) SetupWithManager(mgr ctrl.Manager) error {
	if a.Client == nil {
		a.Client = mgr.GetClient()
	}
	if a.Engine == nil {
		return errors.New("admin bindings controller: no engine")
	}
	enqueue := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], b *rbacv1.ClusterRoleBinding) {
		if isAdminBinding(b) {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: b.Name}})
		}
	}
	h := handler.TypedFuncs[*rbacv1.ClusterRoleBinding, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[*rbacv1.ClusterRoleBinding], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(q, e.Object)
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*rbacv1.ClusterRoleBinding], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(q, e.ObjectNew)
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*rbacv1.ClusterRoleBinding], _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if isAdminBinding(e.Object) {
				a.revoked(ctx, e.Object)
			}
		},
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("admin-bindings").
		WatchesRawSource(source.Kind(mgr.GetCache(), &rbacv1.ClusterRoleBinding{}, h)).
		Complete(a)
}

// AdminBindingLabels selects the admins' bindings: the label's value as
// Ichor writes it, the one the manager's cache watches, so that the issuer,
// the watch and the CLI see the same bindings.
var AdminBindingLabels = client.MatchingLabels{LabelAdminBinding: "true"}

func isAdminBinding(b *rbacv1.ClusterRoleBinding) bool {
	return b != nil && b.Labels[LabelAdminBinding] == "true"
}

// adminBindingPrefix begins the name of every binding Ichor makes for a
// person (data.json's person_identity, kubeconfig-admin's prefix).
const adminBindingPrefix = "ichor-admin:"

// Revocable reports whether the manager may delete the binding when the
// operator revokes admin kubeconfigs: one of Ichor's, by its label, its name
// and its role (cluster-admin). Whoever may label a binding must not have
// the manager delete system:basic-user or another binding that is not an
// admin's; an admin binding someone altered (another subject added) still
// names cluster-admin and goes. The role is the one the rule binds
// (data.json, person_identity.binding_roles).
func Revocable(b *rbacv1.ClusterRoleBinding) bool {
	return isAdminBinding(b) && strings.HasPrefix(b.Name, adminBindingPrefix) &&
		b.RoleRef == rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}
}

// Reconcile deletes an admin binding while the operator revoked admin
// kubeconfigs; otherwise it has nothing to do.
func (a *AdminBindings) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if a.AdminKubeconfigs {
		return reconcile.Result{}, nil
	}
	var b rbacv1.ClusterRoleBinding
	if err := a.Client.Get(ctx, req.NamespacedName, &b); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !Revocable(&b) {
		return reconcile.Result{}, nil
	}
	if err := RevokeBinding(ctx, a.Client, &b, RevokedByOperator); err != nil {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("removed an admin binding: the operator revoked admin kubeconfigs", "binding", b.Name)
	return reconcile.Result{}, nil
}

// revoked records the deletion of an admin binding.
func (a *AdminBindings) revoked(ctx context.Context, b *rbacv1.ClusterRoleBinding) {
	if a.Revocations != nil {
		a.Revocations.Revoked(ctx, b)
		return
	}
	username, revokedBy := Revocation(b)
	action := fmt.Sprintf("Revoked the admin binding of %q (%s) by %q", username, b.Annotations[AnnotationAdminIdentity], revokedBy)
	logger := log.FromContext(ctx).WithValues("binding", b.Name, "username", username, "revoked_by", revokedBy)
	decisionID := b.Annotations[AnnotationDecisionID]
	if err := a.Engine.RecordApplied(ctx, decisionID, "clusterrolebinding/"+b.Name, action); err != nil {
		logger.Error(err, "record the revocation in the decision log")
	}
	logger.Info("admin binding revoked")
	if a.Recorder != nil {
		note := engine.Clip(fmt.Sprintf("%s; its certificates no longer have cluster-admin", action), "", engine.MaxEventNote)
		a.Recorder.Eventf(b, nil, corev1.EventTypeNormal, ReasonAdminRevoked, "Revoke", "%s", note)
	}
}

// ReasonAdminRevoked is the reason of the Event of a revocation.
const ReasonAdminRevoked = "AdminRevoked"
