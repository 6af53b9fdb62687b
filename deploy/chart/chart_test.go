package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	rbacvalidation "k8s.io/component-helpers/auth/rbac/validation"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/deploy/image"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/manager"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
	"github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhookcerts"
)

var update = flag.Bool("update", false, "copy the generated manifests (deploy/crds, deploy/rbac, deploy/webhook) into the chart instead of comparing them")

const (
	release   = "ichor-policy"
	namespace = "ichor-system"
	// webhookPath is the path package webhook serves the validation on (its
	// Path constant and +kubebuilder:webhook marker).
	webhookPath = "/validate-ichor-dev-v1alpha1-taloscredentialrequest"
)

// certManager are the values of the cert-manager mode.
var certManager = []string{"webhook.certManager.enabled=true"}

// root is the repository root; chartDir the chart.
func root(t *testing.T) string {
	t.Helper()
	// `go test` runs in the package's directory (a path from runtime.Caller
	// is not one under -trimpath, as `make test` builds).
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return dir
}

func chartDir(t *testing.T) string { return filepath.Join(root(t), "deploy", "chart") }

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary is the Helm pinned in tools/helm: $HELM when the Makefile has
// already resolved it, else `go tool -n helm` in the tool module (which
// builds it once into Go's cache).
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if helmPath = os.Getenv("HELM"); helmPath != "" {
			return
		}
		cmd := exec.Command("go", "-C", filepath.Join(root(t), "tools", "helm"), "tool", "-n", "helm")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			helmErr = fmt.Errorf("build the pinned helm (go -C tools/helm tool -n helm): %w: %s", err, stderr.String())
			return
		}
		helmPath = strings.TrimSpace(string(out))
	})
	require.NoError(t, helmErr)
	return helmPath
}

// helm runs the pinned Helm and returns its standard output.
func helm(t *testing.T, env []string, args ...string) []byte {
	t.Helper()
	cmd := helmCommand(t, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "helm %s:\n%s%s", strings.Join(args, " "), stderr.String(), stdout.String())
	return stdout.Bytes()
}

// helmOutput runs the pinned Helm and returns its output and error, for a
// command expected to fail.
func helmOutput(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return helmCommand(t, nil, args...).CombinedOutput()
}

func helmCommand(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	// Helm's own state (repositories, cache) stays out of the user's home.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// objects is a rendered chart.
type objects []*unstructured.Unstructured

// render is `helm template` of the chart with the values set.
func render(t *testing.T, set ...string) objects {
	t.Helper()
	return renderWith(t, nil, set...)
}

// renderWith is render with more flags of `helm template` (--api-versions).
func renderWith(t *testing.T, flags []string, set ...string) objects {
	t.Helper()
	args := append([]string{"template", release, chartDir(t), "--namespace", namespace, "--include-crds"}, flags...)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decode(t, helm(t, nil, args...))
}

// renderOutput is `helm template` of the chart with the values set, for a
// render that may be refused: its output and error.
func renderOutput(t *testing.T, set ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", release, chartDir(t), "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return helmOutput(t, args...)
}

func decode(t *testing.T, manifest []byte) objects {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out objects
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if obj != nil {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// get is the one object of a kind and name; it fails the test when there is
// not exactly one.
func (o objects) get(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	found := o.all(kind, name)
	require.Len(t, found, 1, "%s %q among the rendered objects", kind, name)
	return found[0]
}

// all are the objects of a kind, with the name if one is given.
func (o objects) all(kind, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, obj := range o {
		if obj.GetKind() == kind && (name == "" || obj.GetName() == name) {
			out = append(out, obj)
		}
	}
	return out
}

func (o objects) maps() []map[string]any {
	out := make([]map[string]any, len(o))
	for i, obj := range o {
		out[i] = obj.Object
	}
	return out
}

// typed converts a rendered object to its Go type.
func typed[T any](t *testing.T, obj *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	require.NoError(t, kruntime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &out))
	return &out
}

// deployment is the manager's Deployment; there is exactly one.
func (o objects) deployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	deps := o.all("Deployment", "")
	require.Len(t, deps, 1)
	return typed[appsv1.Deployment](t, deps[0])
}

// boundRoles are the ClusterRoles and Roles bound to the manager's
// ServiceAccount, by ClusterRoleBindings and RoleBindings, as rules keyed by
// "Kind/namespace/name".
func (o objects) boundRoles(t *testing.T) map[string][]rbacv1.PolicyRule {
	t.Helper()
	sa := o.deployment(t).Spec.Template.Spec.ServiceAccountName
	require.NotEmpty(t, sa)
	out := map[string][]rbacv1.PolicyRule{}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, obj := range o.all(kind, "") {
			b := typed[rbacv1.RoleBinding](t, obj)
			if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == namespace
			}) {
				continue
			}
			roleNS := ""
			if b.RoleRef.Kind == "Role" {
				roleNS = b.Namespace
			}
			var roles []*unstructured.Unstructured
			for _, r := range o.all(b.RoleRef.Kind, b.RoleRef.Name) {
				if r.GetNamespace() == roleNS {
					roles = append(roles, r)
				}
			}
			require.Len(t, roles, 1, "%s %s/%s among the rendered objects", b.RoleRef.Kind, roleNS, b.RoleRef.Name)
			role := roles[0]
			out[b.RoleRef.Kind+"/"+roleNS+"/"+b.RoleRef.Name] = typed[rbacv1.ClusterRole](t, role).Rules
		}
	}
	return out
}

// grants reports whether rules grant verb on group/resource for name (any
// name when name is empty must be granted without resourceNames), as the
// API server's RBAC reads them: "*" in groups, resources or verbs grants
// every one (component-helpers' Covers, what the API server's escalation
// check uses).
func grants(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
	asked := rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, Verbs: []string{verb}}
	if name != "" {
		asked.ResourceNames = []string{name}
	}
	covered, _ := rbacvalidation.Covers(rules, []rbacv1.PolicyRule{asked})
	return covered
}

func TestGrantsReadsWildcardsAsRBACDoes(t *testing.T) {
	all := []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}
	assert.True(t, grants(all, "", "configmaps", "create", ""))
	assert.True(t, grants(all, "", "configmaps", "update", "any"))
	named := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}, ResourceNames: []string{"marks"}}}
	assert.True(t, grants(named, "", "configmaps", "delete", "marks"))
	assert.False(t, grants(named, "", "configmaps", "delete", "other"))
	assert.False(t, grants(named, "", "configmaps", "create", ""), "a named grant is no grant on every name")
	assert.False(t, grants(named, "apps", "configmaps", "get", "marks"))
}

// The copies ------------------------------------------------------------------

// TestChartCopiesAreTheGeneratedManifests keeps the chart's copies identical
// to the files generated from the code, so the chart cannot drift from the
// markers: the CRDs, the manager's RBAC, the shipped roles and the webhook
// configuration (files/, which the templates read).
// `go test ./deploy/chart -args -update` copies them again.
func TestChartCopiesAreTheGeneratedManifests(t *testing.T) {
	r, c := root(t), chartDir(t)
	pairs := map[string]string{
		filepath.Join(r, "deploy", "rbac", "role.yaml"):                     filepath.Join(c, "files", "role.yaml"),
		filepath.Join(r, "deploy", "rbac", "roles.yaml"):                    filepath.Join(c, "files", "roles.yaml"),
		filepath.Join(r, "deploy", "webhook", "manifests.yaml"):             filepath.Join(c, "files", "webhook.yaml"),
		filepath.Join(r, "deploy", "webhook", "recorder", "manifests.yaml"): filepath.Join(c, "files", "recorder-webhook.yaml"),
		filepath.Join(r, "deploy", "admission", "requester.yaml"):           filepath.Join(c, "files", "admission.yaml"),
	}
	sources, err := filepath.Glob(filepath.Join(r, "deploy", "crds", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, sources)
	for _, src := range sources {
		pairs[src] = filepath.Join(c, "files", "crds", filepath.Base(src))
	}
	if *update {
		stale, err := filepath.Glob(filepath.Join(c, "files", "crds", "*.yaml"))
		require.NoError(t, err)
		for _, f := range stale {
			require.NoError(t, os.Remove(f))
		}
		for src, dst := range pairs {
			data, err := os.ReadFile(src)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(dst, data, 0o644))
		}
	}

	for src, dst := range pairs {
		want, err := os.ReadFile(src)
		require.NoError(t, err)
		got, err := os.ReadFile(dst)
		if assert.NoError(t, err, "%s is not in the chart; run `go test ./deploy/chart -args -update`", src) {
			assert.True(t, bytes.Equal(want, got), "%s differs from %s; run `go test ./deploy/chart -args -update`", dst, src)
		}
	}
	chartCRDs, err := filepath.Glob(filepath.Join(c, "files", "crds", "*.yaml"))
	require.NoError(t, err)
	assert.Len(t, chartCRDs, len(sources), "the chart has a CRD that deploy/crds no longer has; run `go test ./deploy/chart -args -update`")
}

func TestHelmLint(t *testing.T) {
	for name, set := range map[string][]string{"default": nil, "cert-manager": certManager} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir(t), "--namespace", namespace}
			for _, s := range set {
				args = append(args, "--set", s)
			}
			helm(t, nil, args...)
		})
	}
}

// RBAC -------------------------------------------------------------------------

type violation struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

var (
	engineOnce sync.Once
	theEngine  *engine.Engine
	engineErr  error
)

// TestMain stops the engine the RBAC tests share, once they are done.
func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if theEngine != nil {
		theEngine.Stop(context.Background())
	}
	os.Exit(code)
}

// violations evaluates the RBAC invariant (policy/ichor/rbac, in the bundle
// the manager embeds) over the objects for the ClusterRole named role.
func violations(t *testing.T, objs []map[string]any, role string) []violation {
	t.Helper()
	return violationsWith(t, objs, role, false)
}

// violationsWith evaluates the invariant for a render that does or does not
// run the kubelet client approver.
func violationsWith(t *testing.T, objs []map[string]any, role string, clientApprover bool) []violation {
	t.Helper()
	engineOnce.Do(func() {
		// Not the test's context: the engine outlives the first test using it.
		theEngine, engineErr = engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	})
	require.NoError(t, engineErr)
	d, err := theEngine.Decide(t.Context(), "ichor/rbac/violations", map[string]any{
		"manager_role": role, "objects": objs, "kubelet_client_approver": clientApprover,
	})
	require.NoError(t, err)
	var out []violation
	require.NoError(t, json.Unmarshal(d.Result, &out), string(d.Result))
	return out
}

// TestControllerRBACApprovesOnlyKubeletSigners is ADR 0125's invariant over
// the rendered chart, in every mode: every ClusterRole bound to the manager's
// ServiceAccount holds on certificates.k8s.io only get/list/watch on the
// requests, update on their approval, and approve on the two kubelet signers
// by name; no sign, no create, no other signer, no wildcard.
func TestControllerRBACApprovesOnlyKubeletSigners(t *testing.T) {
	for name, set := range map[string][]string{
		"default":        nil,
		"cert-manager":   certManager,
		"renamed":        {"fullnameOverride=ichor", "serviceAccount.name=approver"},
		"client-on":      {"manager.kubeletClientApprover=true"},
		"secrets-scoped": {"rbac.secretsNamespaces={team-a,team-b}"},
	} {
		t.Run(name, func(t *testing.T) {
			clientApprover := slices.Contains(set, "manager.kubeletClientApprover=true")
			objs := render(t, set...)
			bound := objs.boundRoles(t)
			var clusterRoles []string
			for key := range bound {
				if kind, rest, _ := strings.Cut(key, "/"); kind == "ClusterRole" {
					clusterRoles = append(clusterRoles, strings.TrimPrefix(rest, "/"))
				}
			}
			require.NotEmpty(t, clusterRoles, "no ClusterRole is bound to the manager's ServiceAccount")
			for _, role := range clusterRoles {
				assert.Empty(t, violationsWith(t, objs.maps(), role, clientApprover), "ClusterRole %s breaks the RBAC invariant", role)
			}
			// The manager must be able to do its work: the rights are there,
			// and RBAC follows the features.
			manager := bound["ClusterRole//"+objs.deployment(t).Name+"-manager"]
			require.NotNil(t, manager, "the manager ClusterRole %s-manager is not bound to the ServiceAccount", objs.deployment(t).Name)
			assert.True(t, grants(manager, "certificates.k8s.io", "signers", "approve", "kubernetes.io/kubelet-serving"))
			assert.Equal(t, clientApprover, grants(manager, "certificates.k8s.io", "signers", "approve", "kubernetes.io/kube-apiserver-client-kubelet"),
				"approve on the client signer exactly when the client approver runs")
			assert.Equal(t, clientApprover, slices.Contains(args(objs.deployment(t)), "--kubelet-client-approver"))
			assert.True(t, grants(manager, "certificates.k8s.io", "certificatesigningrequests/approval", "update", ""))
		})
	}
}

// TestRBACCheckOfTheChartHasTeeth proves the check above looks at what the
// chart renders: a right added to the rendered manager role, or a second
// ClusterRole bound to the ServiceAccount, is caught.
func TestRBACCheckOfTheChartHasTeeth(t *testing.T) {
	objs := render(t)
	role := objs.get(t, "ClusterRole", release+"-manager")
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	role.Object["rules"] = append(slices.Clone(rules), map[string]any{
		"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"signers"},
		"resourceNames": []any{"kubernetes.io/kubelet-serving"}, "verbs": []any{"sign"},
	})
	got := violations(t, objs.maps(), role.GetName())
	require.NotEmpty(t, got)
	assert.Equal(t, "RightNotAllowed", got[0].Code)

	objs = render(t)
	extra := decode(t, []byte(`
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: sneaky}
rules:
- apiGroups: [certificates.k8s.io]
  resources: [signers]
  verbs: [approve]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: sneaky}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: sneaky}
subjects:
- {kind: ServiceAccount, name: ichor-policy, namespace: ichor-system}
`))
	objs = append(objs, extra...)
	_, ok := objs.boundRoles(t)["ClusterRole//sneaky"]
	require.True(t, ok)
	assert.NotEmpty(t, violations(t, objs.maps(), "sneaky"))
}

// TestManagerRightsAreTheGeneratedOnes: the manager's roles in the chart hold
// exactly the rules generated from the markers, the ClusterRole ones
// cluster-wide and the namespaced ones in the release namespace, and the
// template adds none.
func TestManagerRightsAreTheGeneratedOnes(t *testing.T) {
	generated := decode(t, readFile(t, filepath.Join(root(t), "deploy", "rbac", "role.yaml")))
	var wantCluster, wantNamespaced []rbacv1.PolicyRule
	for _, obj := range generated {
		rules := typed[rbacv1.ClusterRole](t, obj).Rules
		switch obj.GetKind() {
		case "ClusterRole":
			wantCluster = append(wantCluster, rules...)
		case "Role":
			wantNamespaced = append(wantNamespaced, rules...)
		default:
			t.Fatalf("deploy/rbac/role.yaml holds a %s", obj.GetKind())
		}
	}
	// With every feature on and Secrets read cluster-wide, the rights are
	// exactly the generated ones, the admission policy bindings named (the
	// marker cannot know the release's); by default, without the client
	// signer's approve and without get on Secrets (a Role per namespace has
	// it).
	objs := render(t, "manager.kubeletClientApprover=true", "rbac.secretsClusterWide=true")
	bindings := strings.Split(argValue(t, objs.deployment(t), "--admission-policy-bindings"), ",")
	for i, r := range wantCluster {
		if slices.Contains(r.Resources, "validatingadmissionpolicybindings") {
			wantCluster[i].ResourceNames = bindings
		}
	}
	bound := objs.boundRoles(t)
	assert.Equal(t, wantCluster, bound["ClusterRole//"+release+"-manager"])
	byDefault := slices.DeleteFunc(slices.Clone(wantCluster), func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.ResourceNames, "kubernetes.io/kube-apiserver-client-kubelet") ||
			(slices.Contains(r.Resources, "secrets") && len(r.ResourceNames) == 0)
	})
	require.Len(t, byDefault, len(wantCluster)-2)
	assert.Equal(t, byDefault, render(t).boundRoles(t)["ClusterRole//"+release+"-manager"])
	if wantNamespaced == nil {
		assert.Empty(t, objs.all("Role", release+"-manager"))
	} else {
		assert.Equal(t, wantNamespaced, bound["Role/"+namespace+"/"+release+"-manager"])
	}
}

// TestRevokedAdminKubeconfigsTakeTheRightToMakeBindings: with admin
// kubeconfigs revoked the manager makes no admin binding, so its role holds
// no create on ClusterRoleBindings; it keeps what revoking them takes (patch
// to annotate, delete, bind on cluster-admin) and everything else as by
// default.
func TestRevokedAdminKubeconfigsTakeTheRightToMakeBindings(t *testing.T) {
	manager := "ClusterRole//" + release + "-manager"
	enabled := render(t).boundRoles(t)[manager]
	revoked := render(t, "adminCredentials.enabled=false").boundRoles(t)[manager]
	require.NotEmpty(t, revoked)
	assert.True(t, grants(enabled, "rbac.authorization.k8s.io", "clusterrolebindings", "create", ""))
	assert.False(t, grants(revoked, "rbac.authorization.k8s.io", "clusterrolebindings", "create", ""), "create on bindings with admin kubeconfigs revoked")
	for _, verb := range []string{"get", "list", "watch", "patch", "delete"} {
		assert.True(t, grants(revoked, "rbac.authorization.k8s.io", "clusterrolebindings", verb, ""), verb)
	}
	assert.True(t, grants(revoked, "rbac.authorization.k8s.io", "clusterroles", "bind", "cluster-admin"))
	want := slices.Clone(enabled)
	for i, r := range want {
		if slices.Contains(r.Resources, "clusterrolebindings") {
			want[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "create" })
		}
	}
	assert.Equal(t, want, revoked, "anything but create on bindings differs")
}

// Webhook ----------------------------------------------------------------------

// TestWebhookIsWiredToTheManager, in both modes: the configuration has the
// generated webhook (CREATE of TalosCredentialRequest, failurePolicy Fail,
// sideEffects NoneOnDryRun) pointing at the Service, whose port leads to the
// port the manager serves the webhook on.
func TestWebhookIsWiredToTheManager(t *testing.T) {
	for name, set := range map[string][]string{"default": nil, "cert-manager": certManager} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, set...)
			vwc := objs.get(t, "ValidatingWebhookConfiguration", webhookcerts.DefaultWebhookConfigurationName)
			webhooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
			require.Len(t, webhooks, 3)
			assertRecorderWebhooks(t, webhooks[1:])
			wh := webhooks[0].(map[string]any)
			assert.Equal(t, "vtaloscredentialrequest.ichor.dev", wh["name"])
			assert.Equal(t, "Fail", wh["failurePolicy"])
			assert.Equal(t, "NoneOnDryRun", wh["sideEffects"])
			assert.Equal(t, []any{map[string]any{
				"apiGroups": []any{"ichor.dev"}, "apiVersions": []any{"v1alpha1"},
				"operations": []any{"CREATE"}, "resources": []any{"taloscredentialrequests"},
			}}, wh["rules"])
			svcRef, _, _ := unstructured.NestedMap(wh, "clientConfig", "service")
			_, hasBundle, _ := unstructured.NestedFieldNoCopy(wh, "clientConfig", "caBundle")
			assert.False(t, hasBundle, "the chart must not render a caBundle: an upgrade would reset it")
			assert.Equal(t, webhookPath, svcRef["path"])
			assert.Equal(t, namespace, svcRef["namespace"])

			svc := typed[corev1.Service](t, objs.get(t, "Service", svcRef["name"].(string)))
			require.Len(t, svc.Spec.Ports, 1)
			assert.EqualValues(t, svcRef["port"], svc.Spec.Ports[0].Port)
			dep := objs.deployment(t)
			assert.Subset(t, dep.Spec.Template.Labels, svc.Spec.Selector, "the webhook Service does not select the manager pods")
			port := containerPort(t, dep, svc.Spec.Ports[0].TargetPort.StrVal)
			assert.EqualValues(t, 9443, port)
		})
	}
}

// assertRecorderWebhooks: the webhooks that record a person's acts
// (deploy/webhook/recorder) never refuse, are served by the manager's
// Service at the paths package webhook registers, and leave out the
// manager's own ServiceAccount, so Ichor's own approvals cost no call.
func assertRecorderWebhooks(t *testing.T, webhooks []any) {
	t.Helper()
	paths := map[string]string{
		"record-csr-approval.ichor.dev":         webhook.PathRecordCSRApproval,
		"record-admin-binding-delete.ichor.dev": webhook.PathRecordAdminBindingDelete,
	}
	for _, w := range webhooks {
		wh := w.(map[string]any)
		name, _ := wh["name"].(string)
		require.Contains(t, paths, name)
		assert.Equal(t, "Ignore", wh["failurePolicy"], name)
		assert.Equal(t, "NoneOnDryRun", wh["sideEffects"], name)
		timeout, _, _ := unstructured.NestedFieldNoCopy(wh, "timeoutSeconds")
		seconds, err := strconv.Atoi(fmt.Sprint(timeout))
		require.NoError(t, err, name)
		assert.LessOrEqual(t, seconds, 5, name)
		path, _, _ := unstructured.NestedString(wh, "clientConfig", "service", "path")
		assert.Equal(t, paths[name], path, name)
		conditions, _, _ := unstructured.NestedSlice(wh, "matchConditions")
		require.NotEmpty(t, conditions, name)
		last := conditions[len(conditions)-1].(map[string]any)
		assert.Equal(t, fmt.Sprintf("request.userInfo.username != 'system:serviceaccount:%s:%s'", namespace, release), last["expression"], name)
	}
	binding := webhooks[1].(map[string]any)
	labels, _, _ := unstructured.NestedStringMap(binding, "objectSelector", "matchLabels")
	assert.Equal(t, map[string]string{credentials.LabelAdminBinding: "true"}, labels)
}

func containerPort(t *testing.T, dep *appsv1.Deployment, name string) int32 {
	t.Helper()
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("the manager container has no port %q", name)
	return 0
}

func args(dep *appsv1.Deployment) []string { return dep.Spec.Template.Spec.Containers[0].Args }

func argValue(t *testing.T, dep *appsv1.Deployment, flag string) string {
	t.Helper()
	for _, a := range args(dep) {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	t.Fatalf("the manager has no %s argument: %v", flag, args(dep))
	return ""
}

// TestWebhookCertificatesFromTheManager (the default): the manager is told to
// make the certificates, for the Secret, Service and configuration the chart
// renders, and the roles bound to it grant exactly what webhookcerts needs on
// them, by name, the Secret only in the release namespace.
func TestWebhookCertificatesFromTheManager(t *testing.T) {
	objs := render(t)
	dep := objs.deployment(t)
	assert.Contains(t, args(dep), "--webhook-generate-certs")
	secretName := argValue(t, dep, "--webhook-cert-secret")
	vwcName := argValue(t, dep, "--webhook-configuration")
	assert.Equal(t, webhookcerts.DefaultSecretName, secretName)
	assert.Equal(t, webhookcerts.DefaultWebhookConfigurationName, vwcName)
	objs.get(t, "ValidatingWebhookConfiguration", vwcName)
	objs.get(t, "Service", argValue(t, dep, "--webhook-service"))
	assert.Empty(t, vwcAnnotations(t, objs), "no cainjector in this mode")

	secret := typed[corev1.Secret](t, objs.get(t, "Secret", secretName))
	assert.Equal(t, namespace, secret.Namespace)
	assert.Equal(t, corev1.SecretTypeOpaque, secret.Type, "a kubernetes.io/tls Secret cannot be created empty")
	assert.Empty(t, secret.Data, "the chart must not render data: an upgrade would overwrite the manager's certificates")

	certDir := argValue(t, dep, "--webhook-cert-dir")
	vol := mountedVolume(t, dep, certDir)
	require.NotNil(t, vol.EmptyDir, "the manager writes its certificates to an emptyDir")

	bound := objs.boundRoles(t)
	var inNamespace, clusterWide []rbacv1.PolicyRule
	for key, rules := range bound {
		if strings.HasPrefix(key, "Role/"+namespace+"/") {
			inNamespace = append(inNamespace, rules...)
		} else {
			clusterWide = append(clusterWide, rules...)
		}
	}
	for _, verb := range []string{"get", "update"} {
		assert.True(t, grants(inNamespace, "", "secrets", verb, secretName),
			"no Role in %s grants %s on Secret %s to the manager; regenerate deploy/rbac/role.yaml from webhookcerts' markers (make generate) and copy it (go test ./deploy/chart -args -update)", namespace, verb, secretName)
	}
	for _, verb := range []string{"get", "patch"} {
		assert.True(t, grants(clusterWide, "admissionregistration.k8s.io", "validatingwebhookconfigurations", verb, vwcName),
			"no ClusterRole grants %s on ValidatingWebhookConfiguration %s to the manager; regenerate deploy/rbac/role.yaml (make generate) and copy it (go test ./deploy/chart -args -update)", verb, vwcName)
	}
	// Nothing more than by name.
	assert.False(t, grants(clusterWide, "admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch", "another"))
	assert.False(t, grants(append(inNamespace, clusterWide...), "", "secrets", "update", "another"))
	assert.False(t, grants(append(inNamespace, clusterWide...), "", "secrets", "create", "another"))
}

// TestWebhookCertificatesFromCertManager: an Issuer and a Certificate for the
// Service's names, its Secret mounted where the manager reads, the CA
// injected by cainjector, and the manager not told to make certificates.
func TestWebhookCertificatesFromCertManager(t *testing.T) {
	objs := render(t, certManager...)
	dep := objs.deployment(t)
	assert.NotContains(t, args(dep), "--webhook-generate-certs")
	assert.Empty(t, objs.all("Secret", webhookcerts.DefaultSecretName))

	certs := objs.all("Certificate", "")
	require.Len(t, certs, 2, "the webhook's CA and its serving certificate")
	var cert, ca *unstructured.Unstructured
	for _, c := range certs {
		if isCA, _, _ := unstructured.NestedBool(c.Object, "spec", "isCA"); isCA {
			ca = c
		} else {
			cert = c
		}
	}
	require.NotNil(t, cert)
	require.NotNil(t, ca)
	assert.Equal(t, map[string]string{"cert-manager.io/inject-ca-from": namespace + "/" + cert.GetName()}, vwcAnnotations(t, objs))
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	assert.Contains(t, dnsNames, release+"-webhook."+namespace+".svc", "the name the API server dials")

	// The serving certificate is signed by a CA whose key outlives its
	// renewals, not self-signed: the bundle cainjector injects is the CA's,
	// which the serving certificate's renewal does not change.
	issuer, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
	caIssuer := objs.get(t, issuer["kind"], issuer["name"])
	caSecret, _, _ := unstructured.NestedString(caIssuer.Object, "spec", "ca", "secretName")
	caSecretName, _, _ := unstructured.NestedString(ca.Object, "spec", "secretName")
	commonName, _, _ := unstructured.NestedString(ca.Object, "spec", "commonName")
	assert.NotEmpty(t, commonName)
	// A release name of Helm's most (53) still gives a common name
	// cert-manager takes (at most 64).
	long := strings.Repeat("r", 53)
	out, err := helmOutput(t, "template", long, chartDir(t), "--namespace", namespace, "--set", certManager[0])
	require.NoError(t, err, "%s", out)
	for _, c := range decode(t, out).all("Certificate", "") {
		cn, _, _ := unstructured.NestedString(c.Object, "spec", "commonName")
		assert.LessOrEqual(t, len(cn), 64, c.GetName())
	}
	assert.Equal(t, caSecretName, caSecret, "the serving certificate's issuer signs with the CA")
	rotation, _, _ := unstructured.NestedString(ca.Object, "spec", "privateKey", "rotationPolicy")
	assert.Equal(t, "Never", rotation, "a renewed CA keeps its key, so serving certificates it signed still verify")
	selfSigned, _, _ := unstructured.NestedStringMap(ca.Object, "spec", "issuerRef")
	root := objs.get(t, selfSigned["kind"], selfSigned["name"])
	_, isSelfSigned, _ := unstructured.NestedMap(root.Object, "spec", "selfSigned")
	assert.True(t, isSelfSigned, "the CA is self-signed")

	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	vol := mountedVolume(t, dep, argValue(t, dep, "--webhook-cert-dir"))
	require.NotNil(t, vol.Secret)
	assert.Equal(t, secretName, vol.Secret.SecretName)

	// cert-manager and cainjector do webhookcerts' work: the manager holds
	// none of its rights (review 62 L4), so a leaked token cannot set a wrong
	// CA bundle nor write the webhook's certificate. (It may still read the
	// release namespace's Secrets, the CA's among them, unless
	// rbac.secretsNamespaces names others: docs/install.md says so.)
	var rules []rbacv1.PolicyRule
	for _, r := range objs.boundRoles(t) {
		rules = append(rules, r...)
	}
	for _, verb := range []string{"get", "patch", "update"} {
		assert.False(t, grants(rules, "admissionregistration.k8s.io", "validatingwebhookconfigurations", verb, webhookcerts.DefaultWebhookConfigurationName), verb)
	}
	// (get stays: the release namespace's Secrets are read for the
	// clusters' secrets bundles unless rbac.secretsNamespaces names others.)
	assert.False(t, grants(rules, "", "secrets", "update", webhookcerts.DefaultSecretName))
	assert.True(t, grants(rules, "", "secrets", "update", "ichor-policy-admission-key"), "the rest of the Role is kept")

	// An existing issuer instead of the chart's.
	objs = render(t, "webhook.certManager.enabled=true", "webhook.certManager.issuerRef.name=corp-ca", "webhook.certManager.issuerRef.kind=ClusterIssuer")
	assert.Empty(t, objs.all("Issuer", ""))
	issuer, _, _ = unstructured.NestedStringMap(objs.all("Certificate", "")[0].Object, "spec", "issuerRef")
	assert.Equal(t, map[string]string{"name": "corp-ca", "kind": "ClusterIssuer"}, issuer)
}

func vwcAnnotations(t *testing.T, objs objects) map[string]string {
	t.Helper()
	return objs.get(t, "ValidatingWebhookConfiguration", webhookcerts.DefaultWebhookConfigurationName).GetAnnotations()
}

// mountedVolume is the volume the manager container mounts at path.
func mountedVolume(t *testing.T, dep *appsv1.Deployment, path string) corev1.Volume {
	t.Helper()
	for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == m.Name {
				return v
			}
		}
	}
	t.Fatalf("nothing is mounted at %s", path)
	return corev1.Volume{}
}

// The manager's pods --------------------------------------------------------------

func TestManagerDeployment(t *testing.T) {
	objs := render(t)
	dep := objs.deployment(t)
	require.NotNil(t, dep.Spec.Replicas)
	assert.EqualValues(t, 2, *dep.Spec.Replicas)
	pod := dep.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	// The image's entrypoint is image.Entrypoint, /ichor, with no arguments
	// (deploy/image tests it): the chart gives the command, then flags only.
	assert.Empty(t, c.Command)
	require.NotEmpty(t, c.Args)
	assert.Equal(t, "manager", c.Args[0])
	for _, a := range c.Args[1:] {
		assert.True(t, strings.HasPrefix(a, "--"), "argument %q is not a flag", a)
	}
	assert.Contains(t, c.Args, "--leader-elect")
	assert.Equal(t, ":8080", argValue(t, dep, "--metrics-bind-address"))
	assert.Equal(t, ":8081", argValue(t, dep, "--health-probe-bind-address"))

	require.NotNil(t, c.LivenessProbe)
	require.NotNil(t, c.ReadinessProbe)
	assert.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.EqualValues(t, 8081, containerPort(t, dep, c.LivenessProbe.HTTPGet.Port.StrVal))
	assert.EqualValues(t, 8081, containerPort(t, dep, c.ReadinessProbe.HTTPGet.Port.StrVal))

	psc, sc := pod.SecurityContext, c.SecurityContext
	require.NotNil(t, psc)
	require.NotNil(t, sc)
	assert.Equal(t, ptrTrue, psc.RunAsNonRoot)
	if assert.NotNil(t, psc.RunAsUser) {
		assert.EqualValues(t, image.UID, *psc.RunAsUser, "the image's user")
	}
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
	assert.Equal(t, ptrTrue, sc.ReadOnlyRootFilesystem)
	assert.Equal(t, ptrFalse, sc.AllowPrivilegeEscalation)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.Empty(t, sc.Capabilities.Add)
	assert.Nil(t, sc.Privileged)

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		assert.Contains(t, c.Resources.Requests, r)
	}
	assert.Contains(t, c.Resources.Limits, corev1.ResourceMemory)

	tmp := mountedVolume(t, dep, "/tmp")
	require.NotNil(t, tmp.EmptyDir, "/tmp is an emptyDir: the engine writes its bundle to a temporary directory")
	for _, v := range pod.Volumes {
		assert.Nil(t, v.HostPath, "volume %s", v.Name)
	}
	assert.False(t, pod.HostNetwork)

	env := map[string]*corev1.EnvVarSource{}
	for _, e := range c.Env {
		env[e.Name] = e.ValueFrom
	}
	require.NotNil(t, env["POD_NAMESPACE"])
	assert.Equal(t, "metadata.namespace", env["POD_NAMESPACE"].FieldRef.FieldPath)
	require.NotNil(t, env["POD_NAME"], "the manager reports a refused bundle as an Event on its Pod, named by POD_NAME")
	assert.Equal(t, "metadata.name", env["POD_NAME"].FieldRef.FieldPath)

	// The bundle from a ConfigMap, signed with a key from another.
	dep = render(t, "manager.bundle.configMap.name=ichor-bundle", "manager.bundle.verification.configMap=ichor-bundle-key").deployment(t)
	assert.Equal(t, "/etc/ichor-policy/bundle/bundle.tar.gz", argValue(t, dep, "--bundle"))
	vol := mountedVolume(t, dep, "/etc/ichor-policy/bundle")
	require.NotNil(t, vol.ConfigMap)
	assert.Equal(t, "ichor-bundle", vol.ConfigMap.Name)
	assert.Equal(t, "/etc/ichor-policy/bundle-key/bundle-key.pem", argValue(t, dep, "--bundle-key"))
	assert.Equal(t, "ichor", argValue(t, dep, "--bundle-key-id"))
	vol = mountedVolume(t, dep, "/etc/ichor-policy/bundle-key")
	require.NotNil(t, vol.ConfigMap)
	assert.Equal(t, "ichor-bundle-key", vol.ConfigMap.Name)
}

// A bundle in a registry that asks who pulls: the credential's Secret
// (kubernetes.io/dockerconfigjson) is mounted and named to the manager;
// given for a bundle that is not in a registry, the render fails, as the
// manager would refuse to start.
func TestBundleRegistryCredentialsValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--bundle-registry-credentials")
	dep := render(t, "manager.bundle.path=oci://registry.example/ichor/policy:stable", "manager.bundle.verification.configMap=ichor-bundle-key",
		"manager.bundle.registryCredentials.secretName=registry-login").deployment(t)
	assert.Equal(t, "/etc/ichor-policy/registry/.dockerconfigjson", argValue(t, dep, "--bundle-registry-credentials"))
	vol := mountedVolume(t, dep, "/etc/ichor-policy/registry")
	require.NotNil(t, vol.Secret)
	assert.Equal(t, "registry-login", vol.Secret.SecretName)
	assert.Equal(t, []corev1.KeyToPath{{Key: ".dockerconfigjson", Path: ".dockerconfigjson"}}, vol.Secret.Items)

	out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set", "manager.bundle.registryCredentials.secretName=registry-login")
	require.Error(t, err, "rendered registry credentials for the embedded bundle")
	assert.Contains(t, string(out), "is not in a registry (oci://)")

	// Nor over plain http, where the credential would go in clear.
	out, err = helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set", "manager.bundle.path=oci+http://registry.example/ichor/policy:stable",
		"--set", "manager.bundle.verification.configMap=ichor-bundle-key", "--set", "manager.extraArgs={--bundle-allow-insecure-http}",
		"--set", "manager.bundle.registryCredentials.secretName=registry-login")
	require.Error(t, err, "rendered registry credentials for a plain http registry")
	assert.Contains(t, string(out), "a registry over plain http: the credential would go in clear")
}

// The decision-log service's token: its Secret is mounted and named to the
// manager, and no container argument shows it. Given without a service,
// beside a password in the URL, or for a service over plain http off the
// pod's loopback, the render fails, as the manager would refuse to start.
func TestDecisionLogTokenSecretValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--decision-log-token-file")
	dep := render(t, "manager.decisionLog.url=https://decisions.example.com/v1", "manager.decisionLog.tokenSecret.name=decision-log",
		"manager.decisionLog.tokenSecret.key=bearer").deployment(t)
	assert.Equal(t, "/etc/ichor-policy/decision-log/token", argValue(t, dep, "--decision-log-token-file"))
	vol := mountedVolume(t, dep, "/etc/ichor-policy/decision-log")
	require.NotNil(t, vol.Secret)
	assert.Equal(t, "decision-log", vol.Secret.SecretName)
	assert.Equal(t, []corev1.KeyToPath{{Key: "bearer", Path: "token"}}, vol.Secret.Items)
	// A sidecar on the pod's loopback may take it over plain http.
	for _, url := range []string{"http://127.0.0.1:8181", "http://[::1]:8181/v1", "http://localhost"} {
		render(t, "manager.decisionLog.url="+url, "manager.extraArgs={--decision-log-allow-insecure-http}",
			"manager.decisionLog.tokenSecret.name=decision-log")
	}

	const token, insecure = "manager.decisionLog.tokenSecret.name=decision-log", "manager.extraArgs={--decision-log-allow-insecure-http}"
	for _, c := range []struct{ values, want string }{
		{token, "manager.decisionLog.url is empty"},
		{"manager.decisionLog.url=https://ichor:s3cret@decisions.example.com," + token, "holds a password"},
		{"manager.decisionLog.url=http://decisions.example.com," + insecure + "," + token, "the token would go in clear"},
		{"manager.decisionLog.url=http://127.0.0.1.example.com," + insecure + "," + token, "the token would go in clear"},
		// Spellings the manager does not take for its loopback: it would
		// refuse to start.
		{"manager.decisionLog.url=http://127.1," + insecure + "," + token, "the token would go in clear"},
		{"manager.decisionLog.url=http://127.0.0.1./v1," + insecure + "," + token, "the token would go in clear"},
		{"manager.decisionLog.url=http://127.0.0.256," + insecure + "," + token, "the token would go in clear"},
		{"manager.decisionLog.url=http://127.01.0.1," + insecure + "," + token, "the token would go in clear"},
	} {
		out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set", c.values)
		require.Error(t, err, c.values)
		assert.Contains(t, string(out), c.want, c.values)
		assert.NotContains(t, string(out), "s3cret", c.values)
	}
}

var (
	yes, no  = true, false
	ptrTrue  = &yes
	ptrFalse = &no
)

func TestServicesAndDisruptionBudgetSelectTheManagerPods(t *testing.T) {
	objs := render(t)
	dep := objs.deployment(t)
	labels := dep.Spec.Template.Labels
	assert.Subset(t, labels, dep.Spec.Selector.MatchLabels)

	metrics := typed[corev1.Service](t, objs.get(t, "Service", release+"-metrics"))
	assert.Subset(t, labels, metrics.Spec.Selector)
	require.Len(t, metrics.Spec.Ports, 1)
	assert.EqualValues(t, 8080, metrics.Spec.Ports[0].Port)
	assert.EqualValues(t, 8080, containerPort(t, dep, metrics.Spec.Ports[0].TargetPort.StrVal))

	pdb := objs.get(t, "PodDisruptionBudget", release)
	minAvailable, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "minAvailable")
	assert.EqualValues(t, 1, minAvailable)
	selector, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
	assert.Subset(t, labels, selector)
}

// TestLeaderElectionRole: the Lease is the manager's LeaderElectionID, in the
// release namespace, and the manager may renew only that one.
func TestLeaderElectionRole(t *testing.T) {
	objs := render(t)
	rules := objs.boundRoles(t)["Role/"+namespace+"/"+release+"-leader-election"]
	require.NotNil(t, rules, "the leader-election Role is not bound to the manager")
	assert.True(t, grants(rules, "coordination.k8s.io", "leases", "create", ""))
	for _, verb := range []string{"get", "update"} {
		assert.True(t, grants(rules, "coordination.k8s.io", "leases", verb, manager.LeaderElectionID))
		assert.False(t, grants(rules, "coordination.k8s.io", "leases", verb, "another-lease"))
	}
	assert.Empty(t, render(t, "manager.leaderElect=false", "replicaCount=1").all("Role", release+"-leader-election"))
}

// TestShardingRoleAndFlags: with manager.sharding.shards the manager is
// given the shard count and timings, and the Leases of its own namespace
// only (their names follow the Pods' names), deletion included (the
// membership Leases of Pods gone); without it, neither.
func TestShardingRoleAndFlags(t *testing.T) {
	objs := render(t, "manager.sharding.shards=16", "manager.sharding.leaseDuration=4s")
	dep := objs.deployment(t)
	assert.Equal(t, "16", argValue(t, dep, "--shards"))
	assert.Equal(t, "4s", argValue(t, dep, "--shard-lease-duration"))
	rules := objs.boundRoles(t)["Role/"+namespace+"/"+release+"-shards"]
	require.NotNil(t, rules, "the sharding Role is not bound to the manager")
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		assert.True(t, grants(rules, "coordination.k8s.io", "leases", verb, "ichor-policy-member-3"), verb)
	}
	for _, r := range rules {
		assert.Equal(t, []string{"leases"}, r.Resources, "the sharding Role grants Leases only")
		assert.Equal(t, []string{"coordination.k8s.io"}, r.APIGroups)
	}
	plain := render(t)
	assert.Empty(t, plain.all("Role", release+"-shards"))
	for _, arg := range args(plain.deployment(t)) {
		assert.NotContains(t, arg, "--shard")
	}
}

// TestShippedRoles: ichor-admin, ichor-operator and ichor-viewer are rendered
// with deploy/rbac/roles.yaml's rules and no others, none of them holds the
// break-glass kubeconfig, and they can be left out.
func TestShippedRoles(t *testing.T) {
	want := map[string][]rbacv1.PolicyRule{}
	// One List, so that opa test loads every role of it.
	list := decode(t, readFile(t, filepath.Join(root(t), "deploy", "rbac", "roles.yaml"))).get(t, "List", "")
	items, _, err := unstructured.NestedSlice(list.Object, "items")
	require.NoError(t, err)
	for _, item := range items {
		role := typed[rbacv1.ClusterRole](t, &unstructured.Unstructured{Object: item.(map[string]any)})
		want[role.Name] = role.Rules
	}
	require.Len(t, want, 3)
	objs := render(t)
	for name, rules := range want {
		assert.Equal(t, rules, typed[rbacv1.ClusterRole](t, objs.get(t, "ClusterRole", name)).Rules, name)
	}
	for _, obj := range objs.all("ClusterRole", "") {
		for _, r := range typed[rbacv1.ClusterRole](t, obj).Rules {
			assert.NotContains(t, r.Resources, "talosclusters/kubeconfig-super-admin", "%s grants the break-glass kubeconfig", obj.GetName())
		}
	}
	viewer := typed[rbacv1.ClusterRole](t, objs.get(t, "ClusterRole", "ichor-viewer")).Rules
	assert.False(t, grants(viewer, "ichor.dev", "talosclusters/talosconfig-reader", "download", ""))
	for _, name := range []string{"ichor-admin", "ichor-operator"} {
		rules := typed[rbacv1.ClusterRole](t, objs.get(t, "ClusterRole", name)).Rules
		assert.True(t, grants(rules, "ichor.dev", "talosclusters/talosconfig-reader", "download", ""), name)
		assert.True(t, grants(rules, "ichor.dev", "taloscredentialrequests", "create", ""), name)
	}

	objs = render(t, "rbac.shippedRoles=false")
	for name := range want {
		assert.Empty(t, objs.all("ClusterRole", name))
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// TestTheInvariantCatchesTheClientSignerWithoutItsApprover: the default
// render with the client signer's rule put back is caught.
func TestTheInvariantCatchesTheClientSignerWithoutItsApprover(t *testing.T) {
	objs := render(t, "manager.kubeletClientApprover=true")
	got := violationsWith(t, objs.maps(), release+"-manager", false)
	require.Len(t, got, 1)
	assert.Equal(t, "SignerNotEnabled", got[0].Code)
}

// TestSecretsAreReadInTheReleaseNamespaceOrTheNamespacesNamed: by default
// the manager may get Secrets in the release namespace only, so that a leaked
// token is not every cluster's CA keys; rbac.secretsNamespaces names others
// instead, and cluster-wide is the explicit rbac.secretsClusterWide.
func TestSecretsAreReadInTheReleaseNamespaceOrTheNamespacesNamed(t *testing.T) {
	bound := render(t).boundRoles(t)
	manager := bound["ClusterRole//"+release+"-manager"]
	assert.False(t, grants(manager, "", "secrets", "get", "any-secret"), "by default no cluster-wide get on Secrets")
	for key, rules := range bound {
		if strings.HasPrefix(key, "ClusterRole/") {
			assert.False(t, grants(rules, "", "secrets", "get", "any-secret"), "%s grants get on every Secret", key)
		}
	}
	rules := bound["Role/"+namespace+"/"+release+"-manager-secrets"]
	require.NotNil(t, rules, "no Role for the clusters' Secrets in the release namespace")
	assert.True(t, grants(rules, "", "secrets", "get", "talos-secrets"))
	assert.False(t, grants(rules, "", "secrets", "list", ""))

	objs := render(t, "rbac.secretsNamespaces={team-a,team-b}")
	bound = objs.boundRoles(t)
	manager = bound["ClusterRole//"+release+"-manager"]
	assert.False(t, grants(manager, "", "secrets", "get", "any-secret"), "no cluster-wide get on Secrets once namespaces are named")
	for _, ns := range []string{"team-a", "team-b"} {
		rules := bound["Role/"+ns+"/"+release+"-manager-secrets"]
		require.NotNil(t, rules, "no Role bound to the manager in %s", ns)
		assert.True(t, grants(rules, "", "secrets", "get", "talos-secrets"))
		assert.False(t, grants(rules, "", "secrets", "list", ""))
	}
	assert.Nil(t, bound["Role/"+namespace+"/"+release+"-manager-secrets"], "the namespaces named replace the release namespace")
	// Its own Secrets are still read and written by name in its namespace.
	own := bound["Role/"+namespace+"/"+release+"-manager"]
	assert.True(t, grants(own, "", "secrets", "update", credential.DefaultKeySecretName))

	bound = render(t, "rbac.secretsClusterWide=true").boundRoles(t)
	assert.True(t, grants(bound["ClusterRole//"+release+"-manager"], "", "secrets", "get", "any-secret"), "cluster-wide when asked for")
	assert.Nil(t, bound["Role/"+namespace+"/"+release+"-manager-secrets"])

	out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace,
		"--set", "rbac.secretsClusterWide=true", "--set", "rbac.secretsNamespaces={team-a}")
	require.Error(t, err)
	assert.Contains(t, string(out), "rbac.secretsClusterWide and rbac.secretsNamespaces exclude each other")
}

func TestAdmissionPolicyAndKeyAreInstalled(t *testing.T) {
	objs := render(t)
	policy := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs.get(t, "ValidatingAdmissionPolicy", "ichor-credential-requester"))
	assert.Equal(t, admissionregistrationv1.Fail, *policy.Spec.FailurePolicy)
	binding := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs.get(t, "ValidatingAdmissionPolicyBinding", "ichor-credential-requester"))
	assert.Equal(t, policy.Name, binding.Spec.PolicyName)
	assert.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, binding.Spec.ValidationActions)

	key := typed[corev1.Secret](t, objs.get(t, "Secret", credential.DefaultKeySecretName))
	assert.Equal(t, namespace, key.Namespace)
	assert.Empty(t, key.Data, "the chart must not render the key: an upgrade would replace the manager's")
	own := objs.boundRoles(t)["Role/"+namespace+"/"+release+"-manager"]
	for _, verb := range []string{"get", "update"} {
		assert.True(t, grants(own, "", "secrets", verb, credential.DefaultKeySecretName))
	}
}

func TestAdminCredentialsValue(t *testing.T) {
	// A new install makes no shared binding: each person gets their own from
	// the manager.
	objs := render(t)
	assert.Empty(t, objs.all("ClusterRoleBinding", "ichor:cluster-admins"))
	assert.NotContains(t, args(objs.deployment(t)), "--admin-kubeconfigs=false")

	// Kept explicitly for the migration window: an ordinary release resource.
	objs = render(t, "adminCredentials.sharedBinding=true")
	binding := typed[rbacv1.ClusterRoleBinding](t, objs.get(t, "ClusterRoleBinding", "ichor:cluster-admins"))
	assert.Empty(t, binding.Annotations["helm.sh/hook"], "an ordinary release resource, so every sync converges on the value")
	assert.Equal(t, "cluster-admin", binding.RoleRef.Name)
	assert.Empty(t, render(t, "adminCredentials.sharedBinding=false").all("ClusterRoleBinding", "ichor:cluster-admins"))

	objs = render(t, "adminCredentials.enabled=false", "adminCredentials.sharedBinding=true")
	assert.Empty(t, objs.all("ClusterRoleBinding", "ichor:cluster-admins"))
	assert.Contains(t, args(objs.deployment(t)), "--admin-kubeconfigs=false")

	out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set", "adminCredentials.binding=false")
	require.Error(t, err)
	assert.Contains(t, string(out), "adminCredentials.binding is gone")
}

func TestLocalClustersValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--local-clusters")
	dep := render(t, "manager.localClusters={ichor/mgmt,ichor/edge}").deployment(t)
	assert.Equal(t, "ichor/mgmt,ichor/edge", argValue(t, dep, "--local-clusters"))
}

// The manager waits, not ready, for exactly the admission policy bindings the
// chart renders (review 256 F1: Helm applies them last), each named as the
// policy it binds, which the chart renders too (review 258 F5).
func TestTheManagerWaitsForTheChartsPolicyBindings(t *testing.T) {
	objs := render(t)
	var rendered, policies []string
	for _, b := range objs.all("ValidatingAdmissionPolicyBinding", "") {
		rendered = append(rendered, b.GetName())
		binding := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, b)
		assert.Equal(t, b.GetName(), binding.Spec.PolicyName, "the manager reads the policy of the binding's own name")
		assert.Contains(t, binding.Spec.ValidationActions, admissionregistrationv1.Deny, b.GetName())
	}
	for _, p := range objs.all("ValidatingAdmissionPolicy", "") {
		policies = append(policies, p.GetName())
	}
	require.NotEmpty(t, rendered)
	assert.ElementsMatch(t, rendered, policies)
	assert.ElementsMatch(t, rendered, strings.Split(argValue(t, objs.deployment(t), "--admission-policy-bindings"), ","))
	// And may read those alone (review 258 F6), policies and bindings.
	role := typed[rbacv1.ClusterRole](t, objs.get(t, "ClusterRole", release+"-manager"))
	var found bool
	for _, rule := range role.Rules {
		if slices.Contains(rule.APIGroups, "admissionregistration.k8s.io") &&
			(slices.Contains(rule.Resources, "validatingadmissionpolicybindings") || slices.Contains(rule.Resources, "validatingadmissionpolicies")) {
			found = true
			assert.ElementsMatch(t, []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, rule.Resources)
			assert.Equal(t, []string{"get"}, rule.Verbs)
			assert.ElementsMatch(t, rendered, rule.ResourceNames)
		}
	}
	assert.True(t, found, "no rule to read the bindings")
}

// Empty, the manager names its own namespace (review 254 F4).
func TestComponentNamespacesValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--component-namespaces")
	dep := render(t, "manager.componentNamespaces={ichor-system,ichor-ui}").deployment(t)
	assert.Equal(t, "ichor-system,ichor-ui", argValue(t, dep, "--component-namespaces"))
	out, err := renderOutput(t, "manager.componentNamespaces={Ichor}")
	require.Error(t, err)
	assert.Contains(t, string(out), "at '/manager/componentNamespaces/0'")
}

func TestRemoteKubeconfigAllowInsecureValue(t *testing.T) {
	assert.NotContains(t, args(render(t).deployment(t)), "--remote-kubeconfig-allow-insecure")
	dep := render(t, "manager.remoteKubeconfigAllowInsecure=true").deployment(t)
	assert.Contains(t, args(dep), "--remote-kubeconfig-allow-insecure")
}

// The denied networks are the manager's own default unless a list is given;
// an empty list is passed as such (it denies none), not dropped.
func TestRemoteKubeconfigDeniedNetworksValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--remote-kubeconfig-denied-networks")
	for value, flag := range map[string]string{"remoteKubeconfigDeniedNetworks": "--remote-kubeconfig-denied-networks", "nodeDeniedNetworks": "--node-denied-networks"} {
		dep := render(t, "manager."+value+"={default,10.96.0.0/12,fd00::/8}").deployment(t)
		assert.Equal(t, "default,10.96.0.0/12,fd00::/8", argValue(t, dep, flag))
		dep = renderWith(t, []string{"--set-json", "manager." + value + "=[]"}).deployment(t)
		assert.Contains(t, args(dep), flag+"=")
		out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set", "manager."+value+"={10.0.0.0}")
		require.Error(t, err, "a network without its length rendered")
		assert.Contains(t, string(out), value)
	}
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--node-denied-networks")
}

// The manager requires admission pins unless told otherwise, for the time
// of an upgrade from a release whose webhook wrote none.
func TestRequireAdmissionPinsValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--require-admission-pins")
	dep := render(t, "manager.requireAdmissionPins=false").deployment(t)
	assert.Contains(t, args(dep), "--require-admission-pins=false")
	// A value missing, as after `helm upgrade --reuse-values` from a chart
	// without it, keeps the pins (review 34 M1).
	assert.NotContains(t, strings.Join(args(render(t, "manager.requireAdmissionPins=null").deployment(t)), " "), "--require-admission-pins")
	out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set-string", "manager.requireAdmissionPins=false")
	require.Error(t, err, "a string rendered")
	assert.Contains(t, string(out), "requireAdmissionPins")
}

// The manager requires a secrets Secret to name its clusters unless told
// otherwise, for the time of an upgrade from a release without the claim; a
// value missing (helm upgrade --reuse-values from such a chart) keeps it.
func TestRequireSecretsClaimValue(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--require-secrets-claim")
	assert.Contains(t, args(render(t, "manager.requireSecretsClaim=false").deployment(t)), "--require-secrets-claim=false")
	assert.NotContains(t, strings.Join(args(render(t, "manager.requireSecretsClaim=null").deployment(t)), " "), "--require-secrets-claim")
}

func TestLeaseAndDecisionLogTimingsAreValues(t *testing.T) {
	dep := render(t).deployment(t)
	assert.NotContains(t, strings.Join(args(dep), " "), "--leader-elect-")
	assert.EqualValues(t, 30, *dep.Spec.Template.Spec.TerminationGracePeriodSeconds)
	dep = render(t, "manager.retryPeriod=500ms", "manager.leaseDuration=20s", "manager.renewDeadline=15s",
		"manager.decisionLog.url=https://logs.example", "manager.decisionLog.flushTimeout=20s",
		"manager.decisionLog.bufferEvents=5000", "terminationGracePeriodSeconds=45").deployment(t)
	assert.Equal(t, "500ms", argValue(t, dep, "--leader-elect-retry-period"))
	assert.Equal(t, "20s", argValue(t, dep, "--leader-elect-lease-duration"))
	assert.Equal(t, "15s", argValue(t, dep, "--leader-elect-renew-deadline"))
	assert.Equal(t, "20s", argValue(t, dep, "--decision-log-flush-timeout"))
	assert.Equal(t, "5000", argValue(t, dep, "--decision-log-buffer-events"))
	assert.EqualValues(t, 45, *dep.Spec.Template.Spec.TerminationGracePeriodSeconds)
}

// The marks of the records of decisions by hand are one ConfigMap the chart
// creates empty: the manager holds get and update on that name, and may
// create no ConfigMap at all (review 4, R3: that right cannot be limited to
// names, and would reach the bundle epoch's).
func TestRecordMarksAreOneConfigMapTheManagerCannotCreate(t *testing.T) {
	objs := render(t)
	cm := typed[corev1.ConfigMap](t, objs.get(t, "ConfigMap", manualact.MarksConfigMapName))
	assert.Equal(t, namespace, cm.Namespace)
	assert.Empty(t, cm.Data, "an upgrade must not drop the marks the manager wrote")
	for name, rules := range objs.boundRoles(t) {
		assert.False(t, grants(rules, "", "configmaps", "create", ""), "%s grants the manager create on ConfigMaps", name)
	}
	own := objs.boundRoles(t)["Role/"+namespace+"/"+release+"-manager"]
	for _, verb := range []string{"get", "update"} {
		assert.True(t, grants(own, "", "configmaps", verb, manualact.MarksConfigMapName))
	}
}

// The highest bundle epoch is kept in a ConfigMap the chart creates empty,
// on which the manager holds get and update by name, never create; the
// bundle limits are values.
func TestBundleEpochRecordAndLimits(t *testing.T) {
	objs := render(t)
	cm := typed[corev1.ConfigMap](t, objs.get(t, "ConfigMap", bundleepoch.ConfigMapName))
	assert.Equal(t, namespace, cm.Namespace)
	assert.Empty(t, cm.Data, "the chart must not render the epoch: an upgrade would lower the manager's")
	own := objs.boundRoles(t)["Role/"+namespace+"/"+release+"-manager"]
	for _, verb := range []string{"get", "update"} {
		assert.True(t, grants(own, "", "configmaps", verb, bundleepoch.ConfigMapName))
	}
	assert.False(t, grants(own, "", "configmaps", "create", bundleepoch.ConfigMapName))
	dep := objs.deployment(t)
	assert.NotContains(t, strings.Join(args(dep), " "), "--bundle-max-")
	dep = render(t, "manager.bundle.limits.compressedBytes=1048576", "manager.bundle.limits.uncompressedBytes=8388608",
		"manager.bundle.limits.files=500").deployment(t)
	assert.Equal(t, "1048576", argValue(t, dep, "--bundle-max-compressed-bytes"))
	assert.Equal(t, "8388608", argValue(t, dep, "--bundle-max-uncompressed-bytes"))
	assert.Equal(t, "500", argValue(t, dep, "--bundle-max-files"))
}
