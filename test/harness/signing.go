package harness

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// startSigner writes the bundle's Kubernetes CA and a system:masters
// kubeconfig, starts the CSR signer (kube-controller-manager's signing
// controller alone), and waits until it has signed a probe CSR: the one proof
// that it is up, watching CSRs and signing with the right CA.
func (e *Env) startSigner(ctx context.Context) error {
	dir := filepath.Join(e.WorkDir, signerBinary)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("CSR signer directory: %w", err)
	}

	user, err := e.testEnv.AddUser(envtest.User{Name: signerUser, Groups: []string{"system:masters"}}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return fmt.Errorf("CSR signer user: %w", err)
	}

	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("CSR signer kubeconfig: %w", err)
	}

	files := map[string][]byte{
		"kubeconfig": kubeconfig,
		"ca.crt":     e.SecretsBundle.Certs.K8s.Crt,
		"ca.key":     e.SecretsBundle.Certs.K8s.Key,
	}
	for name, data := range files {
		if err = os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write the CSR signer's %s: %w", name, err)
		}
	}

	args := signerArgs(filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))

	if e.signer, err = startSigner(filepath.Join(e.AssetsDir, signerBinary), e.SignerLogPath, args); err != nil {
		return err
	}

	return e.probeSigning(ctx)
}

// probeSigning has a kube-apiserver-client CSR approved (by the admin, as a
// test would) and waits for the CSR signer to sign it with the
// bundle's Kubernetes CA. The probe CSR is deleted afterwards so a test never
// sees it.
func (e *Env) probeSigning(ctx context.Context) (err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("probe key: %w", err)
	}

	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "ichor-harness:signing-probe"},
	}, key)
	if err != nil {
		return fmt.Errorf("probe request: %w", err)
	}

	csrs := e.Clientset.CertificatesV1().CertificateSigningRequests()

	csr, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "ichor-harness-signing-probe-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        certificatesv1.KubeAPIServerClientSignerName,
			Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			ExpirationSeconds: ptr.To[int32](600),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create probe CSR: %w", err)
	}

	defer func() {
		// The start may have timed out; the delete still deserves a chance.
		delCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()

		if delErr := csrs.Delete(delCtx, csr.Name, metav1.DeleteOptions{}); delErr != nil {
			err = errors.Join(err, fmt.Errorf("delete probe CSR: %w", delErr))
		}
	}()

	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type:    certificatesv1.CertificateApproved,
		Status:  corev1.ConditionTrue,
		Reason:  "IchorHarnessProbe",
		Message: "the harness checks that the CSR signer signs",
	})

	if _, err = csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("approve probe CSR: %w", err)
	}

	var signed []byte

	err = wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if done, exitErr := e.signer.exited(); done {
			return false, fmt.Errorf("the CSR signer exited: %v", exitErr) //nolint:errorlint // the exit status, nil on a clean exit, is for the reader
		}

		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}

		for _, c := range got.Status.Conditions {
			if c.Type == certificatesv1.CertificateFailed && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("the CSR signer failed the probe CSR: %s: %s", c.Reason, c.Message)
			}
		}

		signed = got.Status.Certificate

		return len(signed) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the CSR signer to sign: %w", err)
	}

	return verifySignedBy(signed, e.SecretsBundle.Certs.K8s.Crt)
}

// verifySignedBy checks that the first certificate of certPEM chains to the CA
// in caPEM.
func verifySignedBy(certPEM, caPEM []byte) error {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return errors.New("signed certificate is not PEM")
	}

	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("parse signed certificate: %w", err)
	}

	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return errors.New("the Kubernetes CA is not PEM")
	}

	if _, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("the CSR signer signed with another CA: %w", err)
	}

	return nil
}
