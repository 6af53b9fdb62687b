package kubeletclient_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/ichor-dev/ichor-policy/engine"
)

// roleFile is the manager's ClusterRole as tools/controller-gen/generate.sh
// writes it from the +kubebuilder:rbac markers, this package's included.
var roleFile = filepath.Join("..", "..", "deploy", "rbac", "role.yaml")

const managerRole = "ichor-policy-manager"

type violation struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// violations evaluates the RBAC invariant (policy/ichor/rbac) on objects
// with the engine, as `ichor policy` would.
func violations(t *testing.T, objects []map[string]any) []violation {
	t.Helper()
	eng, err := engine.New(t.Context(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Stop(t.Context()) })
	d, err := eng.Decide(t.Context(), "ichor/rbac/violations", map[string]any{
		"manager_role": managerRole,
		"objects":      objects,
		// The generated role holds the rights of every feature; the chart
		// drops the client signer's when its approver is off.
		"kubelet_client_approver": true,
	})
	require.NoError(t, err)
	var out []violation
	require.NoError(t, json.Unmarshal(d.Result, &out), string(d.Result))
	return out
}

func loadObjects(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []map[string]any
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if obj != nil {
			out = append(out, obj)
		}
	}
	require.NotEmpty(t, out, "%s holds no object", path)
	return out
}

// TestManagerRoleHoldsNothingElseOnCertificates checks the generated role,
// with this controller's markers in it, against the least-privilege
// invariant: on certificates.k8s.io only get/list/watch on the requests,
// update on their approval, approve on the two kubelet signers by name.
// Anything else there (sign, another signer, a wildcard) fails it.
func TestManagerRoleHoldsNothingElseOnCertificates(t *testing.T) {
	objects := loadObjects(t, roleFile)
	assert.Empty(t, violations(t, objects), "%s breaks the RBAC invariant; regenerate it with tools/controller-gen/generate.sh and fix the markers", roleFile)

	// What this controller needs is there: the file is generated from its
	// markers, not stale.
	rules := roleRules(t, objects)
	assert.True(t, grants(rules, "certificates.k8s.io", "signers", "approve", "kubernetes.io/kube-apiserver-client-kubelet"),
		"no approve on the kube-apiserver-client-kubelet signer")
	assert.True(t, grants(rules, "authorization.k8s.io", "subjectaccessreviews", "create", ""), "no create on subjectaccessreviews")
	assert.True(t, grants(rules, "certificates.k8s.io", "certificatesigningrequests/approval", "update", ""))
	assert.True(t, grants(rules, "certificates.k8s.io", "certificatesigningrequests", "watch", ""))
}

// TestRoleCheckCatchesAnExtraRight proves the check above has teeth: the
// same role with one more right on certificates.k8s.io is a violation.
func TestRoleCheckCatchesAnExtraRight(t *testing.T) {
	for name, extra := range map[string]map[string]any{
		"sign": {
			"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"signers"},
			"resourceNames": []any{"kubernetes.io/kube-apiserver-client-kubelet"}, "verbs": []any{"sign"},
		},
		"another-signer": {
			"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"signers"},
			"resourceNames": []any{"kubernetes.io/kube-apiserver-client"}, "verbs": []any{"approve"},
		},
		"every-signer": {
			"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"signers"}, "verbs": []any{"approve"},
		},
		"status": {
			"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"certificatesigningrequests/status"}, "verbs": []any{"update"},
		},
		"delete": {
			"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"certificatesigningrequests"}, "verbs": []any{"delete"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			objects := loadObjects(t, roleFile)
			for _, obj := range objects {
				if obj["kind"] == "ClusterRole" {
					obj["rules"] = append(obj["rules"].([]any), extra)
				}
			}
			assert.NotEmpty(t, violations(t, objects))
		})
	}
}

func roleRules(t *testing.T, objects []map[string]any) []map[string]any {
	t.Helper()
	for _, obj := range objects {
		meta, _ := obj["metadata"].(map[string]any)
		if obj["kind"] != "ClusterRole" || meta["name"] != managerRole {
			continue
		}
		var out []map[string]any
		for _, r := range obj["rules"].([]any) {
			out = append(out, r.(map[string]any))
		}
		return out
	}
	require.FailNow(t, "no ClusterRole "+managerRole)
	return nil
}

// grants reports whether a rule names group, resource and verb (and the
// resource name, when one is given).
func grants(rules []map[string]any, group, resource, verb, name string) bool {
	has := func(rule map[string]any, key, want string) bool {
		list, _ := rule[key].([]any)
		return slices.Contains(list, any(want))
	}
	for _, r := range rules {
		if has(r, "apiGroups", group) && has(r, "resources", resource) && has(r, "verbs", verb) &&
			(name == "" || has(r, "resourceNames", name)) {
			return true
		}
	}
	return false
}
