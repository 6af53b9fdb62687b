// Package bench measures what the policy engine costs end to end: N
// simulated Talos machines (a Talos API test server each) whose kubelets all
// ask for a serving certificate at once, against the real kube-apiserver,
// etcd and CSR signer (kube-controller-manager's) of test/harness, decided by the
// Ichor manager in one run and by a rubber stamp (approve everything, check
// nothing) in the next, so the ratio of the two is what the policy costs
// beside the API server's own ceiling on this machine. It also measures
// TalosCredentialRequest admission through the real webhook, and the
// manager's CPU profile, heap and RSS.
//
// The driver is cmd/bench (run by `make bench`); the controllers run as a
// separate process, cmd/benchmanager, so their CPU time, profile and RSS are
// their own. Nothing here runs under `go test ./...` but the unit tests of
// the parsers and the decision benchmarks (which only run with -bench).
package bench

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// The namespace and TalosCluster every machine of the fleet belongs to (a
// spread's have their own: Spread).
const (
	Namespace   = "bench"
	ClusterName = "bench"
	secretsName = "bench-talos-secrets" //nolint:gosec // G101: a Secret's name, not a secret
)

// Fleet is the control plane and the simulated machines.
type Fleet struct {
	Env      *harness.Env
	Machines []*Machine
	// Workers bounds the concurrency of setup work (Talos servers, API
	// objects); the load itself has its own.
	Workers int
	// Webhook is the credential webhook's ValidatingWebhookConfiguration
	// (deploy/webhook), installed pointing at a port on 127.0.0.1 with
	// serving certificates in its LocalServingCertDir: `ichor manager`
	// serves there (as make demo runs it), or the in-process webhook.
	Webhook *envtest.WebhookInstallOptions
}

// Machine is one simulated Talos machine: its Talos API test server (which
// reports the node's identity to the manager), its TalosMachine, and the
// client configuration its kubelet authenticates with.
type Machine struct {
	Name  string
	IP    net.IP
	Talos *harness.TalosNode
	// Cluster is the TalosCluster the machine belongs to.
	Cluster types.NamespacedName

	mu      sync.Mutex
	kubelet *rest.Config
}

// StartFleet starts the control plane (test/harness) and creates the
// namespace, the secrets bundle and the TalosCluster with kubelet serving
// certificates enabled. Machines are added by Grow.
func StartFleet(ctx context.Context, workDir string) (*Fleet, error) {
	env, err := harness.Start(ctx, harness.Options{WorkDir: workDir})
	if err != nil {
		return nil, err
	}
	f := &Fleet{Env: env, Workers: 8}
	if err := f.createCluster(ctx, MainCluster, env.SecretsBundleSecret(Namespace, secretsName)); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	if err := f.InstallWebhook(); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	// The requester policy the chart installs, so admission is measured
	// with it.
	if err := webhooktest.InstallAdmissionPolicies(ctx, env.Client, "default"); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	return f, nil
}

// Stop stops the machines and the control plane.
func (f *Fleet) Stop() error {
	err := f.Env.Stop()
	if f.Webhook != nil {
		err = errors.Join(err, f.Webhook.Cleanup())
	}
	return err
}

// InstallWebhook (re)installs deploy/webhook's configuration, as
// webhooktest.Install does, pointing at a port free now and outside the
// kernel's ephemeral range: thousands of Talos API servers and short-lived
// connections take ephemeral ports, and one of them could take the
// webhook's between its installation and its server's start. It is called
// again before each server starts, with new serving certificates.
func (f *Fleet) InstallWebhook() error {
	if f.Webhook != nil {
		_ = f.Webhook.Cleanup()
	}
	root, err := webhooktest.RepoRoot()
	if err != nil {
		return err
	}
	port, err := stablePort()
	if err != nil {
		return err
	}
	f.Webhook = &envtest.WebhookInstallOptions{
		Paths:            []string{filepath.Join(root, "deploy", "webhook")},
		LocalServingHost: "127.0.0.1",
		LocalServingPort: port,
	}
	if err := f.Webhook.Install(f.Env.Config); err != nil {
		return fmt.Errorf("install the webhook configuration: %w", err)
	}
	return nil
}

// stablePort is a loopback port free now, below the ephemeral range.
func stablePort() (int, error) {
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const from = 10000
	if low <= from+100 {
		return 0, fmt.Errorf("no port below the ephemeral range (from %d)", low)
	}
	for range 100 {
		port := from + mathrand.IntN(low-from) //nolint:gosec // G404: picking a port, not a secret
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, errors.New("no free port below the ephemeral range")
}

// createCluster creates the cluster's namespace (unless it exists), its
// secrets bundle Secret and the TalosCluster, with kubelet serving
// certificates enabled.
func (f *Fleet) createCluster(ctx context.Context, key types.NamespacedName, secret *corev1.Secret) error {
	c := f.Env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: key.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", key.Namespace, err)
	}
	if err := c.Create(ctx, secret); err != nil {
		return fmt.Errorf("create secrets bundle Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: secret.Name},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true, VerifyFromAPIServer: true,
			}},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		return fmt.Errorf("create TalosCluster %s: %w", key, err)
	}
	return nil
}

// machineName is the node name of machine i.
func machineName(i int) string {
	return fmt.Sprintf("node-%05d", i)
}

// machineIP is a distinct address per machine, 10.x.y.z from 10.0.0.1.
func machineIP(i int) net.IP {
	n := i + 1
	return net.IPv4(10, byte(n>>16), byte(n>>8), byte(n)) //nolint:gosec // G115: truncation to octets is the point
}

// Grow adds machines until there are n: for each, a Talos API test server
// reporting its name, hostname and address, and a TalosMachine with its node
// name recorded, as Ichor would have created it.
func (f *Fleet) Grow(ctx context.Context, n int) error {
	from := len(f.Machines)
	if n <= from {
		return nil
	}
	added := make([]*Machine, n-from)
	err := parallel(ctx, f.Workers, n-from, func(ctx context.Context, k int) error {
		i := from + k
		m := &Machine{Name: machineName(i), IP: machineIP(i), Cluster: MainCluster}
		if err := f.startMachine(ctx, m, nil); err != nil {
			return err
		}
		added[k] = m
		return nil
	})
	if err != nil {
		return err
	}
	f.Machines = append(f.Machines, added...)
	return nil
}

// MainCluster is the one TalosCluster of the fleet's machines.
var MainCluster = types.NamespacedName{Namespace: Namespace, Name: ClusterName}

// Group is the machines whose kubelets one run's load comes from, and the
// TalosClusters they belong to, every one named to `ichor manager` as a
// judge of the local API server (--local-clusters).
type Group struct {
	Clusters []types.NamespacedName
	Machines []*Machine
}

// Main is the first n machines of the fleet, all of the one TalosCluster.
func (f *Fleet) Main(n int) (Group, error) {
	if n > len(f.Machines) {
		return Group{}, fmt.Errorf("%d machines wanted of %d", n, len(f.Machines))
	}
	return Group{Clusters: []types.NamespacedName{MainCluster}, Machines: f.Machines[:n]}, nil
}

// spreadCluster is cluster c of a spread: a namespace of its own, and a
// TalosCluster of the same name in it.
func spreadCluster(c int) types.NamespacedName {
	name := fmt.Sprintf("bench-spread-%02d", c)
	return types.NamespacedName{Namespace: name, Name: name}
}

// spreadAddressOffset keeps the spread's addresses (10.64.0.1 on) apart
// from the fleet's (10.0.0.1 on).
const spreadAddressOffset = 1 << 22

// Spread makes n more machines spread over k TalosClusters, machine i in
// cluster i mod k: each cluster in a namespace of its own, with its own
// secrets bundle Secret whose OS CA is its own (its machines' Talos API
// servers trust only readers made from it), kubelet serving certificates
// enabled as on the fleet's cluster. Node names and addresses are distinct
// from the fleet's. RemoveSpread undoes it.
func (f *Fleet) Spread(ctx context.Context, n, k int) (Group, error) {
	g := Group{Machines: make([]*Machine, n)}
	cas := make([]*talosapi.CA, k)
	for c := range k {
		key := spreadCluster(c)
		g.Clusters = append(g.Clusters, key)
		ca, err := talosapi.NewCA()
		if err != nil {
			return g, err
		}
		cas[c] = ca
		secret, err := f.Env.SecretsBundleSecretWithOSCA(key.Namespace, key.Name+"-talos-secrets", ca)
		if err != nil {
			return g, err
		}
		if err := f.createCluster(ctx, key, secret); err != nil {
			return g, err
		}
	}
	err := parallel(ctx, f.Workers, n, func(ctx context.Context, i int) error {
		m := &Machine{Name: fmt.Sprintf("spread-%05d", i), IP: machineIP(spreadAddressOffset + i), Cluster: g.Clusters[i%k]}
		if err := f.startMachine(ctx, m, cas[i%k]); err != nil {
			return err
		}
		g.Machines[i] = m
		return nil
	})
	return g, err
}

// RemoveSpread deletes the spread's TalosMachines, TalosClusters and
// Secrets and stops its Talos API servers, so that later runs see the
// fleet's objects only. The namespaces stay (envtest has no namespace
// controller to empty them).
func (f *Fleet) RemoveSpread(ctx context.Context, g Group) error {
	c := f.Env.Client
	for _, key := range g.Clusters {
		if err := c.DeleteAllOf(ctx, &ichorv1alpha1.TalosMachine{}, client.InNamespace(key.Namespace)); err != nil {
			return fmt.Errorf("delete the TalosMachines of %s: %w", key, err)
		}
		cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		if err := c.Delete(ctx, cluster); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete TalosCluster %s: %w", key, err)
		}
		if err := c.DeleteAllOf(ctx, &corev1.Secret{}, client.InNamespace(key.Namespace)); err != nil {
			return fmt.Errorf("delete the Secrets of %s: %w", key.Namespace, err)
		}
	}
	for _, m := range g.Machines {
		if m != nil && m.Talos != nil {
			m.Talos.Stop()
		}
	}
	return nil
}

// startMachine starts the machine's Talos API test server, serving with ca
// (the fleet's OS CA if nil), and creates its TalosMachine.
func (f *Fleet) startMachine(ctx context.Context, m *Machine, ca *talosapi.CA) error {
	addr, _ := netip.AddrFromSlice(m.IP.To4())
	// The servers live as long as the fleet (Stop), not as long as the call.
	tn, err := f.Env.StartTalosNode(context.WithoutCancel(ctx), harness.NodeOptions{Name: m.Name, Addresses: []netip.Addr{addr}, CA: ca})
	if err != nil {
		return err
	}
	m.Talos = tn
	return f.createMachine(ctx, m)
}

func (f *Fleet) createMachine(ctx context.Context, m *Machine) error {
	tm := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: m.Cluster.Namespace, Name: m.Name},
		Spec: ichorv1alpha1.TalosMachineSpec{
			ClusterName: m.Cluster.Name, Hostname: m.Name, Endpoint: m.Talos.Endpoint(), Role: ichorv1alpha1.MachineRoleWorker,
		},
	}
	if err := f.Env.Client.Create(ctx, tm); err != nil {
		return fmt.Errorf("create TalosMachine %s: %w", m.Name, err)
	}
	tm.Status.NodeName = m.Name
	if err := f.Env.Client.Status().Update(ctx, tm); err != nil {
		return fmt.Errorf("set node name of TalosMachine %s: %w", m.Name, err)
	}
	return nil
}

// KubeletConfig is the client configuration the machine's kubelet
// authenticates with: user system:node:NAME in group system:nodes, a client
// certificate of its own.
func (f *Fleet) KubeletConfig(m *Machine) (*rest.Config, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.kubelet == nil {
		cfg, err := f.Env.UserConfig("system:node:"+m.Name, harness.NodesGroup)
		if err != nil {
			return nil, err
		}
		m.kubelet = cfg
	}
	return rest.CopyConfig(m.kubelet), nil
}

// parallel runs fn for 0..n-1 on workers goroutines and returns the first
// error; the others are cancelled.
func parallel(ctx context.Context, workers, n int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// since is time.Since rounded for a person.
func since(t time.Time) time.Duration {
	return time.Since(t).Round(100 * time.Millisecond)
}

// ForgetCertificates clears the serving certificate recorded on each machine
// of the group, as before the fleet's first join: every run's requests are
// then of machines expected to ask (whose identities the manager watches),
// whatever an earlier run recorded.
func (f *Fleet) ForgetCertificates(ctx context.Context, g Group) error {
	work := make(chan *Machine)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 8 {
		wg.Go(func() {
			for m := range work {
				if err := f.forgetCertificate(ctx, m); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, m := range g.Machines {
		work <- m
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

func (f *Fleet) forgetCertificate(ctx context.Context, m *Machine) error {
	var tm ichorv1alpha1.TalosMachine
	key := types.NamespacedName{Namespace: m.Cluster.Namespace, Name: m.Name}
	if err := f.Env.Client.Get(ctx, key, &tm); err != nil {
		return fmt.Errorf("get TalosMachine %s: %w", key, err)
	}
	if tm.Status.KubeletServingCertificate == nil {
		return nil
	}
	tm.Status.KubeletServingCertificate = nil
	if err := f.Env.Client.Status().Update(ctx, &tm); err != nil {
		return fmt.Errorf("forget the certificate of TalosMachine %s: %w", key, err)
	}
	return nil
}
