package credentials

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
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

	// MaxAdminBindings bounds one requester's bindings to their role (only
	// holders of bind on it can make them) listed as facts of one decision.
	MaxAdminBindings = 1000
)

// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterrolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=cluster-admin,verbs=bind

// IndexAdminIdentity indexes the admins' bindings in the manager's cache by
// the identity their name begins with: the name up to its last ":", the rule's
// identity:nonce. The issuer reads a requester's bindings through it, so a
// request costs no list of every labelled binding, and bindings named after
// someone else are never its facts.
const IndexAdminIdentity = "ichor.dev/admin-identity"

// IndexAdminBindings registers IndexAdminIdentity with the cache that holds
// the admins' bindings, before it starts.
func IndexAdminBindings(ctx context.Context, indexer client.FieldIndexer) error {
	err := indexer.IndexField(ctx, &rbacv1.ClusterRoleBinding{}, IndexAdminIdentity, func(o client.Object) []string {
		name := o.GetName()
		if i := strings.LastIndexByte(name, ':'); i > 0 {
			return []string{name[:i]}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index the admins' ClusterRoleBindings by identity: %w", err)
	}
	return nil
}

// ignoredBindings counts the labelled bindings named after a requester that
// bind another role than theirs: whoever may create bindings can make one
// (RBAC lets them bind a role whose permissions they hold), so they are not
// Ichor's, refuse nobody and serve nobody; a count that grows is someone
// planting them.
var ignoredBindings = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ichor_admin_bindings_ignored_total",
	Help: "Labelled ClusterRoleBindings named after an admin kubeconfig's requester that bind another role than Ichor's, ignored when the request was decided (not Ichor's: someone made them).",
})

func init() {
	ctrlmetrics.Registry.MustRegister(ignoredBindings)
}

// adminIdentity gathers the requester's admin bindings, as their purpose's
// requirements name them (identity and role), from the cache, and draws the
// nonce a new one would be named with. A labelled binding of their name to
// another role is left out, counted and logged: it is not Ichor's.
func (r *Reconciler) adminIdentity(ctx context.Context, want engine.AdminBindingRequirement) (engine.AdminIdentityFacts, error) {
	if r.Bindings == nil {
		return engine.AdminIdentityFacts{}, errors.New("no reader of the admins' ClusterRoleBindings")
	}
	var list rbacv1.ClusterRoleBindingList
	if err := r.Bindings.List(ctx, &list, AdminBindingLabels, client.MatchingFields{IndexAdminIdentity: want.Identity}); err != nil {
		return engine.AdminIdentityFacts{}, fmt.Errorf("list the ClusterRoleBindings of %s: %w", want.Identity, err)
	}
	role := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: want.ClusterRole}
	facts := engine.AdminIdentityFacts{Bindings: make([]engine.AdminBindingFacts, 0, len(list.Items))}
	var ignored []string
	for i := range list.Items {
		if list.Items[i].RoleRef != role {
			ignored = append(ignored, list.Items[i].Name)
			continue
		}
		facts.Bindings = append(facts.Bindings, BindingFacts(&list.Items[i]))
	}
	if len(ignored) > 0 {
		ignoredBindings.Add(float64(len(ignored)))
		slices.Sort(ignored)
		log.FromContext(ctx).Info("ignored labelled ClusterRoleBindings named after the requester that bind another role: not Ichor's",
			"identity", want.Identity, "role", want.ClusterRole, "ignored", len(ignored), "bindings", ignored[:min(len(ignored), 10)])
	}
	// Only holders of bind on the role can make more; a bound on the input.
	if len(facts.Bindings) > MaxAdminBindings {
		return engine.AdminIdentityFacts{}, fmt.Errorf("more than %d ClusterRoleBindings of %s to %s", MaxAdminBindings, want.Identity, want.ClusterRole)
	}
	slices.SortFunc(facts.Bindings, func(a, b engine.AdminBindingFacts) int { return strings.Compare(a.Name, b.Name) })
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

// The one role the manager binds, which its RBAC (bind on cluster-admin by
// name) and the chart's ValidatingAdmissionPolicy hold it to.
var clusterAdmin = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}

// adminBindingName is the name of every binding Ichor makes for a person:
// the admin identity (identity.rego: "ichor-admin:", "u:" and the username,
// or "h:" and hex) then ":" and a nonce.
var adminBindingName = regexp.MustCompile(`^ichor-admin:(u:.+|h:[0-9a-f]+):[a-z0-9]{10}$`)

var nonceForm = regexp.MustCompile(`^[a-z0-9]{10}$`)

// AdminBindingShape reports how b differs from what Ichor makes of a
// person's binding, nil if it does not: a name of the form
// ichor-admin:(u|h):…:NONCE, Ichor's label, cluster-admin as the role and,
// as the only subject, the group named as the binding. The manager creates
// nothing else and reuses, annotates or deletes nothing else for a person;
// the chart's ValidatingAdmissionPolicy holds its service account to the
// same.
func AdminBindingShape(b *rbacv1.ClusterRoleBinding) error {
	var problems []string
	if !adminBindingName.MatchString(b.Name) {
		problems = append(problems, fmt.Sprintf("its name %q is not %sIDENTITY:NONCE", b.Name, adminBindingPrefix))
	}
	if !isAdminBinding(b) {
		problems = append(problems, fmt.Sprintf("it lacks the label %s=true", LabelAdminBinding))
	}
	if b.RoleRef != clusterAdmin {
		problems = append(problems, fmt.Sprintf("its role is %s %q, not the ClusterRole cluster-admin", b.RoleRef.Kind, b.RoleRef.Name))
	}
	if want := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.Name}}; !slices.Equal(b.Subjects, want) {
		problems = append(problems, "its subjects are not exactly the group named as the binding")
	}
	if len(problems) > 0 {
		return fmt.Errorf("ClusterRoleBinding %q is not an admin binding as Ichor makes it: %s", b.Name, strings.Join(problems, "; "))
	}
	return nil
}

// checkBindingDecision holds the decision's binding to what Ichor makes for
// this request, before anything is written or signed: Go does not trust a
// bundle with the power to bind cluster-admin (review 2, F3). The binding
// must be the requester's (the identity the requirements named for their
// username), named IDENTITY:NONCE with the nonce Go drew (or one Go listed,
// to reuse), grant cluster-admin to its own group, and be the certificate's
// only group, with the identity as its common name.
func checkBindingDecision(b *engine.AdminBindingDecision, d engine.CredentialIssuance, g gathered, requester string) error {
	want := g.adminBinding
	if want == nil {
		// A bundle older than this manager names no admin binding in its
		// requirements: Go then knows no identity to hold it to.
		return errors.New("the decision names an admin binding for a purpose whose requirements name none (is the policy bundle older than the manager?)")
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if b.Identity != want.Identity || !strings.HasPrefix(b.Identity, adminBindingPrefix) {
		add("its identity %q is not the requester's, %q", b.Identity, want.Identity)
	}
	if b.Username != requester {
		add("its username %q is not the requester's, %q", b.Username, requester)
	}
	if b.ClusterRole != clusterAdmin.Name || want.ClusterRole != clusterAdmin.Name {
		add("its role %q is not cluster-admin", b.ClusterRole)
	}
	if b.Group != b.Name {
		add("its group %q is not its name %q", b.Group, b.Name)
	}
	nonce, ok := strings.CutPrefix(b.Name, b.Identity+":")
	switch {
	case !ok || !nonceForm.MatchString(nonce) || !adminBindingName.MatchString(b.Name):
		add("its name %q is not the identity, \":\" and a nonce", b.Name)
	case b.Create && nonce != g.in.AdminIdentity.Nonce:
		add("a new binding's name %q does not end in the nonce drawn for it", b.Name)
	case !b.Create && !slices.ContainsFunc(g.in.AdminIdentity.Bindings, func(f engine.AdminBindingFacts) bool { return f.Name == b.Name }):
		add("it reuses %q, which is not one of the requester's bindings", b.Name)
	}
	if c := d.Certificate; c == nil || c.Kind != engine.CertificateKindKubernetes || c.CommonName != b.Identity || !slices.Equal(c.Groups, []string{b.Group}) {
		add("the certificate is not a Kubernetes one whose common name is the identity and whose only group is the binding")
	}
	if len(problems) > 0 {
		return fmt.Errorf("the decision's admin binding is not what Ichor makes for this request: %s", strings.Join(problems, "; "))
	}
	return nil
}

// ReasonAdminBindingRefused is the reason of the Warning Event on a request
// whose decision named a binding Go will not write.
const ReasonAdminBindingRefused = "AdminBindingRefused"

// bind makes the person's binding when the decision says so, or checks the
// one it reuses, and returns it (nil for a credential without one).
func (r *Reconciler) bind(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, d engine.CredentialIssuance, g gathered) (*rbacv1.ClusterRoleBinding, error) {
	b := d.AdminBinding
	if b == nil {
		if g.adminBinding != nil {
			// An admin kubeconfig without its binding would be signed
			// with whatever groups the decision names.
			return nil, r.refuseBinding(ctx, errors.New("the decision allows an admin kubeconfig without its admin binding"))
		}
		return nil, nil
	}
	if err := checkBindingDecision(b, d, g, tcr.Spec.Requester.Username); err != nil {
		return nil, r.refuseBinding(ctx, err)
	}
	if !b.Create {
		return r.reused(ctx, tcr, b.Name)
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
		RoleRef:  clusterAdmin,
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.Group}},
	}
	if err := AdminBindingShape(binding); err != nil {
		return nil, r.refuseBinding(ctx, err)
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
	// The person's next request is decided on the cache: wait until it
	// holds the binding, so that it is reused rather than doubled.
	if err := r.untilCached(ctx, b.Name, true); err != nil {
		log.FromContext(ctx).Error(err, "the cache has not seen the new admin binding; a request of the same person may make another", "binding", b.Name)
	}
	return binding, nil
}

// reused reads, from the API server, the binding the decision reuses, which
// it found in the cache: it must still exist and be Ichor's shape. Gone
// (revoked a moment ago) or changed, the request is decided again once the
// cache has caught up, rather than signed for a group nothing binds. One
// being deleted, or with finalizers, fails the request (review 3, F4).
func (r *Reconciler) reused(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, name string) (*rbacv1.ClusterRoleBinding, error) {
	var current rbacv1.ClusterRoleBinding
	err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, &current)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.untilCached(ctx, name, false); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("the admin binding %s the decision reuses was deleted since it was listed; deciding again", name)
	case err != nil:
		return nil, fmt.Errorf("get the admin binding %s: %w", name, err)
	}
	if err := AdminBindingShape(&current); err != nil {
		return nil, fmt.Errorf("the admin binding the decision reuses changed since it was listed; deciding again: %w", err)
	}
	if current.DeletionTimestamp != nil || len(current.Finalizers) > 0 {
		// Being revoked, or held against a revocation (anyone who may
		// patch it can add a finalizer, no bind needed): never sign for
		// it. The request fails; the person asks again once it is gone.
		return nil, r.refuseBinding(ctx, fmt.Errorf("the admin binding %s the decision reuses is being deleted (since %v) or held by finalizers %q: revoke it, remove its finalizers, and ask again",
			name, current.DeletionTimestamp, current.Finalizers))
	}
	return &current, nil
}

// cacheWait bounds the wait for the cache to see a binding made or deleted.
const cacheWait = 10 * time.Second

// untilCached waits until the cache holds the binding (present) or no
// longer does.
func (r *Reconciler) untilCached(ctx context.Context, name string, present bool) error {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, cacheWait, true, func(ctx context.Context) (bool, error) {
		err := r.Bindings.Get(ctx, client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		return (err == nil) == present, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the cache to see ClusterRoleBinding %s (present: %t): %w", name, present, err)
	}
	return nil
}

// refuseBinding fails the request: nothing is bound or signed, and a Warning
// Event says why, for the person and the operator, once the answer is stored
// (review 161: written at once, it stayed on a request whose answer failed
// to store and that was issued when decided again).
func (*Reconciler) refuseBinding(ctx context.Context, err error) error {
	log.FromContext(ctx).Error(err, "refused to write the decision's admin binding")
	return &failure{err: err, warn: &warning{reason: ReasonAdminBindingRefused, action: "Bind", note: engine.Clip("nothing bound or signed: "+err.Error(), "", engine.MaxEventNote)}}
}

// recordExpiry writes the latest certificate expiry on the binding, for
// `ichor cluster admins list`. It is a note, not a control: failing to write
// it is logged and the certificate is still handed out.
func (r *Reconciler) recordExpiry(ctx context.Context, current *rbacv1.ClusterRoleBinding, notAfter time.Time) {
	logger := log.FromContext(ctx).WithValues("binding", current.Name)
	if was, err := time.Parse(time.RFC3339, current.Annotations[AnnotationCertificateExpiry]); err == nil && !notAfter.After(was) {
		return
	}
	patch := client.MergeFrom(current.DeepCopy())
	if current.Annotations == nil {
		current.Annotations = map[string]string{}
	}
	current.Annotations[AnnotationCertificateExpiry] = notAfter.UTC().Format(time.RFC3339)
	if err := r.Client.Patch(ctx, current, patch); err != nil {
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
	if revokedBy != "" && len(b.Finalizers) > 0 {
		return releaseFinalizers(ctx, c, b)
	}
	return nil
}

// releaseFinalizers takes the finalizers off a binding the manager deleted
// for the operator: anyone who may patch bindings can add one (no bind is
// needed), and the API server then only marks the binding deleted while its
// RBAC authorizer still honours it, so the revoked person would keep
// cluster-admin (review of 2026-12-05). The patch is preconditioned on the
// binding's uid and version; one replaced or changed since is left to the
// next pass, which sees it changed.
func releaseFinalizers(ctx context.Context, c client.Client, deleted *rbacv1.ClusterRoleBinding) error {
	var b rbacv1.ClusterRoleBinding
	if err := c.Get(ctx, client.ObjectKeyFromObject(deleted), &b); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("read ClusterRoleBinding %s, deleted and held by finalizers: %w", deleted.Name, err)
	}
	if b.UID != deleted.UID || b.DeletionTimestamp == nil || len(b.Finalizers) == 0 {
		return nil
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": b.UID},
		{"op": "test", "path": "/metadata/resourceVersion", "value": b.ResourceVersion},
		{"op": "remove", "path": "/metadata/finalizers"},
	})
	if err != nil {
		return err
	}
	held := b.Finalizers
	if err := c.Patch(ctx, &b, client.RawPatch(types.JSONPatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the finalizers %q that hold ClusterRoleBinding %s after its deletion: %w", held, b.Name, err)
	}
	log.FromContext(ctx).Info("removed the finalizers that held a revoked admin binding", "binding", b.Name, "finalizers", held)
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
	// APIReader reads a binding past the cache: the label-selected watch
	// tells of a binding whose label was taken off as of one deleted, and
	// only the API server can tell the two apart. Nil: the manager's.
	APIReader client.Reader
	// Engine writes the decision log's record.
	Engine interface {
		RecordApplied(ctx context.Context, a engine.Applied) error
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
	if a.APIReader == nil {
		a.APIReader = mgr.GetAPIReader()
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
			if !isAdminBinding(e.Object) {
				return
			}
			if a.unlabelled(ctx, e.Object) {
				return
			}
			a.revoked(ctx, e.Object)
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
	return isAdminBinding(b) && strings.HasPrefix(b.Name, adminBindingPrefix) && b.RoleRef == clusterAdmin
}

// AdminBindingIdentity is the identity b grants cluster-admin for, read from
// its name (IDENTITY:NONCE), when b is one of Ichor's admin bindings by its
// label, its name and its role (Revocable); ok is false otherwise. Unlike
// the ichor.dev/admin-username and admin-identity annotations, which whoever
// creates a labelled binding writes, the name of a binding to cluster-admin
// can only be chosen by a holder of bind on cluster-admin.
func AdminBindingIdentity(b *rbacv1.ClusterRoleBinding) (identity string, ok bool) {
	if !Revocable(b) || !adminBindingName.MatchString(b.Name) {
		return "", false
	}
	return b.Name[:strings.LastIndexByte(b.Name, ':')], true
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

// unlabelled reports whether an admin binding the watch saw go is still
// there, its label taken off (or changed): no revocation, since it still
// grants what it granted, but a binding Ichor no longer lists, revokes or
// records (the operator's revocation and the CLI find bindings by the
// label), which is said as a Warning when it is one of Ichor's admin
// bindings (by its name and role, as Revocable: the person is read from its
// name, not from an annotation whoever made it wrote). A binding whose
// deletion was asked (finalizers hold it) is taken as deleted: its
// unlabelled end is seen by no watch, so this is the record's last chance.
// A binding the API server cannot be asked about is taken as deleted, as
// before this check: a revocation unrecorded would be worse than one
// recorded for a binding unlabelled.
func (a *AdminBindings) unlabelled(ctx context.Context, b *rbacv1.ClusterRoleBinding) bool {
	if a.APIReader == nil {
		return false
	}
	var now rbacv1.ClusterRoleBinding
	err := a.APIReader.Get(ctx, client.ObjectKey{Name: b.Name}, &now)
	logger := log.FromContext(ctx).WithValues("binding", engine.Clip(b.Name, "", maxLoggedBindingName))
	switch {
	case apierrors.IsNotFound(err):
		return false
	case err != nil:
		logger.Error(err, "cannot tell whether an admin binding the watch saw go was deleted or unlabelled: recorded as deleted")
		return false
	case now.UID != b.UID:
		// Made again under its name: the old one is gone.
		return false
	case now.DeletionTimestamp != nil:
		// Going, held by finalizers: recorded now, as no watch will see it
		// go, and said as still granting while they hold it.
		a.untracked(ctx, &now, b, "its deletion was asked, but finalizers hold it, and it lost its label: it still grants cluster-admin until they are removed, and Ichor no longer sees it go")
		return false
	case isAdminBinding(&now):
		// Labelled again since: its watch tells of it anew.
		return true
	}
	a.untracked(ctx, &now, b, fmt.Sprintf("it lost its label %s=true: it still grants cluster-admin, and Ichor no longer lists, revokes or records it; label it again, or delete it to revoke", LabelAdminBinding))
	return true
}

// untracked says, as a Warning on the binding as it is now, that one of
// Ichor's admin bindings (by its name and role, the person read from its
// name) is no longer tracked, and why; of another labelled binding it logs
// at debug level only.
func (a *AdminBindings) untracked(ctx context.Context, now, was *rbacv1.ClusterRoleBinding, why string) {
	logger := log.FromContext(ctx).WithValues("binding", engine.Clip(was.Name, "", maxLoggedBindingName))
	identity, ok := AdminBindingIdentity(was)
	if !ok {
		logger.V(1).Info("a labelled ClusterRoleBinding that is not an admin binding of Ichor's lost its label: nothing to say")
		return
	}
	note := engine.Clip(fmt.Sprintf("The admin binding of %q: %s", identity, why), "", engine.MaxEventNote)
	logger.Info("an admin binding lost its label", "identity", engine.Clip(identity, "", maxLoggedBindingName), "why", why)
	if a.Recorder != nil {
		a.Recorder.Eventf(now, nil, corev1.EventTypeWarning, ReasonAdminBindingUntracked, "Unlabel", "%s", note)
	}
}

// ReasonAdminBindingUntracked is the reason of the Warning of an admin
// binding whose label was taken off.
const ReasonAdminBindingUntracked = "AdminBindingUntracked"

// maxLoggedBindingName bounds a binding's name or username in the log.
const maxLoggedBindingName = 256

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
	if err := // Seen by the watch: the binding is gone, whoever deleted it.
		a.Engine.RecordApplied(ctx, engine.Applied{
			DecisionID: decisionID, Object: "clusterrolebinding/" + b.Name, UID: string(b.UID), Action: action, Outcome: engine.AppliedObserved,
		}); err != nil {
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
