package chart

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestWebhookClientAuthValue: with webhook.clientAuth the chart hands the
// manager the API server's webhook client CA (a ConfigMap, mounted where the
// flag says) and the names, and rolls the pods when the CA changes; half of
// it, or a CA that is not PEM certificates, is refused at render. Without it
// nothing of it is rendered. The manager's answer to such a certificate is
// TestTheManagerWorksWithTheChartsRightsAndPolicy's.
func TestWebhookClientAuthValue(t *testing.T) {
	plain := render(t)
	assert.NotContains(t, strings.Join(args(plain.deployment(t)), " "), "--webhook-client")
	assert.Empty(t, plain.all("ConfigMap", release+"-webhook-client-ca"))

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, selfSignedCAPEM(t), 0o600))
	withCA := []string{"--set-file", "webhook.clientAuth.caBundle=" + caFile}
	objs := renderWith(t, withCA, "webhook.clientAuth.names={kube-apiserver-webhook-client,apiserver-2}")
	dep := objs.deployment(t)
	caPath := argValue(t, dep, "--webhook-client-ca")
	assert.Equal(t, "kube-apiserver-webhook-client,apiserver-2", argValue(t, dep, "--webhook-client-names"))

	var cm corev1.ConfigMap
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(objs.get(t, "ConfigMap", release+"-webhook-client-ca").Object, &cm))
	assert.Equal(t, readFile(t, caFile), cm.BinaryData[filepath.Base(caPath)])
	assert.Equal(t, cm.Name, mountedConfigMap(t, dep, filepath.Dir(caPath)), "the flag's file is the ConfigMap's key, mounted")
	sum := dep.Spec.Template.Annotations["checksum/webhook-client-ca"]
	assert.Len(t, sum, 64)
	// The CA the ConfigMap holds is pinned in the Deployment, where the
	// ConfigMap's writers cannot change it (review 166).
	digest := sha256.Sum256(cm.BinaryData[filepath.Base(caPath)])
	assert.Equal(t, hex.EncodeToString(digest[:]), argValue(t, dep, "--webhook-client-ca-sha256"))
	// So is a CA file whose comments hold a byte that is not UTF-8: the
	// mounted file is its bytes exactly (review 173).
	latin := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(latin, slices.Concat([]byte("# caf\xe9\n"), selfSignedCAPEM(t)), 0o600))
	objs = renderWith(t, []string{"--set-file", "webhook.clientAuth.caBundle=" + latin}, "webhook.clientAuth.names={apiserver}")
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(objs.get(t, "ConfigMap", release+"-webhook-client-ca").Object, &cm))
	assert.Equal(t, readFile(t, latin), cm.BinaryData[filepath.Base(caPath)])
	digest = sha256.Sum256(readFile(t, latin))
	assert.Equal(t, hex.EncodeToString(digest[:]), argValue(t, objs.deployment(t), "--webhook-client-ca-sha256"))

	require.NoError(t, os.WriteFile(caFile, selfSignedCAPEM(t), 0o600))
	again := renderWith(t, withCA, "webhook.clientAuth.names={kube-apiserver-webhook-client}").deployment(t)
	assert.NotEqual(t, sum, again.Spec.Template.Annotations["checksum/webhook-client-ca"], "a new CA rolls the pods")

	// A bundle of two CAs with the text bundles carry between them renders.
	commented := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(commented, slices.Concat([]byte("# old\n"), selfSignedCAPEM(t), []byte("subject=CN=new\n"), selfSignedCAPEM(t)), 0o600))
	_ = renderWith(t, []string{"--set-file", "webhook.clientAuth.caBundle=" + commented}, "webhook.clientAuth.names={apiserver}").deployment(t)

	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	withKey := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(withKey, slices.Concat(selfSignedCAPEM(t), []byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n")), 0o600))
	for name, c := range map[string]struct {
		flags []string
		set   []string
		want  string
	}{
		"a CA without names":        {withCA, nil, "webhook.clientAuth.names is empty"},
		"names without a CA":        {nil, []string{"webhook.clientAuth.names={apiserver}"}, "webhook.clientAuth.caBundle is empty"},
		"a CA that is not PEM":      {[]string{"--set-file", "webhook.clientAuth.caBundle=" + notPEM}, []string{"webhook.clientAuth.names={apiserver}"}, "/webhook/clientAuth/caBundle': 'hello' does not match"},
		"a CA with a key beside it": {[]string{"--set-file", "webhook.clientAuth.caBundle=" + withKey}, []string{"webhook.clientAuth.names={apiserver}"}, "/webhook/clientAuth/caBundle'"},
		"a name with a comma":       {withCA, []string{`webhook.clientAuth.names={a\,b}`}, "/webhook/clientAuth/names/0': 'a,b' does not match"},
		"an empty name":             {withCA, []string{`webhook.clientAuth.names[0]=`}, "/webhook/clientAuth/names/0': minLength"},
		"a name with a space":       {withCA, []string{`webhook.clientAuth.names[0]= apiserver`}, "/webhook/clientAuth/names/0': ' apiserver' does not match"},
		"a name with a quote":       {withCA, []string{`webhook.clientAuth.names[0]=api"server`}, `/webhook/clientAuth/names/0': 'api"server' does not match`},
	} {
		t.Run(name, func(t *testing.T) {
			helmArgs := append([]string{"template", release, chartDir(t), "--namespace", namespace}, c.flags...)
			for _, s := range c.set {
				helmArgs = append(helmArgs, "--set", s)
			}
			out, err := helmOutput(t, helmArgs...)
			require.Error(t, err, "rendered")
			assert.Contains(t, string(out), c.want)
		})
	}
}

// mountedConfigMap is the ConfigMap the manager's container mounts at dir.
func mountedConfigMap(t *testing.T, dep *appsv1.Deployment, dir string) string {
	t.Helper()
	for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		assert.True(t, m.ReadOnly)
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name
			}
		}
	}
	t.Fatalf("nothing mounted at %s", dir)
	return ""
}

// selfSignedCAPEM is a new CA certificate, as PEM.
func selfSignedCAPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "apiserver-webhook-client-ca"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
