package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"go.yaml.in/yaml/v4"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// secretsFileName is the name `talosctl gen secrets` writes by default.
const secretsFileName = "secrets.yaml"

// newSecretsBundle makes the cluster's secrets the way `talosctl gen secrets`
// does (secrets.NewBundle at the current version contract, marshaled with the
// same YAML package), writes them to dir, and parses the file back with
// secrets.LoadBundle, so the parsed bundle is what any consumer of the file
// would get.
//
// Two deliberate differences, neither visible in the format:
//   - the service-account key is ECDSA (secrets.WithECDSAServiceAccountKey,
//     offered by machinery for tests): an RSA key costs seconds on two cores
//     and the harness's apiserver has its own service-account key anyway;
//   - the OS CA is one talosapi.NewCA made (Ed25519, O=talos, ten years, as
//     secrets.NewTalosCA), because talosapi.CA can only be built by NewCA (its
//     signer is unexported) and the node servers must use the bundle's OS CA.
//     A talosapi constructor from PEM would let the generator's own OS CA stay.
func newSecretsBundle(dir string) (*secrets.Bundle, []byte, *talosapi.CA, error) {
	bundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), config.TalosVersionCurrent, secrets.WithECDSAServiceAccountKey())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generate Talos secrets bundle: %w", err)
	}

	osCA, err := talosapi.NewCA()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generate Talos OS CA: %w", err)
	}

	bundle.Certs.OS = osCA.PEMEncoded()

	data, err := yaml.Marshal(bundle)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("marshal Talos secrets bundle: %w", err)
	}

	path := filepath.Join(dir, secretsFileName)
	if err = os.WriteFile(path, data, 0o600); err != nil {
		return nil, nil, nil, fmt.Errorf("write Talos secrets bundle: %w", err)
	}

	parsed, err := secrets.LoadBundle(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load the Talos secrets bundle just written: %w", err)
	}

	return parsed, data, osCA, nil
}

// SecretsBundleSecretWithOSCA is SecretsBundleSecret for another cluster: the
// environment's bundle with ca as its OS CA (certs.os), so that only the nodes
// started with NodeOptions.CA = ca answer the readers made from it. Every
// TalosCluster of its namespace may use it, as SecretsBundleSecret.
func (e *Env) SecretsBundleSecretWithOSCA(namespace, name string, ca *talosapi.CA) (*corev1.Secret, error) {
	bundle := *e.SecretsBundle
	certs := *bundle.Certs
	certs.OS = ca.PEMEncoded()
	bundle.Certs = &certs

	data, err := yaml.Marshal(&bundle)
	if err != nil {
		return nil, fmt.Errorf("marshal Talos secrets bundle: %w", err)
	}

	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: everyCluster()},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: data},
	}, nil
}
