package engine

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
)

// Entrypoints of the credential rules (policy/ichor/credentials).
//
//nolint:gosec // G101: rule paths that say "credentials", not credentials
const (
	PathCredentialRequirements = "ichor/credentials/requirements"
	PathCredentialAdmission    = "ichor/credentials/admission"
	PathCredentialIssuance     = "ichor/credentials/issuance"
	PathCredentialCheck        = "ichor/credentials/credential"
)

// Certificate kinds of an issuance decision.
const (
	CertificateKindTalos      = "talos"
	CertificateKindKubernetes = "kubernetes"
)

// CredentialAuthorization is the grant a purpose's requester must hold: a
// SubjectAccessReview of verb on group/resource/subresource, named by the
// cluster.
type CredentialAuthorization struct {
	Verb        string `json:"verb"`
	Group       string `json:"group"`
	Resource    string `json:"resource"`
	Subresource string `json:"subresource"`
}

// CredentialEvent is the Event that records an issuance on the TalosCluster.
// Message is empty in requirements, which do not know the requester yet.
type CredentialEvent struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// CredentialRequirements is what Go gathers before it asks for admission or
// issuance.
type CredentialRequirements struct {
	Authorization CredentialAuthorization `json:"authorization"`
	Event         CredentialEvent         `json:"event"`
	// AdminBinding is set only for a purpose whose credential its person's
	// own ClusterRoleBinding gives power (kubeconfig-admin), asked with a
	// username: the issuer gathers admin bindings for such a request alone.
	AdminBinding *AdminBindingRequirement `json:"admin_binding,omitempty"`
	DecisionID   string                   `json:"decision_id"`
	Revision     string                   `json:"revision"`
}

// AdminBindingRequirement is whose admin bindings the issuer gathers: those
// named after Identity (Identity, ":" and a nonce) that bind ClusterRole.
type AdminBindingRequirement struct {
	Identity    string `json:"identity"`
	ClusterRole string `json:"cluster_role"`
}

// PublicKeyFacts are the facts of spec.publicKey: whether it parsed as a PEM
// PUBLIC KEY block (and why not), its algorithm, curve and size. The rule
// decides which keys are allowed.
type PublicKeyFacts struct {
	Parsed    bool   `json:"parsed"`
	Error     string `json:"error"`
	Algorithm string `json:"algorithm"`
	Curve     string `json:"curve,omitempty"`
	Bits      int    `json:"bits,omitempty"`
}

// CredentialUser is a user: at admission the one who makes the request, from
// the admission request's userInfo (a fact), and spec.requester, the
// requester's record of who they are (a claim admission pins to the user).
// Extra is masked in the decision log (policy/system/log): it may hold
// personal values.
type CredentialUser struct {
	Username string              `json:"username"`
	UID      string              `json:"uid"`
	Groups   []string            `json:"groups"`
	Extra    map[string][]string `json:"extra"`
}

// CredentialRequestFacts are the facts of one TalosCredentialRequest.
type CredentialRequestFacts struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// UID is the request's, which the API server assigns before the
	// validating webhook sees it.
	UID     string `json:"uid"`
	Cluster string `json:"cluster"`
	Purpose string `json:"purpose"`
	// TTLSeconds is absent when spec.ttl is unset: the purpose's default.
	TTLSeconds *float64       `json:"ttl_seconds,omitempty"`
	PublicKey  PublicKeyFacts `json:"public_key"`
}

// AuthorizationFacts are the SubjectAccessReview Go made, as sent, and the
// authorizer's answer.
type AuthorizationFacts struct {
	User            string   `json:"user"`
	UID             string   `json:"uid"`
	Groups          []string `json:"groups"`
	Verb            string   `json:"verb"`
	Group           string   `json:"group"`
	Resource        string   `json:"resource"`
	Subresource     string   `json:"subresource"`
	Namespace       string   `json:"namespace"`
	Name            string   `json:"name"`
	Allowed         bool     `json:"allowed"`
	Denied          bool     `json:"denied"`
	Reason          string   `json:"reason"`
	EvaluationError string   `json:"evaluation_error"`
}

// ClusterFacts are what a credential decision knows of the TalosCluster the
// request names.
type ClusterFacts struct {
	Exists bool `json:"exists"`
	// KubeconfigRef is whether the cluster judges another API server.
	KubeconfigRef bool `json:"kubeconfig_ref"`
	// Local is whether its machines are nodes of the API server the manager
	// runs against: no kubeconfigRef, and named by the operator
	// (--local-clusters).
	Local bool `json:"local"`
}

// SecretsFacts are what the issuer read, right before deciding, of the
// Secret whose CAs would sign: whether the Secret itself names the cluster
// among those that may use it (the annotation ichor.dev/talos-clusters, as
// clustersecrets.CheckClaim reads it, under the manager's
// --require-secrets-claim), which whoever may edit the TalosCluster but not
// the Secret cannot make true.
type SecretsFacts struct {
	// Secret is the Secret's name, in the request's namespace.
	Secret string `json:"secret"`
	// Read is whether it was read; false when it does not exist or the
	// manager may not read it.
	Read bool `json:"read"`
	// Claimed is whether it names the cluster; ClaimError says why not, in
	// words that quote at most 200 bytes of the annotation.
	Claimed    bool   `json:"claimed"`
	ClaimError string `json:"claim_error,omitempty"`
	// Usable is whether it was read, names the cluster and holds a secrets
	// bundle with the CAs the issuer signs with; Error says why not (the
	// read's or the bundle's error, at most MaxSecretsError bytes).
	Usable bool   `json:"usable"`
	Error  string `json:"error,omitempty"`
}

// MaxSecretsError bounds SecretsFacts.Error: a bundle's YAML errors quote
// its keys, thousands of them if its writer likes.
const MaxSecretsError = 1024

// CredentialAdmissionInput is the input of the admission decision.
type CredentialAdmissionInput struct {
	Operation string         `json:"operation"`
	DryRun    bool           `json:"dry_run"`
	User      CredentialUser `json:"user"`
	// Requester is spec.requester; nil when the request has none.
	Requester *CredentialUser        `json:"requester,omitempty"`
	Request   CredentialRequestFacts `json:"request"`
	// Authorization is absent when no review was made: the purpose has no
	// requirements (it is unknown), which the rule refuses.
	Authorization *AuthorizationFacts `json:"authorization,omitempty"`
	Cluster       ClusterFacts        `json:"cluster"`
	// Settings are the operator's choices admission reads; absent where
	// none is known (the CLI's own check before it asks).
	Settings *AdmissionSettings `json:"settings,omitempty"`
}

// AdmissionSettings are the operator's choices the admission rule reads.
type AdmissionSettings struct {
	// ComponentNamespaces are the namespaces of Ichor's own
	// ServiceAccounts, the only requesters of the purposes not for people
	// (--component-namespaces; the manager's own namespace by default).
	ComponentNamespaces []string `json:"component_namespaces,omitempty"`
}

// CredentialAdmission is the admission decision. Event is set only when the
// request is allowed and is not a dry run: it must be written before the
// request is admitted.
type CredentialAdmission struct {
	Allowed         bool    `json:"allowed"`
	Reasons         Reasons `json:"reasons"`
	Purpose         string  `json:"purpose"`
	LifetimeSeconds float64 `json:"lifetime_seconds"`
	// Credential is what the person is handed, as the rule names it (a
	// JSON object Go does not read): set only when the request is allowed,
	// and pinned by the webhook in the admission record, which issuance
	// compares with what it would sign. A bundle older than the pin names
	// none.
	Credential json.RawMessage  `json:"credential,omitempty"`
	Event      *CredentialEvent `json:"event,omitempty"`
	DecisionID string           `json:"decision_id"`
	Revision   string           `json:"revision"`
}

// AdmissionProof is what the issuer found of the webhook's admission of a
// request: whether its admission record exists, and whether the record's MAC,
// which only the manager can make, covers exactly this request.
type AdmissionProof struct {
	Recorded   bool   `json:"recorded"`
	Verified   bool   `json:"verified"`
	DecisionID string `json:"decision_id,omitempty"`
	// LifetimeSeconds is the lifetime the verified record says was
	// admitted; absent from a record of a webhook older than that.
	LifetimeSeconds int64 `json:"lifetime_seconds,omitempty"`
	// Credential is the credential the verified record says was admitted,
	// as the admission decision named it; absent from a record of a
	// webhook older than that.
	Credential json.RawMessage `json:"credential,omitempty"`
	// Error says why a record does not verify.
	Error string `json:"error,omitempty"`
}

// AdminIdentityFacts are what the issuer found of admins' own
// ClusterRoleBindings before an admin kubeconfig is signed: the bindings
// labelled as Ichor's admin binding that are named after the requester's
// identity and bind the requirements' role (the rule checks both again), and
// a nonce Go drew for a new binding's name, so that the decision, which
// names the binding, replays from its input.
type AdminIdentityFacts struct {
	Bindings []AdminBindingFacts `json:"bindings"`
	Nonce    string              `json:"nonce"`
}

// AdminBindingFacts are one ClusterRoleBinding's name, role and subjects.
type AdminBindingFacts struct {
	Name     string                `json:"name"`
	RoleRef  RoleRefFacts          `json:"role_ref"`
	Subjects []BindingSubjectFacts `json:"subjects"`
}

// RoleRefFacts are a binding's roleRef.
type RoleRefFacts struct {
	APIGroup string `json:"api_group"`
	Kind     string `json:"kind"`
	Name     string `json:"name"`
}

// BindingSubjectFacts are one subject of a binding.
type BindingSubjectFacts struct {
	APIGroup  string `json:"api_group"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// IssuerSettings are the operator's choices the issuance rule reads.
type IssuerSettings struct {
	// AdminKubeconfigs is false when the operator revoked admin kubeconfigs
	// (--admin-kubeconfigs=false).
	AdminKubeconfigs bool `json:"admin_kubeconfigs"`
	// ComponentNamespaces are as AdmissionSettings'.
	ComponentNamespaces []string `json:"component_namespaces,omitempty"`
}

// CredentialIssuanceInput is the input of the issuance decision: the issuer's
// facts right before it signs.
type CredentialIssuanceInput struct {
	Request CredentialRequestFacts `json:"request"`
	// Requester is spec.requester; nil when the request has none.
	Requester *CredentialUser `json:"requester,omitempty"`
	Admission AdmissionProof  `json:"admission"`
	// Authorization is the SubjectAccessReview made as the requester just
	// now; absent when none could be made (no requester, unknown purpose).
	Authorization *AuthorizationFacts `json:"authorization,omitempty"`
	Cluster       ClusterFacts        `json:"cluster"`
	// Secrets is what the issuer read of the Secret the cluster's
	// secretsRef names, whose CAs would sign; absent when the cluster does
	// not exist.
	Secrets *SecretsFacts `json:"secrets,omitempty"`
	// AdminIdentity is gathered only when the purpose's requirements name
	// an admin binding (kubeconfig-admin): the requester's bindings, by
	// name and role. Empty for every other purpose.
	AdminIdentity AdminIdentityFacts `json:"admin_identity"`
	Settings      IssuerSettings     `json:"settings"`
}

// CredentialCheckInput is the input of the credential checks alone: the
// purpose, the lifetime and the key, without who asks.
type CredentialCheckInput struct {
	Purpose    string         `json:"purpose"`
	TTLSeconds *float64       `json:"ttl_seconds,omitempty"`
	PublicKey  PublicKeyFacts `json:"public_key"`
}

// IssuedCertificate is what may be signed: a Talos role, or Kubernetes
// groups (O=) and a common name.
type IssuedCertificate struct {
	Kind       string   `json:"kind"`
	TalosRole  string   `json:"talos_role,omitempty"`
	Groups     []string `json:"groups,omitempty"`
	CommonName string   `json:"common_name,omitempty"`
}

// AdminBindingDecision is the requester's own ClusterRoleBinding an admin
// kubeconfig needs: Go makes it (Create) or found it intact, before it signs.
// Its only subject is the group Group, its role the ClusterRole ClusterRole.
type AdminBindingDecision struct {
	Name        string `json:"name"`
	Group       string `json:"group"`
	ClusterRole string `json:"cluster_role"`
	Username    string `json:"username"`
	Identity    string `json:"identity"`
	Create      bool   `json:"create"`
}

// CredentialIssuance is the issuance decision. Certificate, and AdminBinding
// for an admin kubeconfig, are set only when the request is allowed.
type CredentialIssuance struct {
	Allowed         bool                  `json:"allowed"`
	Reasons         Reasons               `json:"reasons"`
	Purpose         string                `json:"purpose"`
	LifetimeSeconds float64               `json:"lifetime_seconds"`
	Certificate     *IssuedCertificate    `json:"certificate,omitempty"`
	AdminBinding    *AdminBindingDecision `json:"admin_binding,omitempty"`
	DecisionID      string                `json:"decision_id"`
	Revision        string                `json:"revision"`
}

// Requirements returns the grant and the Event of a purpose. It returns
// ErrNoDecision for a purpose the table does not know.
func (e *Engine) Requirements(ctx context.Context, purpose string) (CredentialRequirements, error) {
	return e.RequirementsFor(ctx, purpose, "")
}

// RequirementsFor is Requirements for a requester: with a username, the
// requirements of a purpose that needs an admin binding name whose (the
// person's identity, as the rule derives it) and its role.
func (e *Engine) RequirementsFor(ctx context.Context, purpose, username string) (CredentialRequirements, error) {
	in := map[string]string{"purpose": purpose}
	if username != "" {
		in["username"] = username
	}
	d, err := e.Decide(ctx, PathCredentialRequirements, in)
	if err != nil {
		return CredentialRequirements{}, err
	}
	return parseRequirements(d)
}

func parseRequirements(d Decision) (CredentialRequirements, error) {
	var out CredentialRequirements
	if err := decodeInto(d, &out); err != nil {
		return CredentialRequirements{}, err
	}
	if out.Authorization.Verb == "" || out.Authorization.Resource == "" || out.Event.Reason == "" {
		return CredentialRequirements{}, fmt.Errorf("decision %s of %s names no grant or no event", d.ID, d.Path)
	}
	if b := out.AdminBinding; b != nil && (b.Identity == "" || b.ClusterRole == "") {
		return CredentialRequirements{}, fmt.Errorf("decision %s of %s names an admin binding without an identity or a role", d.ID, d.Path)
	}
	out.DecisionID, out.Revision = d.ID, d.Revision
	return out, nil
}

// Admission decides a TalosCredentialRequest at admission.
func (e *Engine) Admission(ctx context.Context, in CredentialAdmissionInput) (CredentialAdmission, error) {
	d, err := e.Decide(ctx, PathCredentialAdmission, in)
	if err != nil {
		return CredentialAdmission{}, err
	}
	return parseAdmission(d)
}

func parseAdmission(d Decision) (CredentialAdmission, error) {
	var out CredentialAdmission
	if err := decodeInto(d, &out); err != nil {
		return CredentialAdmission{}, err
	}
	if len(out.Reasons) == 0 {
		return CredentialAdmission{}, fmt.Errorf("decision %s of %s gives no reason", d.ID, d.Path)
	}
	out.DecisionID, out.Revision = d.ID, d.Revision
	return out, nil
}

// Issuance decides, again, whether a credential may be signed, and what.
func (e *Engine) Issuance(ctx context.Context, in CredentialIssuanceInput) (CredentialIssuance, error) {
	return e.issuance(ctx, PathCredentialIssuance, in)
}

// CheckCredential decides a credential alone (purpose, lifetime, key), as
// the CLI does before it sends a request and the manager for its own Talos
// identity. Nothing is signed for a person on it.
func (e *Engine) CheckCredential(ctx context.Context, in CredentialCheckInput) (CredentialIssuance, error) {
	return e.issuance(ctx, PathCredentialCheck, in)
}

func (e *Engine) issuance(ctx context.Context, path string, in any) (CredentialIssuance, error) {
	d, err := e.Decide(ctx, path, in)
	if err != nil {
		return CredentialIssuance{}, err
	}
	return parseIssuance(d)
}

func parseIssuance(d Decision) (CredentialIssuance, error) {
	var out CredentialIssuance
	if err := decodeInto(d, &out); err != nil {
		return CredentialIssuance{}, err
	}
	if len(out.Reasons) == 0 {
		return CredentialIssuance{}, fmt.Errorf("decision %s of %s gives no reason", d.ID, d.Path)
	}
	// A bundle that allows without saying what to sign is broken; signing
	// anything would be guessing.
	if out.Allowed && (out.Certificate == nil || out.LifetimeSeconds <= 0) {
		return CredentialIssuance{}, fmt.Errorf("decision %s of %s allows but names no certificate or lifetime", d.ID, d.Path)
	}
	out.DecisionID, out.Revision = d.ID, d.Revision
	return out, nil
}

// decodeInto decodes a decision's result into out (decodeResult).
func decodeInto(d Decision, out any) error {
	if err := decodeResult(d.Result, out); err != nil {
		return fmt.Errorf("decision %s of %s does not have the documented shape: %w", d.ID, d.Path, err)
	}
	return nil
}

// ParsePublicKey reads spec.publicKey, a PEM "PUBLIC KEY" (PKIX) block, and
// returns its facts and, when it parsed, the key. It never fails: a key that
// cannot be read is described as such (parsed=false), and the rule refuses it.
func ParsePublicKey(text string) (PublicKeyFacts, crypto.PublicKey) {
	block, rest := pem.Decode([]byte(text))
	switch {
	case block == nil:
		return PublicKeyFacts{Error: "no PEM block found"}, nil
	case block.Type != "PUBLIC KEY":
		return PublicKeyFacts{Error: fmt.Sprintf("the PEM block is %q, not \"PUBLIC KEY\"", block.Type)}, nil
	case len(bytes.TrimSpace(rest)) > 0:
		return PublicKeyFacts{Error: "there is more after the PEM block"}, nil
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return PublicKeyFacts{Error: err.Error()}, nil
	}
	facts := PublicKeyFacts{Parsed: true}
	switch k := key.(type) {
	case ed25519.PublicKey:
		facts.Algorithm, facts.Bits = "Ed25519", 256
	case *ecdsa.PublicKey:
		facts.Algorithm, facts.Curve, facts.Bits = "ECDSA", k.Curve.Params().Name, k.Curve.Params().BitSize
	case *rsa.PublicKey:
		facts.Algorithm, facts.Bits = "RSA", k.N.BitLen()
	case *ecdh.PublicKey:
		// X25519 keys parse but cannot sign a TLS handshake.
		facts.Algorithm, facts.Curve = "ECDH", fmt.Sprint(k.Curve())
	default:
		facts.Algorithm = fmt.Sprintf("%T", key)
	}
	return facts, key
}
