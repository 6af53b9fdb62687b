// Package webhookcerts gives the admission webhook a serving certificate
// when cert-manager does not: the manager makes a self-signed CA and a
// serving certificate for the webhook Service's DNS names, keeps both in a
// Secret so that every replica serves a certificate of the same CA, writes
// the serving pair into the webhook server's cert dir (controller-runtime's
// certwatcher reloads it), sets the CA bundle of the
// ValidatingWebhookConfiguration, and renews before expiry: the serving
// certificate (90 days) two thirds into its life, the CA (one year) likewise,
// keeping the previous CA in the bundle until it expires so that a replica
// that has not yet picked up the new certificate stays trusted.
//
// Every replica runs it (the webhook is served by all of them, so it needs no
// leader). Replicas that race to fill or renew the Secret are ordered by the
// API server's optimistic concurrency: one update wins, the others get a
// conflict, read the winner's certificates and use them.
//
// Nothing here decides a security outcome: it only keeps the webhook
// reachable over TLS the API server verifies.
//
// Why not open-policy-agent/cert-controller (pkg/rotator, what Gatekeeper
// uses; v0.16.0 builds against this module's controller-runtime): it reads
// the Secret and the webhook configurations through an informer cache it
// builds itself, so the manager would need list and watch on every Secret of
// its namespace (the admission key and Helm's release Secrets among them) and
// on every ValidatingWebhookConfiguration of the cluster. RBAC limits list
// and watch to a name only for requests that ask by name, which that cache
// does not, and the rotator offers no way to change it
// (open-policy-agent/cert-controller#24). Here the rights are get and update
// on one Secret and get and patch on one configuration. It also puts only the
// current CA in the bundle (cert-controller#13), so after a CA rotation the
// replicas still serving a certificate of the old CA are refused until the
// kubelet refreshes their mounted Secret; with a one-year CA that is every
// eight months, and the webhook fails closed. And it writes no files: the
// Secret must be mounted and the webhooks registered only once it reports
// ready. What it does better: its watches restore a CA bundle reset by hand
// at once (here within CheckInterval), and it serves mutating and conversion
// webhooks and APIServices, none of which Ichor has. Reconsider it if one
// of those needs a CA bundle.
package webhookcerts

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/internal/privatefile"
)

// The names the chart gives the objects this package writes. They are fixed,
// not derived from the Helm release, because the RBAC markers below name them
// and the manager's roles are generated from the markers.
const (
	DefaultSecretName               = "ichor-policy-webhook-cert" //nolint:gosec // G101: a Secret's name, not a secret
	DefaultServiceName              = "ichor-policy-webhook"
	DefaultWebhookConfigurationName = "ichor-policy-webhook"
	DefaultClusterDomain            = "cluster.local"
)

// Lifetimes and intervals by default.
const (
	DefaultCAValidity      = 365 * 24 * time.Hour
	DefaultServingValidity = 90 * 24 * time.Hour
	// DefaultCheckInterval is how often the Secret and the CA bundle are
	// looked at again between renewals: to adopt another replica's renewal
	// and to restore a CA bundle that an upgrade or a person reset.
	DefaultCheckInterval = 5 * time.Minute
	// DefaultRetryInterval is how soon a failed attempt is retried.
	DefaultRetryInterval = 15 * time.Second
	// DefaultSetupTimeout bounds the first provisioning in Setup.
	DefaultSetupTimeout = time.Minute
)

// The Secret is read and updated by name in the manager's namespace only (a
// namespaced Role; generate.sh's placeholder namespace becomes the release
// namespace in the chart). It is not created: the chart creates it empty,
// because create cannot be limited to one name. The webhook configuration is
// read and patched by name; nothing else of admissionregistration.k8s.io is
// touched.

// +kubebuilder:rbac:groups="",namespace=ichor-system,resources=secrets,resourceNames=ichor-policy-webhook-cert,verbs=get;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=ichor-policy-webhook,verbs=get;patch

// Options configures the certificates of the webhook.
type Options struct {
	// Namespace is the namespace of the Service and the Secret: the
	// manager's own (the chart passes it as POD_NAMESPACE). Required.
	Namespace string
	// ServiceName is the webhook Service; the certificate names
	// NAME, NAME.NAMESPACE, NAME.NAMESPACE.svc and
	// NAME.NAMESPACE.svc.CLUSTERDOMAIN. DefaultServiceName if empty.
	ServiceName string
	// ClusterDomain is the cluster's DNS domain; DefaultClusterDomain if
	// empty.
	ClusterDomain string
	// SecretName is the Secret the CA and the serving certificate are kept
	// in; DefaultSecretName if empty.
	SecretName string
	// WebhookConfigurationName is the ValidatingWebhookConfiguration whose
	// webhooks get the CA bundle; DefaultWebhookConfigurationName if empty.
	WebhookConfigurationName string
	// CertDir, CertName and KeyName are where the serving pair is written;
	// those of the manager's webhook server if empty, so that the server
	// reads what is written here.
	CertDir, CertName, KeyName string
	// CAValidity and ServingValidity are the certificates' lifetimes;
	// DefaultCAValidity and DefaultServingValidity if zero.
	CAValidity, ServingValidity time.Duration
	// CheckInterval is DefaultCheckInterval if zero.
	CheckInterval time.Duration
	// SetupTimeout is DefaultSetupTimeout if zero.
	SetupTimeout time.Duration
	// Clock is the clock; the real one if nil.
	Clock clock.PassiveClock
	// Metrics records the certificates' expiry; nil records nothing.
	Metrics *Metrics
}

// defaultServer is controller-runtime's server under srv, through the
// servers that wrap it (apiserverauth's) and say so with Unwrap.
func defaultServer(srv crwebhook.Server) (*crwebhook.DefaultServer, bool) {
	for {
		switch s := srv.(type) {
		case *crwebhook.DefaultServer:
			return s, true
		case interface{ Unwrap() crwebhook.Server }:
			srv = s.Unwrap()
		default:
			return nil, false
		}
	}
}

// Setup provisions the webhook's certificates once, then adds a Runnable to
// mgr that keeps them renewed, and a readiness check named "webhook-certs".
//
// The first provisioning happens here, before the manager starts, because
// the manager starts its webhook server before any other runnable and the
// server refuses to start without a certificate in its cert dir. It reads
// (or fills) the Secret, writes the files and sets the CA bundle; a failure
// to set the bundle (the configuration not created yet) is logged and
// retried by the Runnable, any other failure is returned.
func Setup(mgr ctrl.Manager, opts Options) error {
	c, err := client.New(mgr.GetConfig(), client.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
	})
	if err != nil {
		return fmt.Errorf("webhook certificates: client: %w", err)
	}
	if opts.CertDir == "" || opts.CertName == "" || opts.KeyName == "" {
		// The manager's own server, so its certwatcher reads these files.
		server, ok := defaultServer(mgr.GetWebhookServer())
		if !ok {
			return fmt.Errorf("webhook certificates: the manager's webhook server is a %T; set CertDir, CertName and KeyName", mgr.GetWebhookServer())
		}
		o := server.Options
		opts.CertDir = cmp.Or(opts.CertDir, o.CertDir, filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs"))
		opts.CertName = cmp.Or(opts.CertName, o.CertName, "tls.crt")
		opts.KeyName = cmp.Or(opts.KeyName, o.KeyName, "tls.key")
	}
	r, err := NewRotator(c, opts)
	if err != nil {
		return err
	}
	r.Log = mgr.GetLogger().WithName("webhookcerts")

	ctx, cancel := context.WithTimeout(context.Background(), r.opts.SetupTimeout)
	defer cancel()
	if err := r.Sync(ctx); err != nil {
		var bundleErr *CABundleError
		if !errors.As(err, &bundleErr) {
			return err
		}
		r.Log.Error(err, "the CA bundle is not set yet; retrying")
	}
	if err := mgr.AddReadyzCheck("webhook-certs", r.ReadyCheck); err != nil {
		return fmt.Errorf("webhook certificates: readiness check: %w", err)
	}
	return mgr.Add(r)
}

// Logger is what the rotator logs with; a logr.Logger (ctrl.Log, the
// manager's logger) is one.
type Logger interface {
	Info(msg string, keysAndValues ...any)
	Error(err error, msg string, keysAndValues ...any)
}

// Rotator keeps the webhook's certificates. Setup makes one from a manager;
// NewRotator makes one from a client, for tests and other wiring.
type Rotator struct {
	// Client reads and writes the Secret and the webhook configuration. It
	// must not be a cached client: a cache would list and watch every Secret
	// of the cluster, which the manager may not.
	Client client.Client
	// Log is ctrl.Log named "webhookcerts" unless set.
	Log Logger

	opts Options
	is   issuance

	mu      sync.Mutex
	current *material
	// bundleSet is whether the configuration holds the current bundle.
	bundleSet bool
}

var (
	_ manager.Runnable               = (*Rotator)(nil)
	_ manager.LeaderElectionRunnable = (*Rotator)(nil)
)

// NewRotator checks and completes opts. CertDir must be set.
func NewRotator(c client.Client, opts Options) (*Rotator, error) {
	if opts.Namespace == "" {
		return nil, errors.New("webhook certificates: no namespace (the manager's namespace, POD_NAMESPACE in the chart)")
	}
	if opts.CertDir == "" {
		return nil, errors.New("webhook certificates: no cert dir")
	}
	opts.ServiceName = cmp.Or(opts.ServiceName, DefaultServiceName)
	opts.ClusterDomain = cmp.Or(opts.ClusterDomain, DefaultClusterDomain)
	opts.SecretName = cmp.Or(opts.SecretName, DefaultSecretName)
	opts.WebhookConfigurationName = cmp.Or(opts.WebhookConfigurationName, DefaultWebhookConfigurationName)
	opts.CertName = cmp.Or(opts.CertName, "tls.crt")
	opts.KeyName = cmp.Or(opts.KeyName, "tls.key")
	opts.CAValidity = cmp.Or(opts.CAValidity, DefaultCAValidity)
	opts.ServingValidity = cmp.Or(opts.ServingValidity, DefaultServingValidity)
	opts.CheckInterval = cmp.Or(opts.CheckInterval, DefaultCheckInterval)
	opts.SetupTimeout = cmp.Or(opts.SetupTimeout, DefaultSetupTimeout)
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ServingValidity > opts.CAValidity {
		return nil, fmt.Errorf("webhook certificates: serving validity %s is longer than the CA's %s", opts.ServingValidity, opts.CAValidity)
	}
	svc, ns := opts.ServiceName, opts.Namespace
	return &Rotator{
		Client: c,
		Log:    ctrl.Log.WithName("webhookcerts"),
		opts:   opts,
		is: issuance{
			// The API server dials NAME.NAMESPACE.svc; it comes first and is
			// the common name.
			dnsNames:        []string{svc + "." + ns + ".svc", svc, svc + "." + ns, svc + "." + ns + ".svc." + opts.ClusterDomain},
			caValidity:      opts.CAValidity,
			servingValidity: opts.ServingValidity,
		},
	}, nil
}

// NeedLeaderElection is false: every replica serves the webhook, so every
// replica needs the certificate on its own disk.
func (*Rotator) NeedLeaderElection() bool { return false }

// Start renews the certificates until ctx ends: at the next renewal time,
// every CheckInterval in between, and every RetryInterval after a failure.
func (r *Rotator) Start(ctx context.Context) error {
	failed := false
	for {
		wait := r.opts.CheckInterval
		r.mu.Lock()
		if r.current != nil {
			wait = min(wait, max(r.current.nextRenewal().Sub(r.opts.Clock.Now()), 0))
		}
		switch {
		case failed:
			// Not sooner: a renewal withheld because its CA bundle could
			// not be set leaves the renewal time past, and would retry at
			// once, without end (review 170).
			wait = DefaultRetryInterval
		case r.current == nil || !r.bundleSet:
			wait = min(wait, DefaultRetryInterval)
		}
		r.mu.Unlock()

		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		err := r.Sync(ctx)
		failed = err != nil
		if failed && ctx.Err() == nil {
			r.Log.Error(err, "webhook certificates not up to date; retrying", "retry_in", DefaultRetryInterval)
		}
	}
}

// ReadyCheck fails while no serving certificate has been written, when the
// one written has expired (renewal failed for weeks), or while the webhook
// configuration was not told to trust its CA (the CA bundle could not be
// set: a replica started during a withheld renewal serves the new CA's
// certificate, review 171): a replica that cannot complete a TLS handshake
// the API server accepts takes no traffic.
func (r *Rotator) ReadyCheck(*http.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil {
		return errors.New("no webhook serving certificate yet")
	}
	if !r.bundleSet {
		return errors.New("the webhook configuration's CA bundle could not be set to trust the served certificate's CA (the manager's log says why)")
	}
	if !r.opts.Clock.Now().Before(r.current.serving.NotAfter) {
		return fmt.Errorf("the webhook serving certificate expired at %s", r.current.serving.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// CABundleError is Sync's error when the certificates are in place but the
// webhook configuration's CA bundle could not be set.
type CABundleError struct{ Err error }

func (e *CABundleError) Error() string {
	return "set the CA bundle of the webhook configuration: " + e.Err.Error()
}
func (e *CABundleError) Unwrap() error { return e.Err }

// errCAChanged is setCABundle's error when the Secret's CA changed since it
// was read: another replica renewed it, and the next check takes it up.
var errCAChanged = errors.New("the CA in the Secret changed since it was read (another replica renewed it); the next check takes it up")

// maxConflicts bounds the read-plan-update loop when replicas race.
const maxConflicts = 5

// Sync brings the Secret, the CA bundle and the files up to date once. The
// order matters: the Secret first (so every replica converges on one CA),
// then the bundle (so the API server trusts the CA before it is served), then
// the files.
func (r *Rotator) Sync(ctx context.Context) error {
	m, err := r.syncSecret(ctx)
	if err != nil {
		return err
	}
	bundleErr := r.setCABundle(ctx, m.caBundle())
	if bundleErr != nil {
		r.mu.Lock()
		cur := r.current
		r.mu.Unlock()
		// A new CA the API server was not told to trust is not served
		// while the certificate in service is good: every call to this
		// replica would fail (review 168). The bundle is set again at the
		// next check, and the new certificate served then.
		if cur != nil && !cur.ca.Equal(m.ca) && r.opts.Clock.Now().Before(cur.serving.NotAfter) {
			return &CABundleError{Err: bundleErr}
		}
	}
	if err := r.writeFiles(m); err != nil {
		return err
	}
	r.mu.Lock()
	r.current = m
	r.bundleSet = bundleErr == nil
	r.mu.Unlock()
	// The files hold m now: certwatcher serves it.
	r.opts.Metrics.loaded(m)
	if bundleErr != nil {
		return &CABundleError{Err: bundleErr}
	}
	return nil
}

func (r *Rotator) syncSecret(ctx context.Context) (*material, error) {
	key := types.NamespacedName{Namespace: r.opts.Namespace, Name: r.opts.SecretName}
	for range maxConflicts {
		var secret corev1.Secret
		err := r.Client.Get(ctx, key, &secret)
		switch {
		case apierrors.IsNotFound(err):
			// The chart creates it; try anyway for other installations.
			secret = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Type: corev1.SecretTypeOpaque}
			if err := r.Client.Create(ctx, &secret); err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("webhook certificates: Secret %s does not exist and could not be created (create it empty; the Helm chart does): %w", key, err)
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("webhook certificates: get Secret %s: %w", key, err)
		}

		now := r.opts.Clock.Now()
		m, changed, err := plan(secret.Data, now, r.is)
		if err != nil {
			return nil, fmt.Errorf("webhook certificates: %w", err)
		}
		if !changed {
			return m, nil
		}
		newCA := !bytes.Equal(secret.Data[KeyCACert], m.data[KeyCACert])
		if secret.Data == nil {
			secret.Data = map[string][]byte{}
		}
		for k, v := range m.data {
			secret.Data[k] = v
		}
		// The update carries the resourceVersion read above: if another
		// replica wrote in between, this one loses and adopts theirs.
		err = r.Client.Update(ctx, &secret)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("webhook certificates: update Secret %s: %w", key, err)
		}
		r.Log.Info("issued the webhook's serving certificate",
			"secret", key.String(), "dns_names", m.serving.DNSNames,
			"not_after", m.serving.NotAfter.UTC().Format(time.RFC3339),
			"new_ca", newCA, "ca_not_after", m.ca.NotAfter.UTC().Format(time.RFC3339))
		return m, nil
	}
	return nil, fmt.Errorf("webhook certificates: Secret %s changed under %d consecutive updates", key, maxConflicts)
}

// setCABundle sets the bundle on every webhook of the configuration that
// does not hold it, with a strategic merge patch keyed by webhook name, so
// nothing else of the configuration is written.
func (r *Rotator) setCABundle(ctx context.Context, bundle []byte) error {
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := r.Client.Get(ctx, types.NamespacedName{Name: r.opts.WebhookConfigurationName}, &vwc); err != nil {
		return fmt.Errorf("get ValidatingWebhookConfiguration %s: %w", r.opts.WebhookConfigurationName, err)
	}
	if len(vwc.Webhooks) == 0 {
		return fmt.Errorf("ValidatingWebhookConfiguration %s has no webhooks", vwc.Name)
	}
	orig := vwc.DeepCopy()
	changed := false
	for i := range vwc.Webhooks {
		if !bytes.Equal(vwc.Webhooks[i].ClientConfig.CABundle, bundle) {
			vwc.Webhooks[i].ClientConfig.CABundle = bundle
			changed = true
		}
	}
	if !changed {
		return nil
	}
	// Another replica may have renewed the CA since this one read the
	// Secret, and set the new bundle: this one's, older, is not put back
	// over it (review 168; calls to that replica failed until the next
	// check). The Secret read again after the configuration, and the patch
	// made on the configuration's version, close the window.
	var secret corev1.Secret
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.opts.Namespace, Name: r.opts.SecretName}, &secret); err != nil {
		return fmt.Errorf("read the Secret %s again before the CA bundle is set: %w", r.opts.SecretName, err)
	}
	if !bytes.Equal(secret.Data[KeyCABundle], bundle) {
		return errCAChanged
	}
	if err := r.Client.Patch(ctx, &vwc, client.StrategicMergeFrom(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patch ValidatingWebhookConfiguration %s: %w", vwc.Name, err)
	}
	r.Log.Info("set the CA bundle of the webhook configuration", "validating_webhook_configuration", vwc.Name, "webhooks", len(vwc.Webhooks))
	return nil
}

// writeFiles writes the serving pair where the webhook server reads it, each
// file replaced by a rename so the server never reads half a file; the key
// first, so that a read between the two renames sees a mismatched pair
// (which certwatcher rejects, keeping the old one) rather than never the
// new key. Files that already hold the content are left alone.
func (r *Rotator) writeFiles(m *material) error {
	if err := os.MkdirAll(r.opts.CertDir, 0o700); err != nil {
		return fmt.Errorf("webhook certificates: cert dir: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{r.opts.KeyName, m.data[KeyServingKey]},
		{r.opts.CertName, m.data[KeyServingCert]},
	} {
		path := filepath.Join(r.opts.CertDir, f.name)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, f.data) {
			continue
		}
		// The webhook server reads the pair while it is replaced: it sees
		// the old file or the new one whole.
		if err := privatefile.Write(path, f.data); err != nil {
			return fmt.Errorf("webhook certificates: %w", err)
		}
	}
	return nil
}
