// Package webhooktest runs the credential webhook against a test API server:
// it installs deploy/webhook's ValidatingWebhookConfiguration with envtest's
// WebhookInstallOptions (serving certificates it generates, a URL on
// localhost), and reads the RBAC a package's +kubebuilder:rbac markers ask
// for, so a test can run a component with exactly those rights.
package webhooktest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"
)

// RepoRoot is the directory of this repository's go.mod.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("webhooktest: cannot locate the source file")
	}
	dir := filepath.Dir(file)
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

// MarkerRules reads the +kubebuilder:rbac markers of the Go files of a
// package directory (relative to the repository root) as PolicyRules, the way
// controller-gen renders them into the manager's ClusterRole.
func MarkerRules(pkgDir string) ([]rbacv1.PolicyRule, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(root, pkgDir, "*.go"))
	if err != nil {
		return nil, err
	}
	var rules []rbacv1.PolicyRule
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		fileRules, err := markerRulesOf(f)
		if err != nil {
			return nil, err
		}
		rules = append(rules, fileRules...)
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("webhooktest: no +kubebuilder:rbac markers in %s", pkgDir)
	}
	return rules, nil
}

func markerRulesOf(path string) ([]rbacv1.PolicyRule, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rules []rbacv1.PolicyRule
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		spec, ok := strings.CutPrefix(line, "// +kubebuilder:rbac:")
		if !ok {
			continue
		}
		var rule rbacv1.PolicyRule
		for _, field := range strings.Split(spec, ",") {
			key, value, ok := strings.Cut(field, "=")
			if !ok {
				return nil, fmt.Errorf("webhooktest: %s: marker field %q has no value", path, field)
			}
			values := strings.Split(strings.Trim(value, `"`), ";")
			switch key {
			case "groups":
				rule.APIGroups = values
			case "resources":
				rule.Resources = values
			case "verbs":
				rule.Verbs = values
			case "resourceNames":
				rule.ResourceNames = values
			default:
				return nil, fmt.Errorf("webhooktest: %s: unknown marker field %q", path, key)
			}
		}
		rules = append(rules, rule)
	}
	return rules, sc.Err()
}

// ShippedRoles are the ClusterRoles of deploy/rbac/roles.yaml.
func ShippedRoles() ([]rbacv1.ClusterRole, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "rbac", "roles.yaml"))
	if err != nil {
		return nil, err
	}
	var roles []rbacv1.ClusterRole
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var role rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict([]byte(doc), &role); err != nil {
			return nil, fmt.Errorf("webhooktest: roles.yaml: %w", err)
		}
		if role.Kind != "ClusterRole" {
			return nil, fmt.Errorf("webhooktest: roles.yaml: unexpected kind %q", role.Kind)
		}
		roles = append(roles, role)
	}
	return roles, nil
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
