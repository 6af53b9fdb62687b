package credclient

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
