package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// userCertValidity bounds the harness's own CA and the user certificates it
// signs: longer than any test or demo session, short enough not to matter if
// one leaks from a temp directory.
const userCertValidity = 7 * 24 * time.Hour

// clientCertAuthn is envtest's client-certificate authenticator (CertAuthn)
// with one difference: the --client-ca-file it writes holds the bundle's
// Kubernetes CA beside the harness's own. envtest's CertAuthn sets
// client-ca-file to a file holding only its private CA, during Start, after any
// argument a caller configured; replacing the authenticator is the one hook that
// runs at that point. Harness users (admin, UserConfig) keep certificates from
// the harness CA, so a certificate from the bundle's CA is always one Ichor or
// the CSR signer signed.
type clientCertAuthn struct {
	caCert   *x509.Certificate
	caKey    crypto.Signer
	caPEM    []byte
	extraPEM []byte // the bundle's Kubernetes CA certificate
	dir      string
}

var _ envtest.Authn = (*clientCertAuthn)(nil)

func newClientCertAuthn(extraCAPEM []byte) (*clientCertAuthn, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate harness client CA key: %w", err)
	}

	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}

	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ichor-harness-client-ca"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(userCertValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}

	der, err := x509.CreateCertificate(rand.Reader, template, template, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("sign harness client CA: %w", err)
	}

	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse harness client CA: %w", err)
	}

	return &clientCertAuthn{
		caCert:   cert,
		caKey:    key,
		caPEM:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		extraPEM: slices.Clone(extraCAPEM),
	}, nil
}

func (a *clientCertAuthn) caFile() string {
	return filepath.Join(a.dir, "client-ca.crt")
}

// Configure is called by envtest with the apiserver's certificate directory.
func (a *clientCertAuthn) Configure(workDir string, args *envtest.Arguments) error {
	a.dir = workDir
	args.Set("client-ca-file", a.caFile())

	return nil
}

// Start writes the CA bundle just before the apiserver starts (and again on a
// retried start, which is harmless).
func (a *clientCertAuthn) Start() error {
	if a.dir == "" {
		return fmt.Errorf("client certificate authenticator started before it was configured")
	}

	data := slices.Concat(a.caPEM, a.extraPEM)
	if err := os.WriteFile(a.caFile(), data, 0o600); err != nil {
		return fmt.Errorf("write client CA file: %w", err)
	}

	return nil
}

// AddUser signs a client certificate for the user the way the apiserver reads
// one: CN is the user name, each O a group.
func (a *clientCertAuthn) AddUser(user envtest.User, baseCfg *rest.Config) (*rest.Config, error) {
	certPEM, keyPEM, err := a.signClient(user.Name, user.Groups)
	if err != nil {
		return nil, fmt.Errorf("client certificate for %q: %w", user.Name, err)
	}

	cfg := rest.CopyConfig(baseCfg)
	cfg.CertData = certPEM
	cfg.KeyData = keyPEM

	return cfg, nil
}

// Stop has nothing to release: the CA file lives in envtest's directory.
func (a *clientCertAuthn) Stop() error {
	return nil
}

func (a *clientCertAuthn) signClient(name string, groups []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}

	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}

	now := time.Now()
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: slices.Clone(groups)},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(userCertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}

	der, err := x509.CreateCertificate(rand.Reader, template, a.caCert, key.Public(), a.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign: %w", err)
	}

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}

	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// webhookAdmissionConfig writes, into dir, an AdmissionConfiguration whose
// webhook plugins give the API server a client certificate with common name
// cn, signed by the harness's CA, for every webhook it calls ("*": the
// tests' webhooks are URLs on loopback whose port is known only later), and
// returns its path: what an operator sets with --admission-control-config-file.
func (a *clientCertAuthn) webhookAdmissionConfig(dir, cn string) (string, error) {
	certPEM, keyPEM, err := a.signClient(cn, nil)
	if err != nil {
		return "", fmt.Errorf("webhook client certificate: %w", err)
	}
	kubeconfig := filepath.Join(dir, "admission-webhook-kubeconfig.yaml")
	if err := clientcmd.WriteToFile(clientcmdapi.Config{
		AuthInfos: map[string]*clientcmdapi.AuthInfo{"*": {ClientCertificateData: certPEM, ClientKeyData: keyPEM}},
	}, kubeconfig); err != nil {
		return "", fmt.Errorf("webhook client kubeconfig: %w", err)
	}
	var config strings.Builder
	config.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n")
	for _, plugin := range []string{"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"} {
		fmt.Fprintf(&config, "- name: %s\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: %q\n", plugin, kubeconfig)
	}
	path := filepath.Join(dir, "admission-configuration.yaml")
	if err := os.WriteFile(path, []byte(config.String()), 0o600); err != nil {
		return "", fmt.Errorf("admission configuration: %w", err)
	}
	return path, nil
}

// randomSerial is a 128-bit random serial, as RFC 5280 asks of a CA.
func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}

	return serial, nil
}
