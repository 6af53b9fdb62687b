package harness

import (
	"context"
	"fmt"
	"os"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
)

// ManagerNamespace is the namespace the manager runs in, as the Helm chart
// installs it: Start creates it with the empty Secret the chart creates for
// the admission key and the empty ConfigMaps of the highest bundle epoch and
// of the marks of the records of decisions by hand, which the manager fills. A manager run by a test finds
// it through POD_NAMESPACE, as in the chart.
const ManagerNamespace = "ichor-system"

func (e *Env) createManagerNamespace(ctx context.Context) error {
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: credential.DefaultKeySecretName}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: bundleepoch.ConfigMapName}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: manualact.MarksConfigMapName}},
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

// NewManager is a controller-runtime manager of the test's API server, as
// the user of cfg (env.Config for the admin), with the harness's scheme and
// neither metrics nor probe endpoints: tests run several side by side.
// webhook is the webhook server, or nil for none.
func (e *Env) NewManager(cfg *rest.Config, webhook crwebhook.Server) (ctrl.Manager, error) {
	opts := ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	}
	if webhook != nil {
		opts.WebhookServer = webhook
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("test manager: %w", err)
	}
	return mgr, nil
}

// RunManager runs mgr in the background until ctx ends and returns a channel
// closed when it has stopped. A manager that fails says so on standard
// error: TestMain, which starts it, has no test to fail.
func RunManager(ctx context.Context, mgr ctrl.Manager, name string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
	}()
	return done
}

// ServiceAccountClient is a client of the ServiceAccount namespace/name with
// a real token of ten minutes, so that its requests carry what the API
// server puts in a ServiceAccount's user info (uid, extra), and the reviews
// made of them are made with it.
func (e *Env) ServiceAccountClient(ctx context.Context, namespace, name string) (client.Client, error) {
	token, err := e.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: a token of %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = token.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		return nil, fmt.Errorf("harness: a client of %s/%s: %w", namespace, name, err)
	}
	return c, nil
}

// WaitAllowed waits, up to 30 s, until the authorizer allows user (in
// groups) attrs: RBAC objects just created take a moment to count.
func (e *Env) WaitAllowed(ctx context.Context, user string, groups []string, attrs authorizationv1.ResourceAttributes) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups, ResourceAttributes: &attrs,
		}}
		if err := e.Client.Create(ctx, sar); err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("%s is not allowed to %s %s/%s: %w", user, attrs.Verb, attrs.Resource, attrs.Subresource, err)
	}
	return nil
}
