package credentials

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
)

// What Go compares of the credential the admission record pins, for every
// shape the rule pins: the kind, the Talos role, the common name, the groups
// as a set with the person's own binding group, and whether that group is
// bound (to which role is the binding shape check's,
// TestADecisionsBindingOtherThanIchorsIsNeitherMadeNorSigned). The label is
// not compared, nor a record that pins nothing.
func TestOnlyTheCredentialAdmittedIsSigned(t *testing.T) {
	admin := `{"kind":"kubernetes","credential":"admin kubeconfig","groups":["ichor:admins"],"common_name":"ichor-admin:u:alice","bound_to":"cluster-admin"}`
	binding := &engine.AdminBindingDecision{Group: "ichor-admin:u:alice:abc", ClusterRole: "cluster-admin"}
	adminCert := func(mutate func(*engine.IssuedCertificate, *engine.AdminBindingDecision)) engine.CredentialIssuance {
		c := &engine.IssuedCertificate{Kind: engine.CertificateKindKubernetes, CommonName: "ichor-admin:u:alice", Groups: []string{"ichor-admin:u:alice:abc", "ichor:admins"}}
		b := *binding
		if mutate != nil {
			mutate(c, &b)
		}
		return engine.CredentialIssuance{Certificate: c, AdminBinding: &b}
	}
	reader := `{"kind":"talos","credential":"talosconfig (os:reader)","talos_role":"os:reader"}`
	for name, c := range map[string]struct {
		pinned string
		d      engine.CredentialIssuance
		want   string
	}{
		"as admitted": {admin, adminCert(nil), ""},
		"groups in another order": {admin, adminCert(func(c *engine.IssuedCertificate, _ *engine.AdminBindingDecision) {
			c.Groups = []string{"ichor:admins", "ichor-admin:u:alice:abc"}
		}), ""},
		"a group more": {admin, adminCert(func(c *engine.IssuedCertificate, _ *engine.AdminBindingDecision) {
			c.Groups = append(c.Groups, "system:masters")
		}), "the decision allows the groups"},
		"another person": {admin, adminCert(func(c *engine.IssuedCertificate, _ *engine.AdminBindingDecision) {
			c.CommonName = "ichor-admin:u:bob"
		}), `the common name "ichor-admin:u:bob", not "ichor-admin:u:alice"`},
		"no binding admitted": {`{"kind":"kubernetes","credential":"x","groups":["g"],"common_name":"n"}`,
			engine.CredentialIssuance{Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindKubernetes, CommonName: "n", Groups: []string{"g", "b"}},
				AdminBinding: &engine.AdminBindingDecision{Group: "b", ClusterRole: "cluster-admin"}}, "binds the person's group to a role, and the credential admitted no role"},
		"no binding made": {admin, engine.CredentialIssuance{Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindKubernetes, CommonName: "ichor-admin:u:alice", Groups: []string{"ichor:admins"}}},
			"binds no role, and the credential admitted the person's group to a role"},
		"a reader":          {reader, engine.CredentialIssuance{Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindTalos, TalosRole: "os:reader"}}, ""},
		"an operator":       {reader, engine.CredentialIssuance{Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindTalos, TalosRole: "os:operator"}}, `the Talos role "os:operator", not "os:reader"`},
		"another kind":      {reader, adminCert(nil), "allows a kubernetes certificate, not the talos credential admitted"},
		"nothing pinned":    {"", engine.CredentialIssuance{Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindTalos, TalosRole: "os:admin"}}, ""},
		"a pin that is not": {`[1]`, adminCert(nil), "the admission record's credential does not read"},
	} {
		t.Run(name, func(t *testing.T) {
			err := checkCredentialAdmitted(json.RawMessage(c.pinned), c.d)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			var f *failure
			assert.ErrorAs(t, err, &f, "the request is answered, not retried")
		})
	}
}
