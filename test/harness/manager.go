package harness

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
)

// ManagerNamespace is the namespace the manager runs in, as the Helm chart
// installs it: Start creates it with the empty Secret the chart creates for
// the admission key, which the manager fills. A manager run by a test finds
// it through POD_NAMESPACE, as in the chart.
const ManagerNamespace = "ichor-system"

func (e *Env) createManagerNamespace(ctx context.Context) error {
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: credential.DefaultKeySecretName}},
	} {
		if err := e.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("the manager's namespace: create %s: %w", obj.GetName(), err)
		}
	}
	return nil
}

// AdmissionKeys is the admission key the manager's webhook and issuer share,
// read and filled through c.
func (e *Env) AdmissionKeys(c client.Client) *credential.Keys {
	return &credential.Keys{Client: c, Namespace: ManagerNamespace, Name: credential.DefaultKeySecretName}
}
