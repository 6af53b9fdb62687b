package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// The identities of the admission benchmark.
const (
	webhookUser   = "ichor-bench:webhook"
	requesterUser = "ichor-bench:alice"
	requesterRole = "ichor-bench:talosconfig-reader"
	admissionWarm = 20
)

// AdmissionResult is the latency of TalosCredentialRequest admission.
type AdmissionResult struct {
	N int
	// Handle is the webhook's own time per request, as the API server waits
	// for it: decode, requirements decision, SubjectAccessReview, TalosCluster
	// read, admission decision, Event written. Create is the requester's
	// whole create, the API server's admission chain and storage included.
	Handle, Create []time.Duration
	// Events is the issuance Events found on the TalosCluster afterwards.
	Events int
	// Decisions is the policy decisions per request (requirements and
	// admission) and DecisionTime their time per request, from the engine's
	// own metrics: the rest of Handle is the API calls (the
	// SubjectAccessReview, the TalosCluster read, the Event).
	Decisions    float64
	DecisionTime time.Duration
	// ShippedN requests went through `ichor manager` as shipped (its own
	// webhook server, its own client) one at a time, with ShippedCreate the
	// requester's create; zero when not measured.
	ShippedN      int
	ShippedCreate []time.Duration
	// ShippedCPU is the manager's CPU (user and system) over those
	// requests, its issuer's signing and writes included; ShippedProfile
	// its CPU profile over them.
	ShippedCPU     time.Duration
	ShippedProfile string
	// ShippedSettled is how long the manager took after its start to be
	// quiet (under quietShare of a CPU), which the requests waited for;
	// ShippedNotQuiet, when it never was within quietTimeout, how busy it
	// still was: its other work is then in ShippedCPU too.
	ShippedSettled  time.Duration
	ShippedNotQuiet string
}

// The manager as shipped is quiet, and its admissions measured, once it
// spends less than a twentieth of a CPU over a second: what a started
// manager does with no request (its Talos watches made anew every few
// minutes) costs far less.
const (
	quietShare   = 0.05
	quietWindow  = time.Second
	quietTimeout = 2 * time.Minute
)

// requester is the person creating TalosCredentialRequests.
type requester struct {
	client client.Client
	key    string
}

func newRequester(f *Fleet) (*requester, error) {
	cfg, err := f.Env.UserConfig(requesterUser, "ichor-bench:operators")
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: f.Env.Scheme})
	if err != nil {
		return nil, err
	}
	// Its requests record who asks, as `ichor cluster` does.
	if c, err = webhooktest.Requesting(context.Background(), c); err != nil {
		return nil, err
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return &requester{client: c, key: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))}, nil
}

// create makes the request named name and returns how long the create took.
func (r *requester) create(ctx context.Context, name string) (time.Duration, error) {
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec:       ichorv1alpha1.TalosCredentialRequestSpec{ClusterName: ClusterName, Purpose: ichorv1alpha1.PurposeTalosconfigReader, PublicKey: r.key},
	}
	start := time.Now()
	err := r.client.Create(ctx, tcr)
	return time.Since(start), err
}

// warmUp waits for the first request to be admitted (RBAC takes a moment
// to see new bindings, a webhook server to start), then makes a few more,
// uncounted: connections, the engine's first evaluations.
func (r *requester) warmUp(ctx context.Context, prefix string) error {
	if err := waitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		_, err := r.create(ctx, prefix+"-first")
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("the first TalosCredentialRequest was never admitted: %w", err)
	}
	for i := range admissionWarm {
		if _, err := r.create(ctx, fmt.Sprintf("%s-%02d", prefix, i)); err != nil {
			return fmt.Errorf("warm-up request: %w", err)
		}
	}
	return nil
}

// timedHandler records how long the validator takes per request.
type timedHandler struct {
	next admission.Handler
	mu   sync.Mutex
	took []time.Duration
}

func (h *timedHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp := h.next.Handle(ctx, req)
	d := time.Since(start)
	h.mu.Lock()
	h.took = append(h.took, d)
	h.mu.Unlock()
	return resp
}

func (h *timedHandler) reset() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.took
	h.took = nil
	return out
}

// RunAdmission serves the credential webhook (webhook.CredentialRequestValidator,
// installed with deploy/webhook's configuration through webhooktest) in this
// process, as a user with exactly the rights of its RBAC markers, and has a
// person create n TalosCredentialRequests for a talosconfig-reader, one at a
// time, each admitted with its SubjectAccessReview and its Event.
func RunAdmission(ctx context.Context, f *Fleet, n int, log io.Writer) (res AdmissionResult, err error) {
	env := f.Env
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := bindAdmissionRoles(ctx, f); err != nil {
		return res, err
	}
	dir := filepath.Join(filepath.Dir(env.WorkDir), "admission")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	decisions, err := os.Create(filepath.Join(dir, "decisions.log"))
	if err != nil {
		return res, err
	}
	defer decisions.Close()
	registry := prometheus.NewRegistry()
	metrics, err := engine.NewMetrics(registry)
	if err != nil {
		return res, err
	}
	eng, err := engine.New(ctx, engine.Options{DecisionLog: decisions, Log: io.Discard, ID: "bench-webhook", Metrics: metrics})
	if err != nil {
		return res, err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	if err := f.InstallWebhook(); err != nil {
		return res, err
	}
	webhookLog, err := os.Create(filepath.Join(dir, "webhook.log"))
	if err != nil {
		return res, err
	}
	defer webhookLog.Close()
	ctrl.SetLogger(zap.New(zap.WriteTo(webhookLog), zap.JSONEncoder()))
	cfg, err := env.UserConfig(webhookUser)
	if err != nil {
		return res, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          crwebhook.NewServer(webhooktest.ServerOptions(f.Webhook)),
	})
	if err != nil {
		return res, err
	}
	h := &timedHandler{next: &webhook.CredentialRequestValidator{
		Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Engine: eng, Instance: "bench",
		Keys: env.AdmissionKeys(env.Client),
	}}
	mgr.GetWebhookServer().Register(webhook.Path, &crwebhook.Admission{Handler: h})
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(ctx) }()
	defer func() { cancel(); <-mgrDone }() //nolint:errcheck // the manager was cancelled; only its end matters
	started := mgr.GetWebhookServer().StartedChecker()
	if err := waitFor(ctx, 30*time.Second, func(context.Context) (bool, error) {
		select {
		case err := <-mgrDone:
			mgrDone <- err
			return false, fmt.Errorf("webhook manager stopped: %w", err)
		default:
		}
		return started(nil) == nil, nil
	}); err != nil {
		return res, fmt.Errorf("webhook server: %w", err)
	}

	person, err := newRequester(f)
	if err != nil {
		return res, err
	}
	if err := person.warmUp(ctx, "alice-warm"); err != nil {
		return res, err
	}
	h.reset()
	res.N = n
	count0, sum0 := histogram(registry, "ichor_policy_decision_duration_seconds")
	start := time.Now()
	for i := range n {
		d, err := person.create(ctx, requestName(i))
		if err != nil {
			return res, fmt.Errorf("TalosCredentialRequest %d: %w", i, err)
		}
		res.Create = append(res.Create, d)
	}
	res.Handle = h.reset()
	count1, sum1 := histogram(registry, "ichor_policy_decision_duration_seconds")
	res.Decisions = (count1 - count0) / float64(n)
	res.DecisionTime = time.Duration((sum1 - sum0) / float64(n) * float64(time.Second))
	slices.Sort(res.Create)
	slices.Sort(res.Handle)
	var events corev1.EventList
	if err := env.Client.List(ctx, &events, client.InNamespace(Namespace)); err != nil {
		return res, err
	}
	measured := map[string]bool{}
	for i := range n {
		measured[requestName(i)] = true
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "TalosCluster" && e.Source.Component == webhook.EventSource &&
			e.Annotations[credential.AnnotationDecisionID] != "" && measured[e.Annotations[credential.AnnotationRequest]] {
			res.Events++
		}
	}
	fmt.Fprintf(log, "   %d admitted in %s: webhook p50 %s p99 %s; create p50 %s p99 %s; %d issuance Events\n",
		n, since(start), quantile(res.Handle, 0.5).Round(10*time.Microsecond), quantile(res.Handle, 0.99).Round(10*time.Microsecond),
		quantile(res.Create, 0.5).Round(10*time.Microsecond), quantile(res.Create, 0.99).Round(10*time.Microsecond), res.Events)
	return res, nil
}

// histogram is the sample count and sum of a histogram, over its labels.
func histogram(g prometheus.Gatherer, name string) (count, sum float64) {
	families, err := g.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			count += float64(m.GetHistogram().GetSampleCount())
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

// requestName is the name of measured request i.
func requestName(i int) string {
	return fmt.Sprintf("alice-%05d", i)
}

// RunAdmissionShipped has the person create n more requests, one at a
// time, through `ichor manager` as shipped, serving the webhook where the
// fleet's configuration points. The requests of RunAdmission are deleted
// first, so the manager's issuer has nothing to catch up on.
func RunAdmissionShipped(ctx context.Context, f *Fleet, n int, ro RunOptions, res *AdmissionResult) (err error) {
	if err := deleteCredentialRequests(ctx, f); err != nil {
		return err
	}
	v := Variant{Name: "ichor-shipped-admission", Mode: "cli", Ichor: true}
	if err := f.InstallWebhook(); err != nil {
		return err
	}
	flags, cliArgs := v.Args(ro.Kubeconfig, f, []types.NamespacedName{MainCluster})
	ctl, err := StartController(ro.Manager, ro.Dir, v.Name, flags, cliArgs)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := ctl.Stop(); stopErr != nil && err == nil && ctx.Err() == nil {
			err = fmt.Errorf("%s: %w\n%s", v.Name, stopErr, tail(ctl.LogPath, 20))
		}
	}()
	if err := ctl.WaitReady(ctx); err != nil {
		return err
	}
	// A started manager first fills its caches and, on a control plane
	// that holds joining machines, makes their identity watches, a TLS
	// handshake each: the admissions wait for it.
	settled, quietErr := ctl.WaitQuiet(ctx, quietWindow, quietShare, quietTimeout)
	if quietErr != nil && ctx.Err() != nil {
		return quietErr
	}
	res.ShippedSettled = settled
	if quietErr != nil {
		res.ShippedNotQuiet = quietErr.Error()
	}
	fmt.Fprintf(ro.Log, "   %s: quiet %s after its start%s\n", v.Name, res.ShippedSettled.Round(100*time.Millisecond), notQuiet(res.ShippedNotQuiet))
	person, err := newRequester(f)
	if err != nil {
		return err
	}
	if err := person.warmUp(ctx, "shipped-warm"); err != nil {
		return fmt.Errorf("%w\n%s", err, tail(ctl.LogPath, 20))
	}
	before, err := ctl.Stats(ctx)
	if err != nil {
		return err
	}
	profile := filepath.Join(ro.Dir, v.Name+".cpu.pprof")
	if err := ctl.StartProfile(ctx, profile); err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		d, err := person.create(ctx, fmt.Sprintf("shipped-%05d", i))
		if err != nil {
			return fmt.Errorf("TalosCredentialRequest %d through ichor manager: %w", i, err)
		}
		res.ShippedCreate = append(res.ShippedCreate, d)
	}
	// The last request's issuance runs after its create returns: wait
	// for every answer, so the CPU and the profile hold each request's
	// whole cost.
	if err := waitAnswered(ctx, f, "shipped-", n); err != nil {
		return err
	}
	if err := ctl.StopProfile(ctx); err != nil {
		return err
	}
	after, err := ctl.Stats(ctx)
	if err != nil {
		return err
	}
	res.ShippedN, res.ShippedCPU, res.ShippedProfile = n, after.CPU-before.CPU, profile
	slices.Sort(res.ShippedCreate)
	fmt.Fprintf(ro.Log, "   %d admitted by ichor manager as shipped in %s: create p50 %s p99 %s; manager CPU %s per request\n",
		n, since(start), quantile(res.ShippedCreate, 0.5).Round(10*time.Microsecond), quantile(res.ShippedCreate, 0.99).Round(10*time.Microsecond),
		(res.ShippedCPU / time.Duration(n)).Round(10*time.Microsecond))
	return nil
}

// deleteCredentialRequests deletes the fleet's TalosCredentialRequests.
func deleteCredentialRequests(ctx context.Context, f *Fleet) error {
	if err := f.Env.Client.DeleteAllOf(ctx, &ichorv1alpha1.TalosCredentialRequest{}, client.InNamespace(Namespace)); err != nil {
		return fmt.Errorf("delete TalosCredentialRequests: %w", err)
	}
	return nil
}

func notQuiet(why string) string {
	if why == "" {
		return ""
	}
	return " (" + why + ")"
}

// bindAdmissionRoles gives the webhook exactly the rights of its RBAC
// markers, and the person the right to create requests and to download a
// talosconfig-reader of any cluster.
func bindAdmissionRoles(ctx context.Context, f *Fleet) error {
	c := f.Env.Client
	rules, err := webhooktest.MarkerRules("webhook")
	if err != nil {
		return err
	}
	roles := map[string][]rbacv1.PolicyRule{
		webhookUser: rules,
		requesterRole: {
			{APIGroups: []string{ichorv1alpha1.GroupVersion.Group}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get", "list"}},
			{APIGroups: []string{ichorv1alpha1.GroupVersion.Group}, Resources: []string{"talosclusters/talosconfig-reader"}, Verbs: []string{"download"}},
		},
	}
	subjects := map[string]string{webhookUser: webhookUser, requesterRole: requesterUser}
	for name, rules := range roles {
		if err := c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}); err != nil {
			return fmt.Errorf("ClusterRole %s: %w", name, err)
		}
		if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: subjects[name]}},
		}); err != nil {
			return fmt.Errorf("ClusterRoleBinding %s: %w", name, err)
		}
	}
	return waitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: webhookUser,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verb: "create",
			},
		}}
		if err := c.Create(ctx, sar); err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	})
}

// waitAnswered waits until the n requests named prefix... each carry the
// issuer's answer (a Ready condition, true or false), for at most a minute.
func waitAnswered(ctx context.Context, f *Fleet, prefix string, n int) error {
	answered := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var list ichorv1alpha1.TalosCredentialRequestList
		if err := f.Env.Client.List(ctx, &list, client.InNamespace(Namespace)); err != nil {
			return false, err
		}
		answered = 0
		for i := range list.Items {
			tcr := &list.Items[i]
			if strings.HasPrefix(tcr.Name, prefix) && meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady) != nil {
				answered++
			}
		}
		return answered >= n, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the issuer to answer %d requests (%d answered): %w", n, answered, err)
	}
	return nil
}
