package harness

import (
	"context"
	"fmt"
	"net/http"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// crdCreateGrace is how long after a CRD is Established the apiserver delays
// every create of its resources (by this much, so the first create of a test
// would take two seconds): apiextensions-apiserver's crdHandler does this for
// HA apiservers that have not yet seen the CRD.
const crdCreateGrace = 2 * time.Second

// warmCRDs makes the installed resources answer at once: it lists each served
// version until the apiserver stops answering 429 "storage is
// (re)initializing" (the first request to a new resource gets that, which
// client-go retries a second later), then waits out crdCreateGrace counted
// from the Established time the apiserver itself compares with.
func (e *Env) warmCRDs(ctx context.Context) error {
	crdClient, err := apiextensionsclient.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}

	crds := crdClient.ApiextensionsV1().CustomResourceDefinitions()

	var establishedAt time.Time

	for _, installed := range e.testEnv.CRDs {
		crd, err := crds.Get(ctx, installed.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get CRD %s: %w", installed.Name, err)
		}

		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue && c.LastTransitionTime.After(establishedAt) {
				establishedAt = c.LastTransitionTime.Time
			}
		}

		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}

			path := fmt.Sprintf("/apis/%s/%s/%s", crd.Spec.Group, v.Name, crd.Spec.Names.Plural)

			err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
				var code int

				err := e.Clientset.Discovery().RESTClient().Get().AbsPath(path).Param("limit", "1").MaxRetries(0).Do(ctx).StatusCode(&code).Error()

				switch {
				case code == http.StatusTooManyRequests:
					return false, nil
				case err != nil:
					return false, err
				default:
					return true, nil
				}
			})
			if err != nil {
				return fmt.Errorf("wait for %s to be served: %w", path, err)
			}
		}
	}

	// metav1.Time has second precision, so the apiserver's own comparison
	// starts from this truncated time too.
	if wait := time.Until(establishedAt.Add(crdCreateGrace)); wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()

		select {
		case <-timer.C:
		case <-ctx.Done():
			return fmt.Errorf("wait for the CRDs' create grace period: %w", ctx.Err())
		}
	}

	return nil
}
