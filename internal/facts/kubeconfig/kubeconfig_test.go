package kubeconfig_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
)

var (
	caData   = base64.StdEncoding.EncodeToString([]byte("ca"))
	certData = base64.StdEncoding.EncodeToString([]byte("cert"))
	keyData  = base64.StdEncoding.EncodeToString([]byte("key"))
)

func good() string {
	return `apiVersion: v1
kind: Config
preferences: {}
clusters:
- name: workload
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: ` + caData + `
contexts:
- name: admin@workload
  context: {cluster: workload, user: admin}
current-context: admin@workload
users:
- name: admin
  user:
    client-certificate-data: ` + certData + `
    client-key-data: ` + keyData + `
`
}

func paths(f kubeconfig.Facts) []string {
	out := make([]string, 0, len(f.Fields))
	for _, x := range f.Fields {
		out = append(out, x.Path)
	}
	return out
}

func TestReadGivesFactsNotData(t *testing.T) {
	d := kubeconfig.Read([]byte(good()))
	f := d.Facts
	require.True(t, f.Parsed, f.Error)
	assert.Empty(t, f.UnknownFields)
	assert.Equal(t, 1, f.Contexts)
	require.NotNil(t, f.Context)
	assert.Equal(t, "https", f.Context.Server.Scheme)
	assert.Equal(t, "10.0.0.1:6443", f.Context.Server.Host)
	assert.True(t, f.Context.CAData)
	assert.Equal(t, kubeconfig.Credentials{ClientCertificateData: true, ClientKeyData: true}, f.Context.Credentials)
	assert.Contains(t, paths(f), "users[0].user.client-key-data")
	assert.Contains(t, f.Fields, kubeconfig.Field{Path: "clusters[0].cluster.server", Field: "clusters[].cluster.server"})
	// The facts never hold the credential data.
	b, err := json.Marshal(f)
	require.NoError(t, err)
	assert.NotContains(t, string(b), keyData)
	assert.NotContains(t, string(b), "key\"")

	cfg, err := d.RESTConfig(false)
	require.NoError(t, err)
	assert.Equal(t, "https://10.0.0.1:6443", cfg.Host)
	assert.Equal(t, []byte("key"), cfg.KeyData)
	assert.Equal(t, []byte("ca"), cfg.CAData)
}

// Every field of every entry is listed by its path, whether or not the
// context in use reaches it.
func TestEveryFieldIsListed(t *testing.T) {
	doc := good() + `- name: other
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    exec: {command: touch, args: [/tmp/x], apiVersion: client.authentication.k8s.io/v1}
    as: admin
    as-user-extra: {a: [b]}
`
	f := kubeconfig.Read([]byte(doc)).Facts
	require.True(t, f.Parsed, f.Error)
	p := paths(f)
	for _, want := range []string{"users[1].user.tokenFile", "users[1].user.exec", "users[1].user.exec.command", "users[1].user.as", "users[1].user.as-user-extra"} {
		assert.Contains(t, p, want)
	}
	assert.NotContains(t, p, "users[1].user.as-user-extra.a", "a map's keys are not fields")
	assert.Empty(t, f.UnknownFields)
}

// A key the schema does not have, or has in another case (which clientcmd's
// decoder would accept), is unknown; its contents are not walked.
func TestUnknownFieldsAreFound(t *testing.T) {
	doc := strings.Replace(good(), "    client-key-data:", "    TokenFile: /etc/x\n    secret:\n      nested: 1\n    \"\\e]0;title\\a\": 1\n    client-key-data:", 1)
	f := kubeconfig.Read([]byte(doc)).Facts
	require.True(t, f.Parsed, f.Error)
	assert.ElementsMatch(t, []string{"users[0].user.TokenFile", "users[0].user.secret", `users[0].user["\x1b]0;title\a"]`}, f.UnknownFields)
	assert.NotContains(t, paths(f), "users[0].user.secret.nested")
	for _, u := range f.UnknownFields {
		assert.NotContains(t, u, "\x1b", "a tenant's key is escaped")
	}
}

func TestWhatCannotBeReadIsAFact(t *testing.T) {
	for name, doc := range map[string]string{
		"duplicate key": "clusters: []\nclusters: []\n",
		"not a mapping": "- a\n",
		"wrong type":    "clusters: 3\n",
		"not yaml":      "a: [\n",
	} {
		t.Run(name, func(t *testing.T) {
			f := kubeconfig.Read([]byte(doc)).Facts
			assert.False(t, f.Parsed)
			assert.NotEmpty(t, f.Error)
		})
	}
	f := kubeconfig.Read(make([]byte, kubeconfig.MaxBytes+1)).Facts
	assert.False(t, f.Parsed)
	assert.Equal(t, kubeconfig.MaxBytes+1, f.Bytes)
}

// Why a document cannot be read is said without quoting it: the parsers'
// words quote a value (a token left under a null key by a template, a
// tagged value, a password in the server URL), and the error is the
// condition's message, a Warning Event's and the decision log's, each
// read by more people than the Secret (review 236 F1). Each shape still
// says what is wrong, and where.
func TestWhatCannotBeReadIsSaidWithoutQuotingIt(t *testing.T) {
	for doc, want := range map[string]string{
		"users:\n- name: a\n  user:\n    ~: {token: s3cr3t}\n":          "a mapping key is not a string",
		"users:\n- name: a\n  user:\n    ? [s3cr3t]\n    : x\n":         "a mapping key is not a string",
		"users:\n- name: a\n  user:\n    token: !!int s3cr3t\n":         "a value is not of the type its tag names",
		"users:\n- name: a\n  user:\n    token: s3cr3t\n    token: x\n": "a key is given twice at line 5",
		"a: &s3cr3t x\nb: *s3cr3tt\n":                                   "not YAML or JSON that can be read",
		"a: [\n":                                                        "yaml: line 1: did not find expected node content",
		"{\"a\": s3cr3t\n":                                              "yaml: line 1: did not find expected ',' or '}'",
		"users:\n- name: a\n  user:\n    token: [s3cr3t]\n":             "json: cannot unmarshal array into Go struct field AuthInfo.users.user.token of type string",
		"users:\n- name: a\n  user:\n    client-key-data: 's3cr3t!!'\n": "illegal base64 data at input byte 6",
	} {
		f := kubeconfig.Read([]byte(doc)).Facts
		assert.False(t, f.Parsed, doc)
		assert.NotContains(t, f.Error, "s3cr3t", doc)
		assert.Contains(t, f.Error, want, doc)
	}
	for server, want := range map[string]string{
		"https://admin:s3cr3t/x@10.0.0.1:6443": "invalid port after host",
		"https://10.0.0.1:6443/%s3cr3t":        "invalid URL escape",
		"https://10.0.0.1 s3cr3t:6443":         "invalid character in host name",
	} {
		doc := strings.Replace(good(), "https://10.0.0.1:6443", server, 1)
		f := kubeconfig.Read([]byte(doc)).Facts
		require.True(t, f.Parsed, f.Error)
		require.NotNil(t, f.Context)
		assert.Equal(t, want, f.Context.Server.Error, server)
	}
}

func TestTheContextInUse(t *testing.T) {
	two := strings.Replace(good(), "current-context: admin@workload\n", "", 1) +
		"" // one context, no current-context: that one
	f := kubeconfig.Read([]byte(two)).Facts
	require.NotNil(t, f.Context)
	assert.Equal(t, "admin@workload", f.Context.Name)

	ambiguous := strings.Replace(two, "contexts:\n", "contexts:\n- name: b\n  context: {cluster: workload, user: admin}\n", 1)
	f = kubeconfig.Read([]byte(ambiguous)).Facts
	assert.Nil(t, f.Context)
	assert.Equal(t, 2, f.Contexts)

	missing := strings.Replace(good(), "user: admin}", "user: nobody}", 1)
	f = kubeconfig.Read([]byte(missing)).Facts
	require.NotNil(t, f.Context)
	assert.True(t, f.Context.ClusterFound)
	assert.False(t, f.Context.UserFound)
	_, err := kubeconfig.Read([]byte(missing)).RESTConfig(false)
	assert.Error(t, err)
}

// A password in the server URL is a credential: it never reaches the facts.
func TestServerUserInfoIsNotKept(t *testing.T) {
	doc := strings.Replace(good(), "https://10.0.0.1:6443", "https://u:hunter2@10.0.0.1:6443", 1)
	f := kubeconfig.Read([]byte(doc)).Facts
	require.NotNil(t, f.Context)
	assert.True(t, f.Context.Server.UserInfo)
	assert.NotContains(t, f.Context.Server.URL, "hunter2")
}

func TestTooManyFieldsAreCounted(t *testing.T) {
	var b strings.Builder
	b.WriteString("users:\n")
	for range kubeconfig.MaxFields {
		b.WriteString("- name: x\n")
	}
	f := kubeconfig.Read([]byte(b.String())).Facts
	require.True(t, f.Parsed, f.Error)
	assert.Len(t, f.Fields, kubeconfig.MaxFields)
	assert.Equal(t, kubeconfig.MaxFields+1, f.FieldCount)
}

// Unknown fields are listed no further than the fields are (review 28 L3),
// and those listed among the fields are among them.
func TestUnknownFieldsAreHeldToTheFieldsBound(t *testing.T) {
	var b strings.Builder
	for i := range 2 * kubeconfig.MaxFields {
		fmt.Fprintf(&b, "k%05d: 0\n", i)
	}
	f := kubeconfig.Read([]byte(b.String())).Facts
	require.True(t, f.Parsed, f.Error)
	assert.Len(t, f.UnknownFields, kubeconfig.MaxFields)
	assert.Equal(t, 2*kubeconfig.MaxFields, f.FieldCount)
	assert.Equal(t, paths(f), f.UnknownFields)
}

// Insecure takes effect only when the rule allowed it, and then without a CA
// (client-go refuses both).
func TestRESTConfigInsecure(t *testing.T) {
	doc := strings.Replace(good(), "    server:", "    insecure-skip-tls-verify: true\n    server:", 1)
	d := kubeconfig.Read([]byte(doc))
	cfg, err := d.RESTConfig(false)
	require.NoError(t, err)
	assert.False(t, cfg.Insecure)
	cfg, err = d.RESTConfig(true)
	require.NoError(t, err)
	assert.True(t, cfg.Insecure)
	assert.Nil(t, cfg.CAData)
}
