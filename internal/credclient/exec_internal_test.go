package credclient

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ichor-dev/ichor-policy/internal/execcache"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// The exec plugin's cache is keyed by who the management kubeconfig
// authenticates as: a certificate or token file rewritten for another person,
// or an exec plugin run with another environment, is another identity, whose
// cached admin certificate must not be reused (hostile review F8).
func TestIdentityDigestFollowsFileContentsAndExecEnvironment(t *testing.T) {
	dir := t.TempDir()
	cert, token := filepath.Join(dir, "client.crt"), filepath.Join(dir, "token")
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(cert, "ada's certificate")
	write(token, "ada's token")
	files := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CertFile: cert}, BearerTokenFile: token}
	exec := func(profile string) *rest.Config {
		return &rest.Config{ExecProvider: &clientcmdapi.ExecConfig{Command: "aws", Args: []string{"eks", "get-token"}, Env: []clientcmdapi.ExecEnvVar{{Name: "AWS_PROFILE", Value: profile}}}}
	}

	before := identityDigest(files)
	if identityDigest(files) != before {
		t.Fatal("the same files give another digest")
	}
	write(cert, "bob's certificate")
	if identityDigest(files) == before {
		t.Fatal("a certificate file rewritten for another person gives the same digest")
	}
	afterCert := identityDigest(files)
	write(token, "bob's token")
	if identityDigest(files) == afterCert {
		t.Fatal("a token file rewritten gives the same digest")
	}
	if identityDigest(exec("ada")) == identityDigest(exec("bob")) {
		t.Fatal("an exec plugin run with another environment gives the same digest")
	}
	if ada := identityDigest(exec("ada")); ada != identityDigest(exec("ada")) {
		t.Fatal("the same exec plugin gives another digest")
	}
}

// An admin kubeconfig verifies the server as yours does: your CA and the
// cluster's from the trust bundle; the system's roots where yours names
// no CA (review 186: the bundle alone replaced them).
func TestAnAdminKubeconfigKeepsTheSystemRootsYoursUses(t *testing.T) {
	ca, bundle := []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n")
	if got := kubeconfigCA(nil, bundle); got != nil {
		t.Errorf("no CA in your kubeconfig: %q written", got)
	}
	if got := string(kubeconfigCA(ca, bundle)); got != string(ca)+string(bundle) {
		t.Errorf("your CA and the bundle: %q written", got)
	}
}

// What a newer kubectl may send, a field this build does not know, is read;
// another version, kind or a value of the wrong type is refused.
func TestExecInfoOfANewerKubectlIsRead(t *testing.T) {
	for info, ok := range map[string]bool{
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false}}`:              true,
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false,"future":{}}}`:  true,
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false},"later":true}`: true,
		`{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}`:         false,
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"Other"}`:                                                    false,
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":"x"}}`:                false,
	} {
		if err := CheckExecInfo(info); (err == nil) != ok {
			t.Errorf("%s: %v", info, err)
		}
	}
}

// A refusal is held as the live error prints: the server's message, which a
// webhook writes (newlines and all), stays on its line when the held
// refusal is printed, as it does live; it could otherwise add lines that
// read as ichor's own above kubectl's error (review 259 F1). Only a refusal
// by the rules is held.
func TestAHeldRefusalPrintsAsTheLiveOneDoes(t *testing.T) {
	cache, err := execcache.Open(filepath.Join(t.TempDir(), "cache"))
	require.NoError(t, err)
	key := execcache.Key{Server: "https://mgmt.example:6443", Namespace: "team-a", Cluster: "demo", Purpose: "kubeconfig-admin"}
	denial := apierrors.NewForbidden(schema.GroupResource{Group: "ichor.dev", Resource: "taloscredentialrequests"}, "",
		errors.New("admission webhook \"vtaloscredentialrequest.ichor.dev\" denied the request: NotAuthorized\nichor: credential issued, run kubectl"))
	live := fmt.Errorf("no admin credential for cluster demo: %w", refused(fmt.Errorf("the request was refused: %w", denial)))

	var warn bytes.Buffer
	holdRefusal(cache, key, fmt.Errorf("no admin credential for cluster demo: %w", denial), &warn)
	require.NoError(t, heldRefusal(cache, key, &warn), "a denial not marked a refusal was held")
	holdRefusal(cache, key, live, &warn)
	assert.Empty(t, warn.String())
	held := heldRefusal(cache, key, &warn)
	require.Error(t, held)
	assert.ErrorAs(t, held, new(RefusedError))

	print := func(err error) string {
		var out bytes.Buffer
		w := termsafe.NewWriter(&out)
		fmt.Fprintf(w, "ichor: %s\n", termsafe.ErrorText(err))
		return out.String()
	}
	assert.NotContains(t, print(live), "\nichor: credential issued")
	assert.NotContains(t, print(held), "\nichor: credential issued", "the held refusal printed the server's newline")
	assert.Contains(t, print(held), `NotAuthorized\nichor: credential issued`)
	assert.Contains(t, print(held), "\n(refused at ", "the note on its own line, as ichor writes it")
}
