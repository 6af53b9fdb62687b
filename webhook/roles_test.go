package webhook_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// purposeTable is the part of policy/ichor/credentials/data.json a role
// check needs.
type purposeTable struct {
	Config struct {
		Purposes map[string]struct {
			ForPeople     bool                           `json:"for_people"`
			Authorization engine.CredentialAuthorization `json:"authorization"`
		} `json:"purposes"`
	} `json:"config"`
}

// grant is one verb on one resource (with its subresource) of one group.
type grant struct{ group, resource, verb string }

func (g grant) String() string { return fmt.Sprintf("%s %s.%s", g.verb, g.resource, g.group) }

func grantsOf(role rbacv1.ClusterRole) []grant {
	var out []grant
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, grant{g, res, v})
				}
			}
		}
	}
	return out
}

// TestShippedRolesMatchThePurposesTable checks deploy/rbac/roles.yaml against
// the policy's purposes table: the grants a role hands out are exactly the
// people's purposes it is meant to reach, and the break-glass purpose is in
// none.
func TestShippedRolesMatchThePurposesTable(t *testing.T) {
	root, err := webhooktest.RepoRoot()
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(root, "policy", "ichor", "credentials", "data.json"))
	require.NoError(t, err)
	var table purposeTable
	require.NoError(t, json.Unmarshal(data, &table))

	// The engine's requirements and the table agree, for every purpose of
	// the CRD: the webhook reviews what the table says.
	eng, err := engine.New(t.Context(), engine.Options{DecisionLog: discard{}, Log: os.Stderr})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Stop(t.Context()) })
	bySubresource := map[string]string{}
	for _, p := range ichorv1alpha1.CredentialPurposes() {
		req, err := eng.Requirements(t.Context(), string(p))
		require.NoError(t, err, p)
		row, ok := table.Config.Purposes[string(p)]
		require.True(t, ok, "purpose %s of the CRD is not in data.json", p)
		assert.Equal(t, row.Authorization, req.Authorization, p)
		bySubresource[req.Authorization.Resource+"/"+req.Authorization.Subresource] = string(p)
	}

	roles, err := webhooktest.ShippedRoles()
	require.NoError(t, err)
	byName := map[string][]grant{}
	for _, r := range roles {
		byName[r.Name] = grantsOf(r)
		for _, rule := range r.Rules {
			// A wildcard would grant purposes added later without review.
			for _, field := range [][]string{rule.APIGroups, rule.Resources, rule.Verbs} {
				assert.NotContains(t, field, "*", "role %s uses a wildcard", r.Name)
			}
			assert.Empty(t, rule.NonResourceURLs, "role %s", r.Name)
		}
	}
	require.ElementsMatch(t, []string{"ichor-admin", "ichor-operator", "ichor-viewer"}, keys(byName))

	for name, grants := range byName {
		for _, g := range grants {
			assert.Equal(t, "ichor.dev", g.group, "role %s grants %s outside ichor.dev", name, g)
			// download is only ever the grant of a purpose for people.
			if g.verb == "download" {
				purpose, ok := bySubresource[g.resource]
				if assert.True(t, ok, "role %s grants %s, which is no purpose's authorization", name, g) {
					assert.True(t, table.Config.Purposes[purpose].ForPeople, "role %s grants %s, the grant of %s, which is not for people", name, g, purpose)
				}
			}
			assert.NotEqual(t, "talosclusters/kubeconfig-super-admin", g.resource, "role %s grants the break-glass kubeconfig", name)
			assert.NotEqual(t, "issue", g.verb, "role %s grants issue, the verb of Ichor's own components", name)
			// Only the manager answers a request or removes it.
			assert.NotEqual(t, "taloscredentialrequests/status", g.resource, "role %s", name)
			if g.resource == "taloscredentialrequests" {
				assert.Contains(t, []string{"create", "get", "list", "watch"}, g.verb, "role %s", name)
			}
		}
	}

	// ichor-viewer: reading Ichor's objects, nothing else.
	for _, g := range byName["ichor-viewer"] {
		assert.Contains(t, []string{"get", "list", "watch"}, g.verb, "ichor-viewer grants %s", g)
	}
	reader := grant{"ichor.dev", "talosclusters/talosconfig-reader", "download"}
	ask := []grant{{"ichor.dev", "taloscredentialrequests", "create"}, {"ichor.dev", "taloscredentialrequests", "get"}}
	for _, name := range []string{"ichor-operator", "ichor-admin"} {
		assert.Contains(t, byName[name], reader, name)
		for _, g := range ask {
			assert.Contains(t, byName[name], g, name)
		}
	}
	assert.NotContains(t, byName["ichor-viewer"], reader)
	for _, sub := range []string{"credentials", "kubeconfig-admin"} {
		g := grant{"ichor.dev", "talosclusters/" + sub, "download"}
		assert.Contains(t, byName["ichor-admin"], g)
		assert.NotContains(t, byName["ichor-operator"], g)
	}

	// Every purpose for people is reachable by some path: held by a shipped
	// role, or deliberately left to a hand-made binding (break-glass).
	for purpose, row := range table.Config.Purposes {
		if !row.ForPeople {
			continue
		}
		g := grant{row.Authorization.Group, row.Authorization.Resource + "/" + row.Authorization.Subresource, row.Authorization.Verb}
		held := slices.ContainsFunc(roles, func(r rbacv1.ClusterRole) bool { return slices.Contains(grantsOf(r), g) })
		assert.Equal(t, purpose != string(ichorv1alpha1.PurposeKubeconfigSuperAdmin), held, "purpose %s held by a shipped role", purpose)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
