package cli_test

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// run executes the ichor command line in-process.
func run(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// manifest writes a CSR object as kubectl prints it and returns its path.
func manifest(t *testing.T, obj *certificatesv1.CertificateSigningRequest, asJSON bool) string {
	t.Helper()
	var data []byte
	var err error
	name := "csr.yaml"
	if asJSON {
		data, err = json.MarshalIndent(obj, "", "  ")
		name = "csr.json"
	} else {
		data, err = yaml.Marshal(obj)
	}
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

func request(t *testing.T, r csrgen.Request) []byte {
	t.Helper()
	if r.Subject.CommonName == "" && len(r.Subject.Organization) == 0 && r.Subject.ExtraNames == nil {
		r.Subject = csrgen.NodeSubject("worker-1")
	}
	b, err := csrgen.PEM(r)
	require.NoError(t, err)
	return b
}

// identity is worker-1 as its Talos API reports it.
var identity = []string{"--nodename", "worker-1", "--hostname", "worker-1.lab", "--node-ip", "10.5.0.2", "--node-ip", "fd00::2"}

func TestCheckCSRGivesTheRuleDecisionForEveryReason(t *testing.T) {
	good := csrgen.Request{DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}}
	serving := func(r csrgen.Request, edit ...func(*certificatesv1.CertificateSigningRequest)) *certificatesv1.CertificateSigningRequest {
		obj := csrgen.ServingObject("csr-1", "worker-1", request(t, r))
		for _, e := range edit {
			e(obj)
		}
		return obj
	}
	tampered, err := csrgen.TamperSignature(request(t, good))
	require.NoError(t, err)
	uri, err := url.Parse("spiffe://cluster.local/worker-1")
	require.NoError(t, err)
	keyUsage := pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: []byte{0x03, 0x02, 0x05, 0xa0}}

	for _, tc := range []struct {
		name   string
		obj    *certificatesv1.CertificateSigningRequest
		flags  []string
		action string
		codes  []string
	}{
		{"good", serving(good), identity, engine.ActionApprove, []string{"IchorKubeletServing"}},
		{"good with key encipherment", serving(good, func(o *certificatesv1.CertificateSigningRequest) {
			o.Spec.Usages = []certificatesv1.KeyUsage{"digital signature", "key encipherment", "server auth"}
		}), identity, engine.ActionApprove, []string{"IchorKubeletServing"}},
		{"good IPv6 only", serving(csrgen.Request{IPs: []net.IP{net.ParseIP("fd00::2")}}), identity, engine.ActionApprove, []string{"IchorKubeletServing"}},
		{"unparseable PEM", serving(good, func(o *certificatesv1.CertificateSigningRequest) { o.Spec.Request = []byte("not a PEM") }), identity, engine.ActionDeny, []string{"MalformedRequest"}},
		{"tampered signature", serving(good, func(o *certificatesv1.CertificateSigningRequest) { o.Spec.Request = tampered }), identity, engine.ActionDeny, []string{"InvalidSignature"}},
		{"wrong username", serving(good, func(o *certificatesv1.CertificateSigningRequest) { o.Spec.Username = "system:node:worker-2" }), identity, engine.ActionDeny, []string{"UsernameMismatch"}},
		{"nodes group missing", serving(good, func(o *certificatesv1.CertificateSigningRequest) { o.Spec.Groups = []string{"system:authenticated"} }), identity, engine.ActionDeny, []string{"GroupMissing"}},
		{"extra organization", serving(csrgen.Request{
			Subject:  pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes", "system:masters"}},
			DNSNames: []string{"worker-1"},
		}), identity, engine.ActionDeny, []string{"SubjectMismatch"}},
		{"organizational unit", serving(csrgen.Request{
			Subject:  pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}, OrganizationalUnit: []string{"ops"}},
			DNSNames: []string{"worker-1"},
		}), identity, engine.ActionDeny, []string{"SubjectMismatch"}},
		{"email name", serving(csrgen.Request{DNSNames: []string{"worker-1"}, Emails: []string{"root@worker-1"}}), identity, engine.ActionDeny, []string{"SANTypeForbidden"}},
		{"URI name", serving(csrgen.Request{DNSNames: []string{"worker-1"}, URIs: []*url.URL{uri}}), identity, engine.ActionDeny, []string{"SANTypeForbidden"}},
		{"no name", serving(csrgen.Request{}), identity, engine.ActionDeny, []string{"SANMissing"}},
		{"foreign DNS name", serving(csrgen.Request{DNSNames: []string{"kubernetes.default.svc"}}), identity, engine.ActionDeny, []string{"DNSNameNotNode"}},
		{"another node's IP", serving(csrgen.Request{DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.3")}}), identity, engine.ActionDeny, []string{"IPNotNode"}},
		{"client auth usage", serving(good, func(o *certificatesv1.CertificateSigningRequest) {
			o.Spec.Usages = []certificatesv1.KeyUsage{"digital signature", "server auth", "client auth"}
		}), identity, engine.ActionDeny, []string{"UsagesNotAllowed"}},
		{"extra extension", serving(csrgen.Request{DNSNames: []string{"worker-1"}, Extensions: []pkix.Extension{keyUsage}}), identity, engine.ActionDeny, []string{"ExtensionForbidden"}},
		{"lifetime above the cap", serving(good, func(o *certificatesv1.CertificateSigningRequest) {
			o.Spec.ExpirationSeconds = ptr.To[int32](366 * 24 * 3600)
		}), identity, engine.ActionDeny, []string{"ExpirationTooLong"}},
		{"unknown machine", serving(good), []string{"--machine-unknown"}, engine.ActionPending, []string{"MachineUnknown"}},
		{"unreadable node", serving(good), []string{"--node-unreadable"}, engine.ActionPending, []string{"NodeUnreadable"}},
		{"Talos reports another Nodename", serving(good), []string{"--nodename", "worker-9", "--machine", "worker-1", "--node-ip", "10.5.0.2"}, engine.ActionPending, []string{"NodenameMismatch"}},
	} {
		for _, asJSON := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: " yaml", true: " json"}[asJSON], func(t *testing.T) {
				args := append([]string{"policy", "check-csr", "-o", "json", "-f", manifest(t, tc.obj, asJSON)}, tc.flags...)
				code, stdout, stderr := run(t, "", args...)
				require.Equal(t, cli.ExitOK, code, stderr)

				var d engine.CSRDecision
				require.NoError(t, json.Unmarshal([]byte(stdout), &d), stdout)
				assert.Equal(t, tc.action, d.Action)
				var codes []string
				for _, r := range d.Reasons {
					codes = append(codes, r.Code)
					assert.NotEmpty(t, r.Message)
				}
				assert.Equal(t, tc.codes, codes)
				assert.NotEmpty(t, d.DecisionID)
				assert.True(t, strings.HasPrefix(d.Revision, "sha256:"), d.Revision)
			})
		}
	}
}

func TestCheckCSRReadsStdin(t *testing.T) {
	obj := csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}}))
	data, err := yaml.Marshal(obj)
	require.NoError(t, err)

	code, stdout, stderr := run(t, string(data), append([]string{"policy", "check-csr", "-o", "json", "-f", "-"}, identity...)...)

	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, `"action": "approve"`)
}

func TestCheckCSRRefusesBadInputClearly(t *testing.T) {
	good := manifest(t, csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})), false)
	other := csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}}))
	other.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	secret := filepath.Join(t.TempDir(), "secret.yaml")
	require.NoError(t, os.WriteFile(secret, []byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n"), 0o600))
	list := filepath.Join(t.TempDir(), "list.yaml")
	require.NoError(t, os.WriteFile(list, []byte("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Secret\n  metadata:\n    name: x\n"), 0o600))
	// A kind and apiVersion are the file's writer's: kept to their line.
	forgedKind := filepath.Join(t.TempDir(), "kind.yaml")
	require.NoError(t, os.WriteFile(forgedKind, []byte("apiVersion: \"v1\\nichor: forged line\"\nkind: \"Pod\\u001b[2J\"\n"), 0o600))
	notYAML := filepath.Join(t.TempDir(), "x")
	require.NoError(t, os.WriteFile(notYAML, []byte("\t{{{"), 0o600))

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no file", []string{"policy", "check-csr", "-o", "json", "--nodename", "worker-1"}, cli.ExitUsage, "or -f FILE"},
		{"missing file", []string{"policy", "check-csr", "-o", "json", "-f", "/nonexistent/csr.yaml", "--nodename", "worker-1"}, cli.ExitUsage, "no such file"},
		{"not YAML", []string{"policy", "check-csr", "-o", "json", "-f", notYAML, "--nodename", "worker-1"}, cli.ExitUsage, "neither YAML nor JSON"},
		{"a Secret", []string{"policy", "check-csr", "-o", "json", "-f", secret, "--nodename", "worker-1"}, cli.ExitUsage, "is a Secret (v1), not a certificates.k8s.io/v1 CertificateSigningRequest"},
		{"a list with a Secret", []string{"policy", "check-csr", "-o", "json", "-f", list, "--nodename", "worker-1"}, cli.ExitUsage, "item 0 is a Secret (v1), not a certificates.k8s.io/v1 CertificateSigningRequest"},
		{"a kind and apiVersion with lines of their own", []string{"policy", "check-csr", "-o", "json", "-f", forgedKind, "--nodename", "worker-1"}, cli.ExitUsage, `is a Pod^[[2J (v1\nichor: forged line), not a certificates.k8s.io/v1 CertificateSigningRequest`},
		{"no identity", []string{"policy", "check-csr", "-o", "json", "-f", good}, cli.ExitUsage, "give the node's identity"},
		{"bad IP", []string{"policy", "check-csr", "-o", "json", "-f", good, "--nodename", "worker-1", "--node-ip", "10.5.0"}, cli.ExitUsage, `--node-ip "10.5.0" is not an IP address`},
		{"contradiction", []string{"policy", "check-csr", "-o", "json", "-f", good, "--machine-unknown", "--node-unreadable"}, cli.ExitUsage, "contradict"},
		{"unknown machine with identity", []string{"policy", "check-csr", "-o", "json", "-f", good, "--machine-unknown", "--nodename", "worker-1"}, cli.ExitUsage, "--machine-unknown takes no node identity"},
		{"unknown flag", []string{"policy", "check-csr", "-o", "json", "-f", good, "--bogus"}, cli.ExitUsage, "unknown flag: --bogus"},
		{"missing bundle", []string{"policy", "check-csr", "-o", "json", "-f", good, "--nodename", "worker-1", "--bundle", "/nonexistent"}, cli.ExitUsage, "no such file"},
		{"another signer", append([]string{"policy", "check-csr", "-o", "json", "-f", manifest(t, other, false)}, identity...), cli.ExitError, "no decision: the kubelet-serving rule governs signer kubernetes.io/kubelet-serving only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", tc.args...)
			assert.Equal(t, tc.code, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

func TestCheckCSRDecidesWithAnotherBundle(t *testing.T) {
	// A copy of the policy whose IP check is gone: the same request is approved,
	// and the revision printed is the candidate's.
	dir := harness.PolicyWithoutServingIPCheck(t)
	forged := manifest(t, csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{IPs: []net.IP{net.ParseIP("10.5.0.3")}})), false)

	_, before, _ := run(t, "", append([]string{"policy", "check-csr", "-o", "json", "-f", forged}, identity...)...)
	code, after, stderr := run(t, "", append([]string{"policy", "check-csr", "-o", "json", "-f", forged, "--bundle", dir}, identity...)...)

	require.Equal(t, cli.ExitOK, code, stderr)
	var b, a engine.CSRDecision
	require.NoError(t, json.Unmarshal([]byte(before), &b))
	require.NoError(t, json.Unmarshal([]byte(after), &a))
	assert.Equal(t, engine.ActionDeny, b.Action)
	assert.Equal(t, engine.ActionApprove, a.Action)
	assert.NotEqual(t, b.Revision, a.Revision)
}
