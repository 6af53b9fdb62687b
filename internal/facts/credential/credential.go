// Package credential gathers the facts of a TalosCredentialRequest that the
// credential rules (policy/ichor/credentials) decide on, for the admission
// webhook and for the issuer alike: the request itself, who it records as its
// requester, the SubjectAccessReview made as a user for the purpose's grant,
// and the proof that the webhook admitted the request (proof.go).
package credential

import (
	"context"
	"errors"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/accessreview"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
)

// Request is the facts of the request's own content. namespace is passed
// apart because at admission the API server's namespace of the request is
// authoritative, not the object's.
func Request(tcr *ichorv1alpha1.TalosCredentialRequest, namespace string) engine.CredentialRequestFacts {
	keyFacts, _ := engine.ParsePublicKey(tcr.Spec.PublicKey)
	return engine.CredentialRequestFacts{
		Name:       tcr.Name,
		Namespace:  namespace,
		UID:        string(tcr.UID),
		Cluster:    tcr.Spec.ClusterName,
		Purpose:    string(tcr.Spec.Purpose),
		TTLSeconds: ttlSeconds(tcr.Spec.TTL),
		PublicKey:  keyFacts,
	}
}

func ttlSeconds(ttl *metav1.Duration) *float64 {
	if ttl == nil {
		return nil
	}
	s := ttl.Seconds()
	return &s
}

// User is the user an admission request was made by, as the API server
// authenticated them.
func User(u authenticationv1.UserInfo) engine.CredentialUser {
	extra := make(map[string][]string, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = append([]string{}, v...)
	}
	return engine.CredentialUser{Username: u.Username, UID: u.UID, Groups: nonNil(u.Groups), Extra: extra}
}

// Requester is spec.requester, or nil when the request records none (an
// older client, or a request stored before requesters were recorded): the
// rules refuse it as RequesterUnknown.
func Requester(r ichorv1alpha1.Requester) *engine.CredentialUser {
	if r.Username == "" {
		return nil
	}
	extra := make(map[string][]string, len(r.Extra))
	for k, v := range r.Extra {
		extra[k] = append([]string{}, v...)
	}
	return &engine.CredentialUser{Username: r.Username, UID: r.UID, Groups: nonNil(r.Groups), Extra: extra}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return append([]string{}, s...)
}

// WhoAmI is the caller of c as the API server authenticates them, from a
// SelfSubjectReview (allowed to every authenticated user): what a requester
// records as spec.requester, which admission pins to the same user.
func WhoAmI(ctx context.Context, c client.Client) (ichorv1alpha1.Requester, error) {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return ichorv1alpha1.Requester{}, fmt.Errorf("find out who you are (SelfSubjectReview), which the request records: %w", err)
	}
	u := review.Status.UserInfo
	r := ichorv1alpha1.Requester{Username: u.Username, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		r.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			r.Extra[k] = v
		}
	}
	return r, nil
}

// Requirer gives a purpose's requirements: *engine.Engine.
type Requirer interface {
	Requirements(ctx context.Context, purpose string) (engine.CredentialRequirements, error)
}

// ReviewPurpose makes the SubjectAccessReview the purpose requires (its
// requirements decision names the grant) as user, on the cluster. It returns
// nil for a purpose the policy does not know: nothing could be reviewed, and
// the rule refuses it.
func ReviewPurpose(ctx context.Context, c client.Client, eng Requirer, user engine.CredentialUser, namespace, cluster string, purpose ichorv1alpha1.CredentialPurpose) (*engine.AuthorizationFacts, error) {
	reqs, err := eng.Requirements(ctx, string(purpose))
	switch {
	case errors.Is(err, engine.ErrNoDecision):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return Review(ctx, c, user, namespace, cluster, reqs.Authorization)
}

// Cluster is what the rules know of the TalosCluster a request names, and the
// cluster itself (nil when it does not exist). local says which clusters'
// machines are nodes of the API server the manager runs against.
func Cluster(ctx context.Context, r client.Reader, namespace, name string, local *cluster.Local) (engine.ClusterFacts, *ichorv1alpha1.TalosCluster, error) {
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		// No TalosCluster has such a name (a request stored before the
		// CRD's pattern): it does not exist, rather than a read the
		// client refuses to make, retried for ever.
		return engine.ClusterFacts{}, nil, nil
	}
	var c ichorv1alpha1.TalosCluster
	switch err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &c); {
	case apierrors.IsNotFound(err):
		return engine.ClusterFacts{}, nil, nil
	case err != nil:
		return engine.ClusterFacts{}, nil, fmt.Errorf("get TalosCluster %s/%s: %w", namespace, name, err)
	}
	return engine.ClusterFacts{Exists: true, KubeconfigRef: c.Spec.KubeconfigRef != nil, Local: local.Judges(&c)}, &c, nil
}

// Review asks the authorizer whether user, exactly as given (name, uid,
// groups and extra), holds the purpose's grant on the named cluster, and
// returns the review as sent with its answer. An error is a review that could
// not be made (the caller retries or fails closed), never an answer.
func Review(ctx context.Context, c client.Client, user engine.CredentialUser, namespace, cluster string, grant engine.CredentialAuthorization) (*engine.AuthorizationFacts, error) {
	sar, err := accessreview.Ask(ctx, c, accessreview.User{Name: user.Username, UID: user.UID, Groups: user.Groups, Extra: user.Extra},
		authorizationv1.ResourceAttributes{
			Namespace:   namespace,
			Verb:        grant.Verb,
			Group:       grant.Group,
			Resource:    grant.Resource,
			Subresource: grant.Subresource,
			Name:        cluster,
		})
	if err != nil {
		return nil, fmt.Errorf("SubjectAccessReview of %s %s/%s for %q: %w", grant.Verb, grant.Resource, grant.Subresource, user.Username, err)
	}
	ra := sar.Spec.ResourceAttributes
	return &engine.AuthorizationFacts{
		User:            sar.Spec.User,
		UID:             sar.Spec.UID,
		Groups:          sar.Spec.Groups,
		Verb:            ra.Verb,
		Group:           ra.Group,
		Resource:        ra.Resource,
		Subresource:     ra.Subresource,
		Namespace:       ra.Namespace,
		Name:            ra.Name,
		Allowed:         sar.Status.Allowed,
		Denied:          sar.Status.Denied,
		Reason:          sar.Status.Reason,
		EvaluationError: sar.Status.EvaluationError,
	}, nil
}
