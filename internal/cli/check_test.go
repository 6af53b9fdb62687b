package cli_test

import (
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// checkLine is one item of what a check command prints for a list with -o
// json: a List of CSRDecisions.
type checkLine struct {
	CSR string `json:"csr"`
	engine.CSRDecision
	// DocumentKind is the document's kind, CSRDecision; the kind of
	// request recognized is RequestKind.
	DocumentKind         string          `json:"kind"`
	RequestKind          string          `json:"request_kind"`
	Error                string          `json:"error"`
	AssumedAuthorization map[string]bool `json:"assumed_authorization"`
}

func checkLines(t *testing.T, stdout string) []checkLine {
	t.Helper()
	var list struct {
		APIVersion, Kind string
		Items            []checkLine
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	assert.Equal(t, "v1/List", list.APIVersion+"/"+list.Kind)
	return list.Items
}

func codes(d engine.CSRDecision) []string {
	var out []string
	for _, r := range d.Reasons {
		out = append(out, r.Code)
	}
	return out
}

// writeList writes objects as kubectl get csr -o yaml|json prints several: a
// v1 List whose items carry their apiVersion and kind; asAPI writes the
// CertificateSigningRequestList the API server sends, whose items do not.
func writeList(t *testing.T, asJSON, asAPI bool, objs ...*certificatesv1.CertificateSigningRequest) string {
	t.Helper()
	list := map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{}}
	if asAPI {
		list["apiVersion"], list["kind"] = "certificates.k8s.io/v1", "CertificateSigningRequestList"
	}
	var items []any
	for _, o := range objs {
		o = o.DeepCopy()
		if asAPI {
			o.TypeMeta = metav1.TypeMeta{}
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		require.NoError(t, err)
		items = append(items, u)
	}
	list["items"] = items
	var data []byte
	var err error
	if asJSON {
		data, err = json.Marshal(list)
	} else {
		data, err = yaml.Marshal(list)
	}
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "list")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

func clientObject(t *testing.T, name, username string, subject pkix.Name) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	obj := csrgen.ServingObject(name, "worker-1", request(t, csrgen.Request{Subject: subject}),
		certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth)
	obj.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	obj.Spec.Username = username
	return obj
}

func TestCheckCSRDecidesEveryItemOfAList(t *testing.T) {
	good := csrgen.ServingObject("csr-good", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}}))
	forged := csrgen.ServingObject("csr-forged", "worker-1", request(t, csrgen.Request{IPs: []net.IP{net.ParseIP("10.5.0.3")}}))
	client := clientObject(t, "csr-client", "system:node:worker-1", csrgen.NodeSubject("worker-1"))

	for _, form := range []struct {
		name          string
		asJSON, asAPI bool
	}{{"kubectl yaml", false, false}, {"kubectl json", true, false}, {"API server list", true, true}} {
		t.Run(form.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", append([]string{"policy", "check-csr", "-o", "json", "-f", writeList(t, form.asJSON, form.asAPI, good, forged)}, identity...)...)
			require.Equal(t, cli.ExitOK, code, stderr)
			lines := checkLines(t, stdout)
			require.Len(t, lines, 2)
			assert.Equal(t, "csr-good", lines[0].CSR)
			assert.Equal(t, engine.ActionApprove, lines[0].Action)
			assert.Equal(t, "csr-forged", lines[1].CSR)
			assert.Equal(t, engine.ActionDeny, lines[1].Action)
			assert.Equal(t, []string{"IPNotNode"}, codes(lines[1].CSRDecision))
			assert.NotEqual(t, lines[0].DecisionID, lines[1].DecisionID)
		})
	}

	t.Run("an item of another signer is reported, the others decided, and the status is 1", func(t *testing.T) {
		code, stdout, stderr := run(t, "", append([]string{"policy", "check-csr", "-o", "json", "-f", writeList(t, false, false, client, good)}, identity...)...)
		assert.Equal(t, cli.ExitError, code)
		assert.Contains(t, stderr, "no decision for 1 of the 2 requests")
		lines := checkLines(t, stdout)
		require.Len(t, lines, 2)
		assert.Equal(t, "csr-client", lines[0].CSR)
		assert.Empty(t, lines[0].Action)
		assert.Contains(t, lines[0].Error, "the kubelet-serving rule governs signer kubernetes.io/kubelet-serving only")
		assert.Equal(t, engine.ActionApprove, lines[1].Action)
	})

	t.Run("an empty list", func(t *testing.T) {
		code, stdout, stderr := run(t, "apiVersion: v1\nkind: List\nitems: []\n", "policy", "check-csr", "-o", "json", "-f", "-", "--machine-unknown")
		assert.Equal(t, cli.ExitOK, code, stderr)
		assert.JSONEq(t, `{"apiVersion": "v1", "kind": "List", "items": []}`, stdout)
		assert.Contains(t, stderr, "the list holds no request")
	})
}

func TestCheckClientCSR(t *testing.T) {
	self := manifest(t, clientObject(t, "csr-self", "system:node:worker-1", csrgen.NodeSubject("worker-1")), false)
	bootstrap := manifest(t, clientObject(t, "csr-boot", "system:bootstrap:abcdef", csrgen.NodeSubject("worker-1")), false)
	masters := manifest(t, clientObject(t, "csr-masters", "system:node:worker-1",
		pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes", "system:masters"}}), true)

	for _, tc := range []struct {
		name     string
		file     string
		flags    []string
		action   string
		codes    []string
		kind     string
		assumed  map[string]bool
		inReason string
	}{
		{"nothing assumed: pending, and says so", self, nil, engine.ActionPending, []string{"NodeClientNotAuthorized", "SelfNodeClientNotAuthorized"}, "selfnodeclient",
			map[string]bool{"selfnodeclient": false, "nodeclient": false, "given": false}, "not asked: check-client-csr asks no SubjectAccessReview"},
		{"a node renewing, allowed selfnodeclient", self, []string{"--authorized", "selfnodeclient"}, engine.ActionApprove, []string{"IchorKubeletClient"}, "selfnodeclient",
			map[string]bool{"selfnodeclient": true, "nodeclient": false, "given": true}, "approved as selfnodeclient"},
		{"a bootstrap token, allowed nodeclient", bootstrap, []string{"--authorized", "nodeclient"}, engine.ActionApprove, []string{"IchorKubeletClient"}, "nodeclient",
			map[string]bool{"selfnodeclient": false, "nodeclient": true, "given": true}, "approved as nodeclient"},
		{"a bootstrap token, allowed only selfnodeclient", bootstrap, []string{"--authorized", "selfnodeclient"}, engine.ActionPending, []string{"NodeClientNotAuthorized"}, "nodeclient",
			map[string]bool{"selfnodeclient": true, "nodeclient": false, "given": true}, "assumed not allowed: --authorized does not name nodeclient"},
		{"none", self, []string{"--authorized", "none"}, engine.ActionPending, []string{"NodeClientNotAuthorized", "SelfNodeClientNotAuthorized"}, "selfnodeclient",
			map[string]bool{"selfnodeclient": false, "nodeclient": false, "given": true}, "assumed not allowed"},
		{"system:masters is never approved, whatever is assumed", masters, []string{"--authorized", "selfnodeclient,nodeclient"}, engine.ActionPending, nil, "",
			map[string]bool{"selfnodeclient": true, "nodeclient": true, "given": true}, "system:masters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", append([]string{"policy", "check-client-csr", "-o", "json", "-f", tc.file}, tc.flags...)...)
			require.Equal(t, cli.ExitOK, code, stderr)
			var c checkLine
			require.NoError(t, json.Unmarshal([]byte(stdout), &c), stdout)
			assert.Equal(t, tc.action, c.Action)
			if tc.codes != nil {
				assert.Equal(t, tc.codes, codes(c.CSRDecision))
			} else {
				assert.Contains(t, codes(c.CSRDecision), "PrivilegedSubject")
			}
			assert.Equal(t, tc.kind, c.RequestKind)
			assert.Equal(t, "CSRDecision", c.DocumentKind)
			assert.Equal(t, tc.assumed, c.AssumedAuthorization)
			assert.Contains(t, c.Reasons[0].Message, tc.inReason)
			assert.NotEmpty(t, c.DecisionID)
		})
	}

	t.Run("a list of both signers", func(t *testing.T) {
		serving := csrgen.ServingObject("csr-serving", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}}))
		client := clientObject(t, "csr-self", "system:node:worker-1", csrgen.NodeSubject("worker-1"))
		code, stdout, stderr := run(t, "", "policy", "check-client-csr", "-o", "json", "-f", writeList(t, false, false, serving, client), "--authorized", "selfnodeclient")
		assert.Equal(t, cli.ExitError, code)
		assert.Contains(t, stderr, "no decision for 1 of the 2 requests")
		lines := checkLines(t, stdout)
		require.Len(t, lines, 2)
		assert.Contains(t, lines[0].Error, "the kubelet-client rule governs signer kubernetes.io/kube-apiserver-client-kubelet only")
		assert.Equal(t, engine.ActionApprove, lines[1].Action)
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no file", []string{"--authorized", "none"}, "or -f FILE"},
		{"an unknown subresource", []string{"-f", self, "--authorized", "selfnode"}, `--authorized "selfnode": give selfnodeclient, nodeclient or none`},
		{"none with another", []string{"-f", self, "--authorized", "none,nodeclient"}, "--authorized none takes no other value"},
		{"empty", []string{"-f", self, "--authorized", ""}, "--authorized takes selfnodeclient, nodeclient or none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", append([]string{"policy", "check-client-csr", "-o", "json"}, tc.args...)...)
			assert.Equal(t, cli.ExitUsage, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

// TestCheckRefusesABarePEMAndShowsTheWrapping: the manifest the error shows,
// filled in as its comment says, is decided.
func TestCheckRefusesABarePEMAndShowsTheWrapping(t *testing.T) {
	for _, tc := range []struct {
		command, signer string
		pem             []byte
		flags           []string
	}{
		{"check-csr", certificatesv1.KubeletServingSignerName, request(t, csrgen.Request{DNSNames: []string{"worker-1"}}), identity},
		{"check-client-csr", certificatesv1.KubeAPIServerClientKubeletSignerName, request(t, csrgen.Request{}), []string{"--authorized", "selfnodeclient"}},
	} {
		t.Run(tc.command, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "worker-1.csr")
			require.NoError(t, os.WriteFile(path, tc.pem, 0o600))

			code, stdout, stderr := run(t, "", append([]string{"policy", tc.command, "-f", path}, tc.flags...)...)
			require.Equal(t, cli.ExitUsage, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, "is a bare PEM CERTIFICATE REQUEST")
			assert.Contains(t, stderr, "signerName: "+tc.signer)

			_, heredoc, ok := strings.Cut(stderr, "cat > csr.yaml <<EOF\n")
			require.True(t, ok, stderr)
			heredoc, _, ok = strings.Cut(heredoc, "\nEOF")
			require.True(t, ok, stderr)
			heredoc = strings.ReplaceAll(heredoc, "$(base64 -w0 < "+path+")", base64.StdEncoding.EncodeToString(tc.pem))
			heredoc = strings.ReplaceAll(heredoc, "NODE", "worker-1")
			wrapped := filepath.Join(t.TempDir(), "csr.yaml")
			require.NoError(t, os.WriteFile(wrapped, []byte(heredoc), 0o600))

			code, stdout, stderr = run(t, "", append([]string{"policy", tc.command, "-f", wrapped}, tc.flags...)...)
			require.Equal(t, cli.ExitOK, code, stderr)
			assert.Regexp(t, `(?m)^check\s+approve\s`, stdout, "the table, by default")
		})
	}

	t.Run("another PEM block", func(t *testing.T) {
		code, _, stderr := run(t, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "policy", "check-csr", "-o", "json", "-f", "-", "--machine-unknown")
		assert.Equal(t, cli.ExitUsage, code)
		assert.Contains(t, stderr, "- is a PEM CERTIFICATE, not a CertificateSigningRequest manifest")
	})
}
