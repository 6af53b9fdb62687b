// Package demo is the story `make demo` tells, on an embedded control plane:
// a real kube-apiserver, etcd and kube-controller-manager's CSR signer (alone), a
// handful of simulated Talos nodes (Talos API test servers) with their
// kubelets (the client-go certificate manager the kubelet runs), and the real
// `ichor manager` binary deciding their serving certificates.
//
// One node is compromised and asks for another node's IP; one is not a
// managed machine; one has its Talos API down at first. Each decision is shown
// as it happens, with its reasons, from the manager's decision log.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// Options configures Run.
type Options struct {
	// Out receives the story.
	Out io.Writer
	// Ichor is the path of the ichor binary, run as the manager.
	Ichor string
	// WorkDir keeps the kubeconfig, the decision log and the logs.
	WorkDir string
	// Interactive keeps everything running after the story until ctx ends
	// (Ctrl-C), so a person can explore with kubectl.
	Interactive bool
	// Timeout bounds the story (not the interactive wait).
	Timeout time.Duration
}

// Result is what happened, for the non-interactive run to assert.
type Result struct {
	// Verdicts maps each node to the actions decided for its requests, in order.
	Verdicts map[string][]string
	// Certified lists the nodes whose kubelet holds a certificate.
	Certified   []string
	Kubeconfig  string
	DecisionLog string
	// Metrics is the manager's Prometheus endpoint as scraped at the end.
	Metrics string
	// Talosconfig is the read-only talosconfig issued to the operator.
	Talosconfig string
	// ViewerRefusal is what the viewer was told.
	ViewerRefusal string
}

type node struct {
	name    string
	addrs   []string // what its Talos API reports
	asks    []string // the IPs its kubelet asks for
	managed bool
	down    bool // Talos API unreachable at first
	story   string
}

var nodes = []node{
	{name: "cp-1", addrs: []string{"10.5.0.2"}, asks: []string{"10.5.0.2"}, managed: true, story: "control plane, honest"},
	{name: "worker-1", addrs: []string{"10.5.0.3", "fd00:5::3"}, asks: []string{"10.5.0.3", "fd00:5::3"}, managed: true, story: "worker, honest, dual-stack"},
	{name: "worker-2", addrs: []string{"10.5.0.4"}, asks: []string{"10.5.0.3"}, managed: true, story: "worker, COMPROMISED: asks for worker-1's IP 10.5.0.3"},
	{name: "worker-3", addrs: []string{"10.5.0.5"}, asks: []string{"10.5.0.5"}, managed: true, down: true, story: "worker, honest, its Talos API is down at first"},
	{name: "stranger-1", addrs: []string{"10.9.0.9"}, asks: []string{"10.9.0.9"}, managed: false, story: "not a managed machine"},
}

// Run tells the story. It stops everything it started before returning.
func Run(ctx context.Context, opts Options) (res Result, err error) {
	out := opts.Out
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	res.Verdicts = map[string][]string{}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Minute
	}
	storyCtx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if err := os.MkdirAll(opts.WorkDir, 0o700); err != nil {
		return res, fmt.Errorf("work directory: %w", err)
	}

	say("== Starting the control plane: kube-apiserver, etcd, kube-controller-manager (CSR signer only)")
	start := time.Now()
	env, err := harness.Start(storyCtx, harness.Options{WorkDir: filepath.Join(opts.WorkDir, "control-plane")})
	if err != nil {
		return res, fmt.Errorf("start the control plane: %w", err)
	}
	defer func() {
		if stopErr := env.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	say("   ready in %s", time.Since(start).Round(100*time.Millisecond))
	res.Kubeconfig = filepath.Join(opts.WorkDir, "kubeconfig")
	if err := os.WriteFile(res.Kubeconfig, env.AdminKubeconfig, 0o600); err != nil {
		return res, fmt.Errorf("write kubeconfig: %w", err)
	}

	say("== A TalosCluster with kubelet serving certificates enabled, and its machines")
	if err := createCluster(storyCtx, env); err != nil {
		return res, err
	}
	talos := map[string]*harness.TalosNode{}
	for _, n := range nodes {
		var addrs []netip.Addr
		for _, a := range n.addrs {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		tn, err := env.StartTalosNode(storyCtx, harness.NodeOptions{Name: n.name, Addresses: addrs})
		if err != nil {
			return res, err
		}
		talos[n.name] = tn
		if n.down {
			tn.SetUnavailable(true)
		}
		if n.managed {
			if err := createMachine(storyCtx, env, n.name, tn.Endpoint()); err != nil {
				return res, err
			}
		}
		say("   %-10s Talos API %-16s reports %-24s  %s", n.name, tn.Endpoint(), strings.Join(n.addrs, ","), n.story)
	}

	say("== Starting the real manager: %s manager", opts.Ichor)
	res.DecisionLog = filepath.Join(opts.WorkDir, "decisions.log")
	metricsAddr, err := freeAddress()
	if err != nil {
		return res, err
	}
	// The credential webhook, registered with the API server at the
	// manager's loopback address and envtest's serving certificate.
	webhook, err := webhooktest.Install(env.Config)
	if err != nil {
		return res, err
	}
	defer func() { _ = webhook.Cleanup() }()
	// The ValidatingAdmissionPolicy that pins a credential request's
	// requester to its creator, as the chart installs it.
	if err := webhooktest.InstallAdmissionPolicies(ctx, env.Client, "default"); err != nil {
		return res, err
	}
	mgr, err := startManager(opts.Ichor, res.Kubeconfig, res.DecisionLog, filepath.Join(opts.WorkDir, "manager.log"), metricsAddr,
		"--webhook-port", fmt.Sprint(webhook.LocalServingPort), "--webhook-cert-dir", webhook.LocalServingCertDir,
		// The one TalosCluster whose machines are this API server's nodes,
		// as the chart's manager.localClusters names it.
		"--local-clusters", "demo/demo")
	if err != nil {
		return res, err
	}
	defer mgr.stop()

	say("== The kubelets ask for their serving certificates; each decision as it happens:")
	verdicts := newVerdicts()
	tailCtx, stopTail := context.WithCancel(ctx)
	tailDone := make(chan struct{})
	go func() {
		defer close(tailDone)
		tail(tailCtx, res.DecisionLog, func(e entry) {
			verdicts.add(e)
			say("   %s", e.line())
		})
	}()
	defer func() { stopTail(); <-tailDone }()

	kubelets := map[string]*harness.Kubelet{}
	for _, n := range nodes {
		var ips []net.IP
		for _, a := range n.asks {
			ips = append(ips, net.ParseIP(a))
		}
		k, err := env.StartKubelet(storyCtx, harness.KubeletOptions{NodeName: n.name, IPs: ips})
		if err != nil {
			return res, err
		}
		kubelets[n.name] = k
	}

	// Wait until every node has its first verdict.
	if err := verdicts.waitFor(storyCtx, mgr.exited, func(v map[string][]string) bool {
		for _, n := range nodes {
			if len(v[n.name]) == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return res, fmt.Errorf("waiting for the first decisions: %w (manager log: %s)", err, mgr.logPath)
	}
	// The compromised kubelet would keep asking; it has made its point.
	kubelets["worker-2"].Stop()

	say("== worker-3's Talos API comes back: its pending request is decided again")
	talos["worker-3"].SetUnavailable(false)
	if err := verdicts.waitFor(storyCtx, mgr.exited, func(v map[string][]string) bool {
		return slices.Contains(v["worker-3"], "approve")
	}); err != nil {
		return res, fmt.Errorf("waiting for worker-3: %w (manager log: %s)", err, mgr.logPath)
	}
	for _, n := range []string{"cp-1", "worker-1", "worker-3"} {
		if _, err := kubelets[n].WaitForCertificate(storyCtx); err != nil {
			return res, fmt.Errorf("kubelet %s got no certificate: %w", n, err)
		}
	}
	for _, n := range nodes {
		if kubelets[n.name].Current() != nil {
			res.Certified = append(res.Certified, n.name)
		}
	}
	say("   kubelets holding a CA-signed serving certificate: %s", strings.Join(res.Certified, ", "))
	res.Verdicts = verdicts.snapshot()
	if res.Metrics, err = scrape(storyCtx, "http://"+metricsAddr+"/metrics"); err != nil {
		return res, err
	}
	say("   metrics: http://%s/metrics", metricsAddr)

	say("")
	say("== A read-only talosconfig for an operator, through the admission webhook: ichor cluster talosconfig")
	if res.Talosconfig, err = credentials(storyCtx, env, opts, say); err != nil {
		return res, err
	}

	say("")
	say("== The decision log, as `ichor decisions list` reads it:")
	list := exec.CommandContext(storyCtx, opts.Ichor, "decisions", "list", res.DecisionLog)
	list.Stdout, list.Stderr = out, out
	if err := list.Run(); err != nil {
		say("   (ichor decisions list: %v)", err)
	}

	say("")
	explore(ctx, opts, res, mgr.logPath, say)
	return res, nil
}

// explore ends the story: interactive, it says how to look around and waits
// for Ctrl-C; otherwise the control plane stops when Run returns, so a
// kubeconfig for it would point at nothing, and only the files that stay are
// named.
func explore(ctx context.Context, opts Options, res Result, managerLog string, say func(string, ...any)) {
	if !opts.Interactive {
		say("== Kept after the demo:")
		say("   %s decisions show ID %s", opts.Ichor, res.DecisionLog)
		say("   manager log: %s", managerLog)
		return
	}
	say("== Explore:")
	say("   export KUBECONFIG=%s", res.Kubeconfig)
	say("   kubectl get csr; kubectl describe csr   # the conditions carry the reasons, decision ids and policy revision")
	say("   kubectl -n demo get talosclusters,talosmachines")
	say("   %s decisions show ID %s", opts.Ichor, res.DecisionLog)
	say("   manager log: %s", managerLog)
	say("== Running until Ctrl-C.")
	<-ctx.Done()
	say("== Stopping: manager, kubelets, Talos nodes, control plane.")
}

func createCluster(ctx context.Context, env *harness.Env) error {
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	// The Secret names the one cluster that may use its CAs, as an
	// operator's would.
	secret := env.SecretsBundleSecret("demo", "demo-talos-secrets")
	secret.Annotations[ichorv1alpha1.SecretsClaimAnnotation] = "demo"
	if err := env.Client.Create(ctx, secret); err != nil {
		return fmt.Errorf("create secrets bundle Secret: %w", err)
	}
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "demo-talos-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true, VerifyFromAPIServer: true,
			}},
		},
	}
	if err := env.Client.Create(ctx, cluster); err != nil {
		return fmt.Errorf("create TalosCluster: %w", err)
	}
	return nil
}

func createMachine(ctx context.Context, env *harness.Env, name, endpoint string) error {
	role := ichorv1alpha1.MachineRoleWorker
	if strings.HasPrefix(name, "cp-") {
		role = ichorv1alpha1.MachineRoleControlPlane
	}
	m := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name},
		Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Hostname: name, Endpoint: endpoint, Role: role},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		return fmt.Errorf("create TalosMachine %s: %w", name, err)
	}
	m.Status.NodeName = name
	if err := env.Client.Status().Update(ctx, m); err != nil {
		return fmt.Errorf("set node name of TalosMachine %s: %w", name, err)
	}
	return nil
}

// manager is the `ichor manager` process.
type manager struct {
	cmd     *exec.Cmd
	logPath string
	done    chan error
	// exited is closed when the process ends.
	exited chan struct{}
}

// freeAddress is a loopback address with a port free now, for the
// manager's metrics endpoint.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("scrape the manager's metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("scrape the manager's metrics: %w", err)
	}
	return string(b), nil
}

func startManager(ichor, kubeconfig, decisionLog, logPath, metricsAddr string, extra ...string) (*manager, error) {
	stdout, err := os.Create(decisionLog)
	if err != nil {
		return nil, fmt.Errorf("decision log: %w", err)
	}
	stderr, err := os.Create(logPath)
	if err != nil {
		stdout.Close()
		return nil, fmt.Errorf("manager log: %w", err)
	}
	// The demo's machines answer on this host's loopback, which the
	// manager denies by default (--node-denied-networks): no real node's
	// Talos API is there.
	args := append([]string{"manager", "--kubeconfig", kubeconfig,
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", "0", "--resync-interval", "5s",
		"--node-denied-networks="}, extra...)
	cmd := exec.Command(ichor, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// The manager's namespace, as the chart sets it: where its admission key
	// Secret is.
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+harness.ManagerNamespace)
	if err := cmd.Start(); err != nil {
		stdout.Close()
		stderr.Close()
		return nil, fmt.Errorf("start %s manager: %w", ichor, err)
	}
	m := &manager{cmd: cmd, logPath: logPath, done: make(chan error, 1), exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		close(m.exited)
		m.done <- err
		stdout.Close()
		stderr.Close()
	}()
	return m, nil
}

// stop ends the manager with SIGTERM, as Kubernetes would, then waits.
func (m *manager) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done: //nolint:errcheck // the exit status of a stopped manager says nothing
	case <-time.After(15 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done //nolint:errcheck // killed: its exit status says nothing
	}
}

// entry is the part of a decision-log line the story shows.
type entry struct {
	Msg        string `json:"msg"`
	DecisionID string `json:"decision_id"`
	Path       string `json:"path"`
	Time       string `json:"time"`
	Input      struct {
		CSR struct {
			Name string `json:"name"`
		} `json:"csr"`
	} `json:"input"`
	Result struct {
		Action  string `json:"action"`
		Node    string `json:"node"`
		Reasons []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"reasons"`
	} `json:"result"`
}

func (e entry) line() string {
	mark := map[string]string{"approve": "APPROVED", "deny": "DENIED  ", "pending": "PENDING "}[e.Result.Action]
	var reasons []string
	for _, r := range e.Result.Reasons {
		reasons = append(reasons, r.Code+": "+r.Message)
	}
	return fmt.Sprintf("%s %-10s %-10s %s", mark, e.Result.Node, e.Input.CSR.Name, strings.Join(reasons, "; "))
}

// servingDecision is the path of the kubelet serving decisions in the log;
// the log also holds other rules' decisions and the records of verdicts
// applied (system/applied/record), which carry an action too.
const servingDecision = "ichor/kubelet_serving/decision"

// tail follows the kubelet serving decisions of the decision log as the
// manager writes it.
func tail(ctx context.Context, path string, fn func(entry)) {
	var f *os.File
	for f == nil {
		var err error
		if f, err = os.Open(path); err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var partial strings.Builder
	for {
		line, err := r.ReadString('\n')
		partial.WriteString(line)
		if err == nil {
			var e entry
			if json.Unmarshal([]byte(partial.String()), &e) == nil && e.Msg == "Decision Log" && e.Path == servingDecision {
				fn(e)
			}
			partial.Reset()
			continue
		}
		if !errors.Is(err, io.EOF) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type verdicts struct {
	mu      sync.Mutex
	changed chan struct{}
	byNode  map[string][]string
}

func newVerdicts() *verdicts {
	return &verdicts{changed: make(chan struct{}, 1), byNode: map[string][]string{}}
}

func (v *verdicts) add(e entry) {
	v.mu.Lock()
	v.byNode[e.Result.Node] = append(v.byNode[e.Result.Node], e.Result.Action)
	v.mu.Unlock()
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

func (v *verdicts) snapshot() map[string][]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string][]string, len(v.byNode))
	for k, s := range v.byNode {
		out[k] = append([]string(nil), s...)
	}
	return out
}

// waitFor waits until cond holds over the verdicts so far, or ctx ends, or
// the manager exits.
func (v *verdicts) waitFor(ctx context.Context, exited <-chan struct{}, cond func(map[string][]string) bool) error {
	for {
		if cond(v.snapshot()) {
			return nil
		}
		select {
		case <-exited:
			return errors.New("the manager exited")
		case <-ctx.Done():
			got := v.snapshot()
			keys := make([]string, 0, len(got))
			for k := range got {
				keys = append(keys, fmt.Sprintf("%s=%v", k, got[k]))
			}
			sort.Strings(keys)
			return fmt.Errorf("%w; verdicts so far: %s", ctx.Err(), strings.Join(keys, " "))
		case <-v.changed:
		}
	}
}
