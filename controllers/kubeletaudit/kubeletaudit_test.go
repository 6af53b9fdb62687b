package kubeletaudit_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletaudit"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// One control plane and one manager running the periodic audit every
// second serve every test of the package.
var (
	env         *harness.Env
	decisionLog = &harness.DecisionLog{}
	// hosts maps each node's address and kubelet port to its harness
	// kubelet's local listener, as /etc/hosts would: the nodes' addresses
	// (10.42.x.y) are not routable on the test machine.
	hosts           = &harness.Hosts{}
	metricsRegistry = prometheus.NewRegistry()
	// auditAnswers are odd answers of the audit rule, by machine
	// (namespace/name); the real rule answers the others.
	auditAnswers = &enginetest.Answers[engine.AuditDecision]{}
	// conflictsIn are the namespaces whose machines' status writes the
	// runner's client answers 409, as the API server does to a writer racing
	// a tenant that updates its TalosMachines in a loop; conflicts counts
	// the answers.
	conflictsIn sync.Map
	conflicts   atomic.Int64
)

// conflicting is the runner's client, answering 409 to the status writes
// of the machines of conflictsIn's namespaces.
type conflicting struct{ client.Client }

func (c conflicting) Status() client.SubResourceWriter {
	return conflictingStatus{c.Client.Status()}
}

type conflictingStatus struct{ client.SubResourceWriter }

func (w conflictingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if _, ok := conflictsIn.Load(obj.GetNamespace()); ok {
		conflicts.Add(1)
		return apierrors.NewConflict(ichorv1alpha1.GroupVersion.WithResource("talosmachines").GroupResource(), obj.GetName(), errors.New("the object has been modified"))
	}
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}

const (
	waitFor     = 60 * time.Second
	kubeletPort = 10250
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Options{}, func(ctx context.Context, e *harness.Env) (func(), error) {
		env = e
		return nil, startManager(ctx)
	}))
}

func startManager(ctx context.Context) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	eng, err := engine.New(ctx, engine.Options{DecisionLog: decisionLog, Log: os.Stderr})
	if err != nil {
		return err
	}
	if err := env.AtStop(func() { eng.Stop(context.Background()) }); err != nil {
		return err
	}
	metrics, err := kubeletaudit.NewMetrics(metricsRegistry)
	if err != nil {
		return err
	}
	mgr, err := env.NewManager(env.Config, nil)
	if err != nil {
		return err
	}
	runner := &kubeletaudit.Runner{
		Auditor: &kubeletaudit.Auditor{
			Reader:      mgr.GetAPIReader(),
			NodeReaders: &kubeletserving.NodeReaders{Reader: mgr.GetAPIReader(), Timeout: 2 * time.Second},
			Engine: &enginetest.Engine{Engine: eng, KubeletServingAuditFunc: func(_ context.Context, in servingcert.Audit) (engine.AuditDecision, error) {
				return auditAnswers.Answer(in.Machine.Namespace + "/" + in.Machine.Name)
			}},
			Port:    kubeletPort,
			Timeout: time.Second,
			Dial:    hosts.Dial,
		},
		Client:   conflicting{Client: mgr.GetClient()},
		Recorder: mgr.GetEventRecorder("ichor-kubelet-serving-audit"),
		Metrics:  metrics,
		Interval: time.Second,
	}
	if err := mgr.Add(runner); err != nil {
		return err
	}
	harness.RunManager(ctx, mgr, "manager")
	return nil
}

type fixture struct {
	t  *testing.T
	ns string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ns := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	require.NoError(t, env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(t.Context(), env.SecretsBundleSecret(ns, "talos-secrets")))
	require.NoError(t, env.Client.Create(t.Context(), &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true,
			}},
		},
	}))
	return &fixture{t: t, ns: ns}
}

// machine starts a node (its Talos API and its kubelet at addr), registers
// its TalosMachine, approves the kubelet's serving certificate and maps
// addr's kubelet port to the kubelet.
func (f *fixture) machine(name, addr string, opts harness.KubeletOptions) (*harness.TalosNode, *harness.Kubelet) {
	f.t.Helper()
	ctx := f.t.Context()
	node, err := env.StartTalosNode(ctx, harness.NodeOptions{Name: name, Addresses: []netip.Addr{netip.MustParseAddr(addr)}})
	require.NoError(f.t, err)
	f.t.Cleanup(node.Stop)
	m := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: ichorv1alpha1.TalosMachineSpec{
			ClusterName: "demo", Hostname: name, Endpoint: node.Endpoint(), Role: ichorv1alpha1.MachineRoleWorker,
		},
	}
	require.NoError(f.t, env.Client.Create(ctx, m))
	opts.NodeName, opts.DNSNames, opts.IPs = name, []string{name}, []net.IP{net.ParseIP(addr)}
	kubelet, err := env.StartKubelet(ctx, opts)
	require.NoError(f.t, err)
	f.t.Cleanup(kubelet.Stop)
	_, err = kubelet.ApproveServing(ctx)
	require.NoError(f.t, err)
	hosts.Map(net.JoinHostPort(addr, "10250"), kubelet.ServingAddress())
	return node, kubelet
}

// condition waits for the machine's audit condition to have status and
// reason, and returns it.
func (f *fixture) condition(name string, status metav1.ConditionStatus, reason string) metav1.Condition {
	f.t.Helper()
	return f.conditionWith(name, func(c metav1.Condition) bool { return c.Status == status && c.Reason == reason })
}

// The whole audit on one cluster: a certificate current, one whose node's
// IP moved after issuance, one from another CA, one expiring soon, and a
// kubelet that accepts and never answers.
func TestPeriodicAudit(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()

	f.machine("current-1", "10.42.1.2", harness.KubeletOptions{})
	movedNode, movedKubelet := f.machine("moved-1", "10.42.1.3", harness.KubeletOptions{})
	_, otherCA := f.machine("other-ca-1", "10.42.1.4", harness.KubeletOptions{})
	// kube-controller-manager signs the 10 minutes asked for: within the
	// rule's 30 days of warning from the start.
	f.machine("short-1", "10.42.1.5", harness.KubeletOptions{RequestedLifetime: 10 * time.Minute})
	_, silent := f.machine("silent-1", "10.42.1.6", harness.KubeletOptions{})

	c := f.condition("current-1", metav1.ConditionTrue, "CertificateCurrent")
	require.Contains(t, c.Message, `machine "current-1"`)
	require.Contains(t, c.Message, "(decision ")
	f.condition("moved-1", metav1.ConditionTrue, "CertificateCurrent")

	t.Run("IPMovedAfterIssuance", func(t *testing.T) {
		// Talos now gives the kubelet another address; the kubelet still
		// serves the certificate issued for the old one, reached at the new.
		require.NoError(t, movedNode.SetIdentity(ctx, talosapi.Identity{
			Nodename: "moved-1", Hostname: "moved-1", Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.33")},
		}))
		hosts.Map("10.42.1.33:10250", movedKubelet.ServingAddress())
		c := f.condition("moved-1", metav1.ConditionFalse, "CertificateNamesNotNode")
		require.Contains(t, c.Message, `IP address 10.42.1.3 is not one of the node's addresses ["10.42.1.33"]`)
		id := decisionID(t, c.Message)
		entry := harness.FindDecision[map[string]any](t, decisionLog, id)
		require.Equal(t, engine.PathKubeletServingAudit, entry["path"])
		require.Equal(t, "drifted", entry["result"].(map[string]any)["status"])
		require.Equal(t, "10.42.1.33:10250", entry["input"].(map[string]any)["certificate"].(map[string]any)["address"])
		f.event("moved-1", "CertificateNamesNotNode")
		f.gauge("ichor_kubelet_serving_certificate_drift", map[string]string{"reason": "CertificateNamesNotNode"}, 1)
	})

	t.Run("NotIssuedByTheClusterCA", func(t *testing.T) {
		otherCA.ServeInstead(selfSigned(t, "other-ca-1", "10.42.1.4"))
		c := f.condition("other-ca-1", metav1.ConditionFalse, "CertificateNotIssuedByClusterCA")
		require.Contains(t, c.Message, "x509: certificate signed by unknown authority")
		f.event("other-ca-1", "CertificateNotIssuedByClusterCA")
	})

	t.Run("ExpiresSoon", func(t *testing.T) {
		c := f.condition("short-1", metav1.ConditionFalse, "CertificateExpiresSoon")
		require.Contains(t, c.Message, "within the 30 days warned of")
	})

	t.Run("SilentKubeletIsUnknownNotDrift", func(t *testing.T) {
		silent.SetSilent(true)
		c := f.condition("silent-1", metav1.ConditionUnknown, "CertificateUnreadable")
		require.Contains(t, c.Message, "10.42.1.6:10250")
		// Bounded: the other machines of the cluster are audited every
		// second all the same.
		f.gauge("ichor_kubelet_serving_certificates_audited", map[string]string{"status": "unknown"}, 1)
		f.gauge("ichor_kubelet_serving_certificates_audited", map[string]string{"status": "current"}, 1)
	})
}

// A decision that fails (here the error a rule parsing NotAfter 9999 gave)
// is no verdict: the machine's condition, True before, becomes Unknown with
// reason AuditError and the error, the error gauge counts it, and the next
// decision that succeeds sets the verdict again.
func TestAuditErrorIsUnknownNotAStaleVerdict(t *testing.T) {
	f := newFixture(t)
	f.machine("errs-1", "10.42.2.2", harness.KubeletOptions{})
	f.condition("errs-1", metav1.ConditionTrue, "CertificateCurrent")

	key := f.ns + "/errs-1"
	auditAnswers.Set(key, func() (engine.AuditDecision, error) {
		return engine.AuditDecision{}, errors.New("evaluate ichor/kubelet_serving/audit: time.parse_rfc3339_ns: time outside of valid range")
	})
	t.Cleanup(func() { auditAnswers.Set(key, nil) })
	c := f.condition("errs-1", metav1.ConditionUnknown, ichorv1alpha1.ReasonAuditError)
	require.Equal(t, "the audit of the kubelet serving certificate gave no decision: "+
		"evaluate ichor/kubelet_serving/audit: time.parse_rfc3339_ns: time outside of valid range", c.Message)
	f.gauge("ichor_kubelet_serving_certificates_audited", map[string]string{"status": "error"}, 1)
	f.gauge("ichor_kubelet_serving_certificates_audited", map[string]string{"status": "current"}, 0)

	// An error of any length is cut to what a condition takes.
	auditAnswers.Set(key, func() (engine.AuditDecision, error) {
		return engine.AuditDecision{}, errors.New(strings.Repeat("e", 100_000))
	})
	c = f.conditionWith("errs-1", func(c metav1.Condition) bool { return strings.Contains(c.Message, "eeee") })
	require.Equal(t, ichorv1alpha1.ReasonAuditError, c.Reason)
	require.LessOrEqual(t, len(c.Message), engine.MaxConditionMessage)

	auditAnswers.Set(key, nil)
	f.condition("errs-1", metav1.ConditionTrue, "CertificateCurrent")
	f.gauge("ichor_kubelet_serving_certificates_audited", map[string]string{"status": "error"}, 0)
}

// A cluster that cannot be audited at all (its secrets bundle gone) says so
// on every machine, Unknown with AuditError, and counts them as errors; a
// cluster that is deleted takes its gauges with it, so that no alert fires
// for what is no longer audited.
func TestAnUnauditableClusterAndADeletedOne(t *testing.T) {
	f := newFixture(t)
	f.machine("blind-1", "10.42.3.2", harness.KubeletOptions{})
	f.condition("blind-1", metav1.ConditionTrue, "CertificateCurrent")

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "talos-secrets"}}
	require.NoError(t, env.Client.Delete(t.Context(), secret))
	c := f.condition("blind-1", metav1.ConditionUnknown, ichorv1alpha1.ReasonAuditError)
	require.Contains(t, c.Message, "talos-secrets")
	f.gauge("ichor_kubelet_serving_certificates_audited", map[string]string{"status": "error"}, 1)

	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "demo"}}
	require.NoError(t, env.Client.Delete(t.Context(), cluster))
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		families, err := metricsRegistry.Gather()
		if err != nil {
			return false, err
		}
		for _, fam := range families {
			for _, m := range fam.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "namespace" && l.GetValue() == f.ns {
						return false, nil
					}
				}
			}
		}
		return true, nil
	})
	require.NoError(t, err, "the deleted cluster's gauges are still served")
}

// The review of 2026-12-06: a tenant that updates its own TalosMachine in a
// loop had the audit's condition write conflict at every try, which failed
// the whole pass, so the audit's last success, which every cluster's alert
// reads, never advanced again. The conflict is now that cluster's failure
// only: passes that meet it still succeed.
func TestATenantsConflictingWritesDoNotStopTheAuditsSuccess(t *testing.T) {
	f := newFixture(t)
	f.machine("busy-1", "10.42.5.2", harness.KubeletOptions{})
	f.condition("busy-1", metav1.ConditionTrue, "CertificateCurrent")

	// Another answer, so that the condition must be written again.
	key := f.ns + "/busy-1"
	auditAnswers.Set(key, func() (engine.AuditDecision, error) {
		return engine.AuditDecision{}, errors.New("a new answer to write")
	})
	t.Cleanup(func() { auditAnswers.Set(key, nil) })
	conflictsIn.Store(f.ns, true)
	t.Cleanup(func() { conflictsIn.Delete(f.ns) })
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		return conflicts.Load() > 0, nil
	}), "the machine's condition was never written")
	first := time.Now()
	// A pass that started after the first conflict, and met one too,
	// succeeded.
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		return lastSucceeded(t) > float64(first.UnixNano())/1e9, nil
	}), "no pass succeeded while one cluster's writes conflicted")

	// The same for a verdict's write (a drifted certificate), not an
	// error's.
	auditAnswers.Set(key, func() (engine.AuditDecision, error) {
		return engine.AuditDecision{Status: engine.AuditDrifted, Reasons: engine.Reasons{{Code: "IPNotNode", Message: "a verdict to write"}},
			Node: "busy-1", DecisionID: "d-busy", Revision: "r"}, nil
	})
	met := conflicts.Load()
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		return conflicts.Load() > met, nil
	}), "the drifted verdict was never written")
	second := time.Now()
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		return lastSucceeded(t) > float64(second.UnixNano())/1e9, nil
	}), "no pass succeeded while one cluster's verdict writes conflicted")
	require.Equal(t, metav1.ConditionTrue, f.condition("busy-1", metav1.ConditionTrue, "CertificateCurrent").Status, "the conflicting write changed the condition")
}

// During a Kubernetes CA rotation (a new CA in the secrets bundle, the
// bundle before it kept beside it) a certificate the previous CA signed is
// still the cluster's: current, as the approver records it. Before, the
// audit verified against the new CA alone, and said every machine of the
// cluster drifted while the rotation lasted (review 197C F2).
func TestACertificateOfThePreviousCAIsCurrentDuringARotation(t *testing.T) {
	f := newFixture(t)
	f.machine("rotating-1", "10.42.6.2", harness.KubeletOptions{})
	f.condition("rotating-1", metav1.ConditionTrue, "CertificateCurrent")

	rotated, err := clustersecrets.Parse(env.SecretsBundleYAML)
	require.NoError(t, err)
	other, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), config.TalosVersionCurrent)
	require.NoError(t, err)
	rotated.Certs.K8s = other.Certs.K8s
	data, err := clustersecrets.Marshal(rotated)
	require.NoError(t, err)
	var secret corev1.Secret
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: "talos-secrets"}, &secret))
	secret.Data[clustersecrets.PreviousKey] = secret.Data[ichorv1alpha1.DefaultSecretsBundleKey]
	secret.Data[ichorv1alpha1.DefaultSecretsBundleKey] = data
	require.NoError(t, env.Client.Update(t.Context(), &secret))
	rotatedAt := float64(time.Now().UnixNano()) / 1e9

	// A pass begun after the rotation has judged the machine.
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		return lastSucceeded(t) > rotatedAt, nil
	}))
	c := f.condition("rotating-1", metav1.ConditionTrue, "CertificateCurrent")
	require.Contains(t, c.Message, "was issued by the cluster's CA")

	// The rotation over (the previous bundle gone), it is not the
	// cluster's any more.
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: "talos-secrets"}, &secret))
	delete(secret.Data, clustersecrets.PreviousKey)
	require.NoError(t, env.Client.Update(t.Context(), &secret))
	f.condition("rotating-1", metav1.ConditionFalse, "CertificateNotIssuedByClusterCA")
}

// A drifted certificate whose node cannot be read either (its Talos API
// down) is named by its drift: the condition's reason and the Event say
// CertificateNotIssuedByClusterCA, whether the node answers or not. Before,
// the reasons were sorted by code, CertificateNodeUnreadable came first, the
// False condition was named by what could not be judged, and a node that
// answered every other pass had a Warning Event written at each (review
// 197C F3).
func TestADriftIsNamedByTheDriftWhenTheNodeCannotBeRead(t *testing.T) {
	f := newFixture(t)
	node, kubelet := f.machine("drift-down-1", "10.42.7.2", harness.KubeletOptions{})
	// A node that cannot be read is reached at its endpoint's host: a name
	// of this test's own, so that no other test's silent node reaches this
	// kubelet.
	var m ichorv1alpha1.TalosMachine
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: "drift-down-1"}, &m))
	_, port, err := net.SplitHostPort(m.Spec.Endpoint)
	require.NoError(t, err)
	m.Spec.Endpoint = net.JoinHostPort("localhost", port)
	require.NoError(t, env.Client.Update(t.Context(), &m))
	hosts.Map("localhost:10250", kubelet.ServingAddress())
	f.condition("drift-down-1", metav1.ConditionTrue, "CertificateCurrent")
	kubelet.ServeInstead(selfSigned(t, "drift-down-1", "10.42.7.2"))
	f.condition("drift-down-1", metav1.ConditionFalse, "CertificateNotIssuedByClusterCA")
	f.event("drift-down-1", "CertificateNotIssuedByClusterCA")

	for _, down := range []bool{true, false, true} {
		node.SetUnavailable(down)
		changed := float64(time.Now().UnixNano()) / 1e9
		require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
			return lastSucceeded(t) > changed, nil
		}))
		c := f.condition("drift-down-1", metav1.ConditionFalse, "CertificateNotIssuedByClusterCA")
		if down {
			require.Contains(t, c.Message, "could not be read from the Talos API", "the node's read did not fail")
		}
	}
	node.SetUnavailable(false)

	var events eventsv1.EventList
	require.NoError(t, env.Client.List(t.Context(), &events, client.InNamespace(f.ns)))
	var reasons []string
	for _, e := range events.Items {
		if e.Regarding.Name == "drift-down-1" && e.Type == corev1.EventTypeWarning {
			reasons = append(reasons, e.Reason)
		}
	}
	require.Equal(t, []string{"CertificateNotIssuedByClusterCA"}, reasons, "one Warning Event, named by the drift")
}

// lastSucceeded is the audit's last success, in seconds since the epoch.
func lastSucceeded(t *testing.T) float64 {
	t.Helper()
	families, err := metricsRegistry.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() == "ichor_kubelet_serving_audit_last_success_timestamp_seconds" && len(fam.GetMetric()) == 1 {
			return fam.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// A kubelet serving a certificate whose issuer DN is 100 KB (its CA's
// subject): the condition, the Event and the decision-log entry stay
// bounded, the issuer cut where it was read and again by the log's mask.
func TestHugeIssuerStaysBounded(t *testing.T) {
	f := newFixture(t)
	_, kubelet := f.machine("huge-1", "10.42.3.2", harness.KubeletOptions{})
	f.condition("huge-1", metav1.ConditionTrue, "CertificateCurrent")
	kubelet.ServeInstead(issuedBy(t, strings.Repeat("x", 100_000), "huge-1", "10.42.3.2"))

	c := f.condition("huge-1", metav1.ConditionFalse, "CertificateNotIssuedByClusterCA")
	require.Contains(t, c.Message, "bytes more)")
	require.Less(t, len(c.Message), 4*servingcert.MaxText, "the issuer and the verifier's error, each cut to MaxText")
	f.event("huge-1", "CertificateNotIssuedByClusterCA")

	entry := harness.FindDecision[map[string]any](t, decisionLog, decisionID(t, c.Message))
	input := entry["input"].(map[string]any)
	cert := input["certificate"].(map[string]any)
	require.LessOrEqual(t, len(cert["issuer"].(string)), 600, "cut by the mask to its max_logged_value_length")
	require.LessOrEqual(t, len(cert["verify_error"].(string)), 600)
	require.Contains(t, input["log_truncated"], "certificate.issuer")
	data, err := json.Marshal(entry)
	require.NoError(t, err)
	require.Less(t, len(data), 16_000, "the whole entry")
}

// conditionWith waits for the machine's audit condition to satisfy ok.
func (f *fixture) conditionWith(name string, ok func(metav1.Condition) bool) metav1.Condition {
	f.t.Helper()
	var got metav1.Condition
	err := wait.PollUntilContextTimeout(f.t.Context(), 100*time.Millisecond, waitFor, true, func(ctx context.Context) (bool, error) {
		var m ichorv1alpha1.TalosMachine
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, &m); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(m.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificateCurrent)
		if c == nil {
			return false, nil
		}
		got = *c
		return ok(got), nil
	})
	require.NoError(f.t, err, "machine %s: have %+v", name, got)
	return got
}

func decisionID(t *testing.T, message string) string {
	t.Helper()
	_, rest, ok := strings.Cut(message, "(decision ")
	require.True(t, ok, message)
	id, _, ok := strings.Cut(rest, ",")
	require.True(t, ok, message)
	return id
}

// event waits for a Warning Event with reason on the machine.
func (f *fixture) event(machine, reason string) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(f.t.Context(), 100*time.Millisecond, waitFor, true, func(ctx context.Context) (bool, error) {
		var events eventsv1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Regarding.Name == machine && e.Reason == reason && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, nil
	})
	require.NoError(f.t, err, "no %s Event on %s", reason, machine)
}

// gauge waits for the gauge of this test's cluster with labels to be want.
func (f *fixture) gauge(name string, labels map[string]string, want float64) {
	f.t.Helper()
	var got float64
	err := wait.PollUntilContextTimeout(f.t.Context(), 100*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		families, err := metricsRegistry.Gather()
		if err != nil {
			return false, err
		}
		for _, fam := range families {
			if fam.GetName() != name {
				continue
			}
			for _, m := range fam.GetMetric() {
				have := map[string]string{}
				for _, l := range m.GetLabel() {
					have[l.GetName()] = l.GetValue()
				}
				if have["namespace"] != f.ns || !matches(have, labels) {
					continue
				}
				got = m.GetGauge().GetValue()
				return got == want, nil
			}
		}
		return false, nil
	})
	require.NoError(f.t, err, "%s%v: want %v, have %v", name, labels, want, got)
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// selfSigned is a serving certificate with the node's own subject and names
// that no cluster CA issued: only its issuer is wrong.
func selfSigned(t *testing.T, node, ip string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:     []string{node},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:        true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// issuedBy is a serving certificate with the node's own subject, names and
// usage, issued by a CA (not the cluster's) whose common name is caName.
func issuedBy(t *testing.T, caName, node, ip string) *tls.Certificate {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(43),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:     []string{node},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
