// Package webhooktest runs the credential webhook against a test API server:
// it installs deploy/webhook's ValidatingWebhookConfiguration with envtest's
// WebhookInstallOptions (serving certificates it generates, a URL on
// localhost), and reads the RBAC a package's +kubebuilder:rbac markers ask
// for, so a test can run a component with exactly those rights.
package webhooktest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
)

// RepoRoot is the directory of this repository's go.mod: above this source
// file, or, when the test binary was built with -trimpath (as `make test`
// builds it) and the path is the module's, above the working directory, the
// package's directory under `go test`.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("webhooktest: cannot locate the source file")
	}
	dir := filepath.Dir(file)
	if !filepath.IsAbs(dir) {
		wd, err := os.Getwd()
		if err != nil {
			return "", fmt.Errorf("webhooktest: %w", err)
		}
		dir = wd
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("webhooktest: go.mod not found above " + file)
		}
		dir = parent
	}
}

// Install creates the ValidatingWebhookConfiguration of deploy/webhook in the
// API server of cfg, pointing at a local server on 127.0.0.1, and returns the
// options the webhook server must serve with. The caller removes
// LocalServingCertDir (Cleanup) when done.
func Install(cfg *rest.Config) (*envtest.WebhookInstallOptions, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	opts := &envtest.WebhookInstallOptions{
		Paths:            []string{filepath.Join(root, "deploy", "webhook")},
		LocalServingHost: "127.0.0.1",
	}
	if err := opts.Install(cfg); err != nil {
		_ = opts.Cleanup()
		return nil, fmt.Errorf("webhooktest: install the webhook configuration: %w", err)
	}
	return opts, nil
}

// ServerOptions are the webhook server options matching an installation.
func ServerOptions(opts *envtest.WebhookInstallOptions) crwebhook.Options {
	return crwebhook.Options{Host: opts.LocalServingHost, Port: opts.LocalServingPort, CertDir: opts.LocalServingCertDir}
}

// MarkerRules reads the cluster-wide +kubebuilder:rbac markers of the Go
// files of a package directory (relative to the repository root) as
// PolicyRules, the way controller-gen renders them into the manager's
// ClusterRole.
func MarkerRules(pkgDir string) ([]rbacv1.PolicyRule, error) {
	rules, _, err := markerRules(pkgDir)
	if err != nil {
		return nil, err
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("webhooktest: no cluster-wide +kubebuilder:rbac markers in %s", pkgDir)
	}
	return rules, nil
}

// NamespacedMarkerRules reads the markers with namespace= of a package
// directory: the rules controller-gen renders into a Role of the manager's
// own namespace.
func NamespacedMarkerRules(pkgDir string) ([]rbacv1.PolicyRule, error) {
	_, rules, err := markerRules(pkgDir)
	if err != nil {
		return nil, err
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("webhooktest: no namespaced +kubebuilder:rbac markers in %s", pkgDir)
	}
	return rules, nil
}

func markerRules(pkgDir string) (cluster, namespaced []rbacv1.PolicyRule, err error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, nil, err
	}
	files, err := filepath.Glob(filepath.Join(root, pkgDir, "*.go"))
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		c, n, err := markerRulesOf(f)
		if err != nil {
			return nil, nil, err
		}
		cluster, namespaced = append(cluster, c...), append(namespaced, n...)
	}
	return cluster, namespaced, nil
}

func markerRulesOf(path string) (cluster, namespaced []rbacv1.PolicyRule, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		spec, ok := strings.CutPrefix(line, "// +kubebuilder:rbac:")
		if !ok {
			continue
		}
		var rule rbacv1.PolicyRule
		inNamespace := false
		for _, field := range strings.Split(spec, ",") {
			key, value, ok := strings.Cut(field, "=")
			if !ok {
				return nil, nil, fmt.Errorf("webhooktest: %s: marker field %q has no value", path, field)
			}
			values := strings.Split(strings.Trim(value, `"`), ";")
			switch key {
			case "namespace":
				inNamespace = true
			case "groups":
				rule.APIGroups = values
			case "resources":
				rule.Resources = values
			case "verbs":
				rule.Verbs = values
			case "resourceNames":
				rule.ResourceNames = values
			default:
				return nil, nil, fmt.Errorf("webhooktest: %s: unknown marker field %q", path, key)
			}
		}
		if inNamespace {
			namespaced = append(namespaced, rule)
		} else {
			cluster = append(cluster, rule)
		}
	}
	return cluster, namespaced, sc.Err()
}

// AdmissionPolicies are the ValidatingAdmissionPolicies and their bindings
// in deploy/admission.
func AdmissionPolicies() ([]client.Object, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "admission", "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []client.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				return nil, fmt.Errorf("webhooktest: %s: %w", f, err)
			}
			var obj client.Object
			switch meta.Kind {
			case "ValidatingAdmissionPolicy":
				obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			case "ValidatingAdmissionPolicyBinding":
				obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			default:
				return nil, fmt.Errorf("webhooktest: %s: unexpected kind %q", f, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				return nil, fmt.Errorf("webhooktest: %s: %w", f, err)
			}
			out = append(out, obj)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("webhooktest: no admission policies in deploy/admission")
	}
	return out, nil
}

// InstallAdmissionPolicies creates the policies of deploy/admission and waits
// until the API server enforces the requester policy: until a dry-run request
// whose spec.requester is not its creator is refused by it. The policy's
// type checking must find no warning: a CEL expression that does not check
// would otherwise fail every request, or none.
func InstallAdmissionPolicies(ctx context.Context, c client.Client, namespace string) error {
	objs, err := AdmissionPolicies()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("webhooktest: create %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	return WaitRequesterPolicy(ctx, c, namespace, true)
}

// WaitRequesterPolicy waits until the API server enforces the requester
// policy (enforced) or no longer does: until a dry-run request in namespace
// whose spec.requester is not its creator is refused by it, or is not. While
// it waits for enforcement, the policy's type checking must find no warning:
// a CEL expression that does not check would fail every request, or none.
func WaitRequesterPolicy(ctx context.Context, c client.Client, namespace string, enforced bool) error {
	probe := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: "admission-policy-probe-"},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{
			ClusterName: "probe", Purpose: ichorv1alpha1.PurposeTalosconfigReader,
			PublicKey: "-----BEGIN PUBLIC KEY-----\n", Requester: ichorv1alpha1.Requester{Username: "ichor-test:nobody"},
		},
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if enforced {
			var policy admissionregistrationv1.ValidatingAdmissionPolicy
			if err := c.Get(ctx, client.ObjectKey{Name: RequesterPolicy}, &policy); err != nil {
				return false, err
			}
			if tc := policy.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
				return false, fmt.Errorf("webhooktest: policy %s does not type-check: %+v", RequesterPolicy, tc.ExpressionWarnings)
			}
		}
		err := c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		refused := err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+RequesterPolicy+"'")
		return refused == enforced, nil
	})
}

// WaitWebhook waits until the API server calls the credential webhook
// (serving) or no longer does: until a dry-run request in namespace for a
// cluster that does not exist is refused by the webhook, or is admitted. c
// must be allowed to create it: its user holds every grant (an admin).
func WaitWebhook(ctx context.Context, c client.Client, namespace string, serving bool) error {
	who, err := credential.WhoAmI(ctx, c)
	if err != nil {
		return err
	}
	probe := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: "webhook-probe-"},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{
			ClusterName: "webhook-probe", Purpose: ichorv1alpha1.PurposeTalosconfigReader,
			PublicKey: "-----BEGIN PUBLIC KEY-----\n", Requester: who,
		},
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		refused := err != nil && strings.Contains(err.Error(), "admission webhook")
		return refused == serving, nil
	})
}

// ConfigurationName is the name of the ValidatingWebhookConfiguration in
// deploy/webhook.
const ConfigurationName = "validating-webhook-configuration"

// RequesterPolicy is the ValidatingAdmissionPolicy that pins spec.requester.
const RequesterPolicy = "ichor-credential-requester"

// ShippedRoles are the ClusterRoles of deploy/rbac/roles.yaml, a List.
func ShippedRoles() ([]rbacv1.ClusterRole, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "rbac", "roles.yaml"))
	if err != nil {
		return nil, err
	}
	var list struct {
		APIVersion string               `json:"apiVersion"`
		Kind       string               `json:"kind"`
		Items      []rbacv1.ClusterRole `json:"items"`
	}
	if err := yaml.UnmarshalStrict(data, &list); err != nil {
		return nil, fmt.Errorf("webhooktest: roles.yaml: %w", err)
	}
	if list.Kind != "List" {
		return nil, fmt.Errorf("webhooktest: roles.yaml: kind %q, not a List", list.Kind)
	}
	for _, role := range list.Items {
		if role.Kind != "ClusterRole" {
			return nil, fmt.Errorf("webhooktest: roles.yaml: unexpected kind %q", role.Kind)
		}
	}
	return list.Items, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Requesting wraps c so that a TalosCredentialRequest it creates without a
// spec.requester records c's user, as `ichor cluster` does.
func Requesting(ctx context.Context, c client.Client) (client.Client, error) {
	who, err := credential.WhoAmI(ctx, c)
	if err != nil {
		return nil, err
	}
	return &requesting{Client: c, who: who}, nil
}

type requesting struct {
	client.Client
	who ichorv1alpha1.Requester
}

func (r *requesting) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if tcr, ok := obj.(*ichorv1alpha1.TalosCredentialRequest); ok && tcr.Spec.Requester.Username == "" {
		tcr.Spec.Requester = r.who
	}
	return r.Client.Create(ctx, obj, opts...)
}

// InstallRecorder creates the webhooks that record a person's acts
// (deploy/webhook/recorder) in the API server of cfg, pointing at a local
// server on 127.0.0.1, with the match condition the chart adds: the writes
// of manager (the manager's username) are left out. The caller removes
// LocalServingCertDir (Cleanup) when done.
func InstallRecorder(cfg *rest.Config, manager string) (*envtest.WebhookInstallOptions, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "webhook", "recorder", "manifests.yaml"))
	if err != nil {
		return nil, fmt.Errorf("webhooktest: %w", err)
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.Unmarshal(data, &vwc); err != nil {
		return nil, fmt.Errorf("webhooktest: deploy/webhook/recorder: %w", err)
	}
	vwc.Name = "ichor-test-recorder"
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].MatchConditions = append(vwc.Webhooks[i].MatchConditions, admissionregistrationv1.MatchCondition{
			Name: "not-the-manager", Expression: fmt.Sprintf("request.userInfo.username != %q", manager),
		})
	}
	opts := &envtest.WebhookInstallOptions{
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{&vwc},
		LocalServingHost:   "127.0.0.1",
	}
	if err := opts.Install(cfg); err != nil {
		_ = opts.Cleanup()
		return nil, fmt.Errorf("webhooktest: install the recorder's webhook configuration: %w", err)
	}
	return opts, nil
}
