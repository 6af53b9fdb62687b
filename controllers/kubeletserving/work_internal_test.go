package kubeletserving

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval/approvaltest"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// decider is a Decider whose verdicts a test chooses: decide answers for
// each request (by name), and every call is counted.
type decider struct {
	mu sync.Mutex
	// revision is the bundle revision the decider says is active.
	revision string
	decide   func(ctx context.Context, name string) (engine.CSRDecision, error)
	decided  []string
	// running counts the decisions running now, by requester; most is the
	// most of one requester's that ever ran at once.
	running map[string]int
	most    int
	// rejections counts the flood rule's evaluations.
	rejections int
}

func (d *decider) KubeletServing(ctx context.Context, in csrinput.KubeletServing) (engine.CSRDecision, error) {
	name, user := in.CSR.Name, in.CSR.Username
	d.mu.Lock()
	d.decided = append(d.decided, name)
	if d.running == nil {
		d.running = map[string]int{}
	}
	d.running[user]++
	d.most = max(d.most, d.running[user])
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.running[user]--
		d.mu.Unlock()
	}()
	if d.decide != nil {
		return d.decide(ctx, name)
	}
	return approve(), nil
}

func (d *decider) KubeletServingRejection(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error) {
	d.mu.Lock()
	d.rejections++
	d.mu.Unlock()
	return engine.CSRDecision{}, engine.ErrNoDecision
}

func (*decider) KubeletServingLimits(context.Context) (engine.KubeletServingLimits, error) {
	return engine.KubeletServingLimits{MaxUndecidedPerRequester: 10, NodeUserPrefix: "system:node:"}, nil
}

func (*decider) Kubeconfig(context.Context, engine.KubeconfigInput) (engine.KubeconfigDecision, error) {
	return engine.KubeconfigDecision{}, nil
}

func (*decider) RecordApplied(context.Context, engine.Applied) error { return nil }

func (d *decider) Revision() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.revision
}

func (d *decider) calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.decided)
}

func approve() engine.CSRDecision {
	return engine.CSRDecision{Action: engine.ActionApprove, Reasons: engine.Reasons{{Code: "Test", Message: "test"}}, DecisionID: "00000000-0000-0000-0000-000000000000"}
}

func pendingAs(code string) engine.CSRDecision {
	return engine.CSRDecision{Action: engine.ActionPending, Reasons: engine.Reasons{{Code: code, Message: "test"}}, DecisionID: "00000000-0000-0000-0000-000000000001"}
}

// queueFixture is a replica deciding the requests of cluster ns/demo (no
// machine: the requests name no node), with the decision queue and workers
// and none of the manager.
type queueFixture struct {
	r       *Reconciler
	dec     *decider
	cluster types.NamespacedName
	csrs    *k8sfake.Clientset
}

func newQueueFixture(t *testing.T, clk clock.WithTicker, csrs ...certificatesv1.CertificateSigningRequest) *queueFixture {
	t.Helper()
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo", UID: "uid-demo"}}
	c.Spec.Security.KubeletServingCertificates.Enabled = true
	objs := []client.Object{c}
	typed := make([]certificatesv1.CertificateSigningRequest, len(csrs))
	for i := range csrs {
		csrs[i].UID = types.UID("uid-" + csrs[i].Name)
		typed[i] = csrs[i]
		objs = append(objs, &csrs[i])
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&ichorv1alpha1.TalosMachine{}, &ichorv1alpha1.TalosCluster{})
	require.NoError(t, AddIndexes(context.Background(), indexerOf{b}))
	cs := k8sfake.NewClientset()
	for i := range typed {
		_, err := cs.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &typed[i], metav1.CreateOptions{})
		require.NoError(t, err)
	}
	local := &cluster.Local{}
	local.Add(client.ObjectKeyFromObject(c))
	dec := &decider{}
	r := &Reconciler{
		Client: b.Build(), Clientset: cs, Engine: dec, NodeReaders: &NodeReaders{}, LocalClusters: local,
		Clock: clk, queue: newQueue(clk),
	}
	return &queueFixture{r: r, dec: dec, cluster: client.ObjectKeyFromObject(c), csrs: cs}
}

// writing makes the fixture's writes go to a server that answers each at
// once, and counts in metrics of its own.
func (f *queueFixture) writing(t *testing.T) (*approvaltest.Held, *Metrics) {
	t.Helper()
	held := approvaltest.NewHeld()
	held.Answer()
	f.r.Clientset = held.Clientset(t)
	metrics, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	f.r.Metrics = metrics
	return held, metrics
}

// turnOf begins a turn of the fixture's cluster, and lists the requester's
// requests: one.
func (f *queueFixture) turnOf(t *testing.T, username string) (*pass, []certificatesv1.CertificateSigningRequest) {
	t.Helper()
	p, ok, err := f.r.passFor(context.Background(), f.cluster)
	require.NoError(t, err)
	require.True(t, ok)
	list, err := p.requestsOf(context.Background(), username)
	require.NoError(t, err)
	require.Len(t, list, 1)
	return p, list
}

// judgeRemotely makes the fixture's cluster one whose kubeconfigRef (Secret
// "kc") holds kubeconfig, judged through tg, as a reconcile leaves it once
// the rule gave d on that content. It returns the Secret.
func (f *queueFixture) judgeRemotely(t *testing.T, kubeconfig string, tg *target, d engine.KubeconfigDecision) *corev1.Secret {
	t.Helper()
	ctx := context.Background()
	f.r.APIReader = f.r.Client
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "kc", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: f.cluster.Name}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(kubeconfig)},
	}
	require.NoError(t, f.r.Client.Create(ctx, secret))
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	c.Spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "kc"}
	require.NoError(t, f.r.Client.Update(ctx, &c))
	tg.kubeconfig = []byte(kubeconfig)
	f.r.targets.remote = map[types.NamespacedName]*target{f.cluster: tg}
	f.r.targets.verdicts = map[types.NamespacedName]*verdict{f.cluster: {
		sum: sha256.Sum256([]byte(kubeconfig)), document: d, final: &d,
	}}
	return secret
}

// start runs n workers until the test ends, and waits for them then.
func (f *queueFixture) start(t *testing.T, n int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = workers{r: f.r, n: n}.Start(ctx)
	}()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the workers did not stop with the manager")
		}
	}
	t.Cleanup(stop)
	return stop
}

func (f *queueFixture) add(username string) {
	f.r.enqueue(requester{cluster: f.cluster, username: username})
}

// approved reports whether the request was approved in the API server.
func (f *queueFixture) approved(t *testing.T, name string) bool {
	t.Helper()
	csr, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved {
			return true
		}
	}
	return false
}

// A requester whose decision hangs (a node that does not answer) holds one
// worker: the other requesters' requests are decided meanwhile.
func TestAHangingRequesterDoesNotHoldUpTheOthers(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{},
		csrOf("system:node:hang", "csr-hang", t0),
		csrOf("system:node:a", "csr-a", t0), csrOf("system:node:b", "csr-b", t0))
	release := make(chan struct{})
	f.dec.decide = func(ctx context.Context, name string) (engine.CSRDecision, error) {
		if name == "csr-hang" {
			select {
			case <-release:
			case <-ctx.Done():
				return engine.CSRDecision{}, ctx.Err()
			}
		}
		return approve(), nil
	}
	f.start(t, 2)
	f.add("system:node:hang")
	require.Eventually(t, func() bool { return slices.Contains(f.dec.calls(), "csr-hang") }, 5*time.Second, 5*time.Millisecond)
	f.add("system:node:a")
	f.add("system:node:b")
	require.Eventually(t, func() bool { return f.approved(t, "csr-a") && f.approved(t, "csr-b") }, 5*time.Second, 5*time.Millisecond,
		"the hanging requester held up the others")
	assert.False(t, f.approved(t, "csr-hang"))
	close(release)
	require.Eventually(t, func() bool { return f.approved(t, "csr-hang") }, 5*time.Second, 5*time.Millisecond)
}

// One requester's requests are decided one at a time, oldest first,
// however many workers are idle and however often the requester is queued:
// the order the flood guard counts them in.
func TestARequestersRequestsAreDecidedOneAtATimeOldestFirst(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var csrs []certificatesv1.CertificateSigningRequest
	for i, name := range []string{"csr-d", "csr-c", "csr-b", "csr-a"} {
		// Created newest first, as a cache may list them.
		csrs = append(csrs, csrOf("system:node:flood", name, t0.Add(time.Duration(3-i)*time.Second)))
	}
	csrs = append(csrs, csrOf("system:node:flood", "csr-0", t0.Add(3*time.Second))) // a tie: the name orders it
	f := newQueueFixture(t, clock.RealClock{}, csrs...)
	f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) {
		time.Sleep(5 * time.Millisecond)
		return approve(), nil
	}
	f.start(t, 4)
	for range 10 {
		f.add("system:node:flood")
	}
	require.Eventually(t, func() bool { return len(f.dec.calls()) >= 5 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{"csr-a", "csr-b", "csr-c", "csr-0", "csr-d"}, f.dec.calls()[:5])
	f.dec.mu.Lock()
	defer f.dec.mu.Unlock()
	assert.Equal(t, 1, f.dec.most, "a requester's requests were decided at once")
}

// A wake-up a decision asks for (a node that could not be read is read
// again in three seconds) comes then, not before, and no timer of its own
// is left behind: the queue's delay is the timer.
func TestAWakeUpAskedForComesThen(t *testing.T) {
	clk := &timersOf{FakeClock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0))}
	f := newQueueFixture(t, clk, csrOf("system:node:dark", "csr-dark", clk.Now()))
	f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) {
		return pendingAs(codeNodeUnreadable), nil
	}
	f.start(t, 1)
	f.add("system:node:dark")
	// The queue's delay loop sets a timer for the wake-up: the clock must
	// not move before then (its due time is fixed when it is asked for).
	require.Eventually(t, func() bool { return slices.Contains(clk.set(), unreadableRecheck) }, 5*time.Second, 5*time.Millisecond,
		"no wake-up was asked for in %v", unreadableRecheck)
	require.Len(t, f.dec.calls(), 1)

	// A fake timer fires within Step, and the worker decides after it.
	clk.Step(unreadableRecheck - time.Millisecond)
	assert.Len(t, f.dec.calls(), 1, "decided again before its wait was over")
	clk.Step(time.Millisecond)
	require.Eventually(t, func() bool { return len(f.dec.calls()) == 2 }, 5*time.Second, 5*time.Millisecond, "the wake-up did not come")
}

// A request the rule gives no decision on (a bundle without the rule, or
// whose rule leaves it out) is not decided, and logged, again at every look
// (each resync, each event of its requester's), but at once under another
// bundle (and on a backoff, below); and it is not counted pending (the gauge
// ichor_kubelet_serving_pending_csrs and its alert): no rule keeps it
// pending.
func TestARequestTheRuleDoesNotGovernIsNotDecidedAgainAtEachLook(t *testing.T) {
	clk := &timersOf{FakeClock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0))}
	f := newQueueFixture(t, clk, csrOf("system:node:odd", "csr-odd", clk.Now()), csrOf("system:node:mark", "csr-mark", clk.Now()))
	f.dec.revision = "r1"
	f.dec.decide = func(_ context.Context, name string) (engine.CSRDecision, error) {
		if name == "csr-odd" {
			return engine.CSRDecision{}, engine.ErrNoDecision
		}
		return pendingAs("Marker"), nil
	}
	f.start(t, 1)
	decisionsOf := func(name string) int {
		n := 0
		for _, c := range f.dec.calls() {
			if c == name {
				n++
			}
		}
		return n
	}
	f.add("system:node:odd")
	require.Eventually(t, func() bool { return decisionsOf("csr-odd") == 1 }, 5*time.Second, 5*time.Millisecond)

	// Looked at three times more. Each time a marker request, changed so
	// that it is decided again, is queued after it: one worker takes the
	// queue in order, so the marker's decision says the look is over. The
	// clock stands still: no backoff is over.
	for i := range 3 {
		var mark certificatesv1.CertificateSigningRequest
		require.NoError(t, f.r.Client.Get(context.Background(), client.ObjectKey{Name: "csr-mark"}, &mark))
		mark.Labels = map[string]string{"round": fmt.Sprint(i)}
		require.NoError(t, f.r.Client.Update(context.Background(), &mark))
		f.add("system:node:odd")
		f.add("system:node:mark")
		require.Eventually(t, func() bool { return decisionsOf("csr-mark") == i+1 }, 5*time.Second, 5*time.Millisecond)
	}
	assert.Equal(t, 1, decisionsOf("csr-odd"), "a request the rule does not govern was decided again with nothing changed")

	odd, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr-odd", metav1.GetOptions{})
	require.NoError(t, err)
	pending, _ := f.r.leftPending(f.cluster, []certificatesv1.CertificateSigningRequest{*odd})
	assert.Zero(t, pending, "a request no rule governs was counted pending")

	// The clock has not moved, so no backoff is over: only the bundle.
	f.dec.mu.Lock()
	f.dec.revision = "r2"
	f.dec.mu.Unlock()
	f.add("system:node:odd")
	require.Eventually(t, func() bool { return decisionsOf("csr-odd") == 2 }, 5*time.Second, 5*time.Millisecond,
		"another bundle did not decide the request again")
}

// Its backoff over, a request the rule gives no decision on is asked again:
// the rule may leave it out on what the memo does not key on (the node's
// identity, the flood counts).
func TestARequestTheRuleDoesNotGovernIsAskedAgainAfterItsBackoff(t *testing.T) {
	clk := &timersOf{FakeClock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0))}
	f := newQueueFixture(t, clk, csrOf("system:node:odd", "csr-odd", clk.Now()))
	var asked atomic.Int32
	f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) {
		asked.Add(1)
		return engine.CSRDecision{}, engine.ErrNoDecision
	}
	f.start(t, 1)
	f.add("system:node:odd")
	require.Eventually(t, func() bool { return asked.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	// The queue's loop sets its timer once it has the request back; the
	// clock is moved until the timer it set has fired.
	require.Eventually(t, func() bool {
		if asked.Load() >= 2 {
			return true
		}
		clk.Step(minBackoff)
		return false
	}, 5*time.Second, 5*time.Millisecond, "the request was not asked again once its backoff was over")
}

// timersOf is a fake clock that remembers the duration of every timer set
// on it (the queue's heartbeat and metrics tickers are not timers).
type timersOf struct {
	*clocktesting.FakeClock
	mu     sync.Mutex
	timers []time.Duration
}

func (c *timersOf) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	c.timers = append(c.timers, d)
	c.mu.Unlock()
	return c.FakeClock.NewTimer(d)
}

func (c *timersOf) set() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.timers)
}

// When the manager stops, the workers stop, a decision that hangs included,
// and no goroutine of the approver's is left: no worker, and no timer of the
// queue's delays (a wake-up asked for was pending).
func TestNoWorkerOrTimerIsLeftAfterTheManagerStops(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:hang", "csr-hang", t0), csrOf("system:node:later", "csr-later", t0))
	f.dec.decide = func(ctx context.Context, name string) (engine.CSRDecision, error) {
		if name == "csr-later" {
			return pendingAs("Later"), nil
		}
		<-ctx.Done()
		return engine.CSRDecision{}, ctx.Err()
	}
	// The package's other tests run managers meanwhile, with queues of
	// their own: this queue's delay loop is the one this test started.
	loop := startedHere("k8s.io/client-go/util/workqueue.newDelayingQueue[...]")
	stop := f.start(t, 4)
	f.add("system:node:later")
	f.add("system:node:hang")
	require.Eventually(t, func() bool { return len(f.dec.calls()) == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, goroutines(loop), "the queue's delay loop is not found")
	// This replica's workers (the manager's have another receiver).
	worker := fmt.Sprintf("kubeletserving.(*Reconciler).next(%p,", f.r)
	require.Equal(t, 4, goroutines(worker))
	stop()
	assert.True(t, f.r.queue.ShuttingDown())
	assert.Zero(t, goroutines(worker), "a worker is left")
	require.Eventually(t, func() bool { return goroutines(loop) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the queue's delay loop is left")
}

// startedHere is how the stack of a goroutine that fn started, called by
// the calling goroutine, ends.
func startedHere(fn string) string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	// "goroutine 7 [running]: ..."
	return fmt.Sprintf("created by %s in goroutine %s\n", fn, strings.Fields(string(buf))[1])
}

// goroutines counts the goroutines with fn in their stack.
func goroutines(fn string) int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// Review 6 M3: a request whose write the API server keeps refusing is still
// undecided, and is counted pending (the gauge the pending alert watches),
// though no pending verdict of the rule is remembered of it.
func TestARequestWhoseWriteKeepsFailingCountsAsPending(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:x", "csr-x", t0))
	f.csrs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, apierrors.NewRequestEntityTooLargeError("too big")
	})
	ctx := context.Background()
	f.add("system:node:x")
	require.True(t, f.r.next(ctx))
	require.False(t, f.approved(t, "csr-x"))
	list, err := f.csrs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	// What the cluster's reconcile sets the gauge ichor_kubelet_serving_pending_csrs to.
	pending, withheld := f.r.leftPending(f.cluster, list.Items)
	assert.Equal(t, 1, pending, "a request whose write keeps failing is not counted pending")
	assert.Zero(t, withheld)
}

// recordingDecider counts the decisions recorded applied.
type recordingDecider struct {
	*decider
	recorded atomic.Int64
	// adopted counts the records marked made at a take-over.
	adopted atomic.Int64
}

func (d *recordingDecider) RecordApplied(_ context.Context, a engine.Applied) error {
	d.recorded.Add(1)
	if a.Adopted {
		d.adopted.Add(1)
	}
	return nil
}

// Review 6 L1: the reconcile and a worker may settle the same request at
// once (a failed write found decided); one decision is recorded applied
// once, not by both.
func TestASettledRequestIsRecordedAppliedOnce(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{})
	rec := &recordingDecider{decider: f.dec}
	f.r.Engine = rec
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(context.Background(), f.cluster, &c))
	csr := csrOf("system:node:x", "csr-x", t0)
	csr.UID = "uid-csr-x"
	csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
		Type: certificatesv1.CertificateApproved, Status: "True",
		Message: "approved (decision 00000000-0000-0000-0000-000000000000, policy revision abc)",
	}}
	const rounds = 3000
	key := (&pass{r: f.r, cluster: &c}).memoKey(&csr)
	for range rounds {
		f.r.uncertain.Add(key, approval.UncertainWrite{})
		var ready, wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			ready.Add(1)
			wg.Go(func() {
				p := &pass{r: f.r, cluster: &c}
				ready.Done()
				<-start
				p.settle(context.Background(), &csr)
			})
		}
		ready.Wait()
		close(start)
		wg.Wait()
	}
	assert.Equal(t, int64(rounds), rec.recorded.Load(), "one failed write's decision recorded applied more than once")
	assert.Zero(t, rec.adopted.Load(), "a record of this replica's own write marked as a take-over's")
}

// Review 6 L3: a request the API server refuses for good backs off on its
// own. The node's next request is decided at once, not after the older
// one's backoff (up to five minutes), and the events that bring the
// requester back do not bring the refused one back before its time.
func TestARequestRefusedForGoodHoldsUpNoOtherOfItsRequester(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	// The clock stands still unless the test moves it: no backoff runs out
	// by itself.
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-old", t0))
	var refused atomic.Int64
	f.csrs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		if a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).Name != "csr-old" {
			return false, nil, nil
		}
		refused.Add(1)
		return true, nil, apierrors.NewRequestEntityTooLargeError("too big")
	})
	f.start(t, 2)
	f.add("system:node:x")
	require.Eventually(t, func() bool { return refused.Load() == 1 }, 5*time.Second, 5*time.Millisecond)

	for i, name := range []string{"csr-new", "csr-newer"} {
		csr := csrOf("system:node:x", name, t0.Add(time.Duration(i+1)*time.Second))
		csr.UID = types.UID("uid-" + name)
		require.NoError(t, f.r.Client.Create(context.Background(), &csr))
		_, err := f.csrs.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &csr, metav1.CreateOptions{})
		require.NoError(t, err)
		// Its event.
		f.add("system:node:x")
		// The older one is looked at first in the same turn: once this
		// one is approved, that one was skipped.
		require.Eventually(t, func() bool { return f.approved(t, name) }, 5*time.Second, 5*time.Millisecond,
			"%s waited behind a request refused for good", name)
	}
	assert.Equal(t, int64(1), refused.Load(), "an event brought the refused request back before its backoff")
	assert.Equal(t, []string{"csr-old", "csr-new", "csr-newer"}, f.dec.calls(), "decided again before its backoff")

	// Its backoff over, it is tried again.
	clk.Step(minBackoff)
	require.Eventually(t, func() bool { return refused.Load() == 2 }, 5*time.Second, 5*time.Millisecond,
		"the refused request was not tried again after its backoff")
	assert.False(t, f.approved(t, "csr-old"))
}

// Not shared out, an approval on the wire when the manager stops is
// finished and recorded before the workers return (and the leader Lease is
// let go): nobody records a verdict of this replica's but itself, so a write
// cut short that the API server applied would be in effect without its
// record. So is one to a remote cluster's API server, whose watch the stop
// ends too (a turn still ends with its target while the manager runs:
// TestATurnEndsWithItsTarget). A stop before the write begins writes
// nothing.
func TestAnApprovalInFlightWhenTheLeaderStopsIsFinishedAndRecorded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	csr := csrOf("system:node:a", "csr-a", t0)
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprintf("remote=%v", remote), func(t *testing.T) {
			f := newQueueFixture(t, clock.RealClock{}, csr)
			rec := &recordingDecider{decider: f.dec}
			f.r.Engine = rec
			held := approvaltest.NewHeld()
			run, stopRun := context.WithCancel(context.Background())
			defer stopRun()
			f.r.runCtx = run
			if remote {
				watch, cancel := context.WithCancel(run)
				defer cancel()
				f.judgeRemotely(t, "kubeconfig", &target{
					reader: f.r.Client, clientset: held.Clientset(t), names: &nodeNames{}, counts: &floodCounts{},
					gate: f.r.gateOf(f.cluster), watch: watch, cancel: cancel,
				}, engine.KubeconfigDecision{Allowed: true})
			} else {
				f.r.Clientset = held.Clientset(t)
			}
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = workers{r: f.r, n: 1}.Start(ctx)
			}()
			f.add("system:node:a")
			select {
			case <-held.Sent:
			case <-time.After(10 * time.Second):
				t.Fatal("the approval was not sent")
			}
			stopRun()
			stop()
			require.Never(t, func() bool { return held.Cut() > 0 }, 200*time.Millisecond, time.Millisecond, "the stop cut the write short")
			held.Answer()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the workers did not stop with the manager")
			}
			assert.Equal(t, int64(1), rec.recorded.Load(), "the approval applied is not recorded")
		})
	}

	held := approvaltest.NewHeld()
	held.Answer()
	ctx, stop := context.WithCancel(context.Background())
	stop()
	// Stopped before it begins: nothing written.
	g := newQueueFixture(t, clock.RealClock{}, csr)
	g.r.Clientset = held.Clientset(t)
	p, ok, err := g.r.passFor(context.Background(), g.cluster)
	require.NoError(t, err)
	require.True(t, ok)
	list, err := p.requestsOf(context.Background(), "system:node:a")
	require.NoError(t, err)
	require.Len(t, list, 1)
	// An earlier write of unknown outcome stays uncertain: nothing
	// written now settles it (review 19, M1).
	key := p.memoKey(&list[0])
	g.r.uncertain.Add(key, approval.UncertainWrite{ResourceVersion: list[0].ResourceVersion, At: time.Now()})
	require.NoError(t, p.act(ctx, logr.Discard(), &list[0], gathered{}, approval.Verdict{}, approve()))
	assert.Zero(t, held.Writes(), "written after the stop")
	assert.True(t, g.r.uncertain.Has(key), "an earlier write of unknown outcome was forgotten by a write not made")
}

// A verdict is written only while the cluster and the machine it was
// reached on are as its decision found them: a turn reads its cluster once,
// then may go on for seconds (its requester's other requests, a node's
// direct read), whatever served the node's identity (reviews 216 F4, 217
// F2). A change that leaves them as they were drops nothing.
func TestAVerdictIsNotWrittenOnceWhatItWasReachedOnChanged(t *testing.T) {
	type world struct {
		c       client.Client
		cluster *ichorv1alpha1.TalosCluster
		machine *ichorv1alpha1.TalosMachine
	}
	for name, tc := range map[string]struct {
		change  func(context.Context, world) error
		dropped string
	}{
		"unchanged": {change: func(context.Context, world) error { return nil }},
		"the machine's status changed": {change: func(ctx context.Context, w world) error {
			w.machine.Status.ObservedGeneration = 1
			return w.c.Status().Update(ctx, w.machine)
		}},
		"turned off": {dropped: "cluster_off", change: func(ctx context.Context, w world) error {
			w.cluster.Spec.Security.KubeletServingCertificates.Enabled = false
			return w.c.Update(ctx, w.cluster)
		}},
		"cluster deleted": {dropped: "cluster_deleted", change: func(ctx context.Context, w world) error {
			return w.c.Delete(ctx, w.cluster)
		}},
		// Another controller's finalizer holds it (review 220 F3).
		"cluster being deleted": {dropped: "cluster_deleted", change: func(ctx context.Context, w world) error {
			w.cluster.Finalizers = append(w.cluster.Finalizers, "example.com/hold")
			if err := w.c.Update(ctx, w.cluster); err != nil {
				return err
			}
			return w.c.Delete(ctx, w.cluster)
		}},
		"cluster made anew": {dropped: "cluster_deleted", change: func(ctx context.Context, w world) error {
			if err := w.c.Delete(ctx, w.cluster); err != nil {
				return err
			}
			anew := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.cluster.Namespace, Name: w.cluster.Name, UID: "uid-anew"}, Spec: w.cluster.Spec}
			return w.c.Create(ctx, anew)
		}},
		"machine deleted": {dropped: "machine", change: func(ctx context.Context, w world) error {
			return w.c.Delete(ctx, w.machine)
		}},
		"machine re-pointed": {dropped: "machine", change: func(ctx context.Context, w world) error {
			w.machine.Spec.Endpoint = "10.0.0.99"
			w.machine.Generation++
			return w.c.Update(ctx, w.machine)
		}},
		"another machine answers": {dropped: "machine", change: func(ctx context.Context, w world) error {
			return w.c.Create(ctx, &ichorv1alpha1.TalosMachine{
				ObjectMeta: metav1.ObjectMeta{Namespace: w.machine.Namespace, Name: "a-too"},
				Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: w.machine.Spec.ClusterName, Hostname: "a", Endpoint: "10.0.0.3"},
			})
		}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:a", "csr-a", time.Unix(1_000_000, 0)))
			held, metrics := f.writing(t)
			w := world{c: f.r.Client, cluster: &ichorv1alpha1.TalosCluster{}}
			require.NoError(t, f.r.Client.Get(ctx, f.cluster, w.cluster))
			w.machine = &ichorv1alpha1.TalosMachine{
				ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "a", Generation: 1},
				Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: f.cluster.Name, Hostname: "a", Endpoint: "10.0.0.2"},
			}
			require.NoError(t, f.r.Client.Create(ctx, w.machine))

			p, list := f.turnOf(t, "system:node:a")
			// The node's name, as the request's subject would give it.
			node := "a"
			machine, candidates, _, err := p.machineFor(ctx, node)
			require.NoError(t, err)
			require.NotNil(t, machine)
			require.Equal(t, 1, candidates)

			require.NoError(t, tc.change(ctx, w))
			err = p.act(ctx, logr.Discard(), &list[0], gathered{node: node, machine: machine, candidates: candidates}, approval.Verdict{}, approve())
			if strings.HasPrefix(tc.dropped, "cluster_") {
				// The turn ends: its other requests were listed for a
				// cluster that is no longer.
				require.ErrorIs(t, err, errClusterChanged)
			} else {
				require.NoError(t, err)
			}
			if tc.dropped == "" {
				assert.Equal(t, int64(1), held.Writes(), "the verdict was not written")
				assert.Zero(t, testutil.CollectAndCount(metrics.dropped))
				return
			}
			assert.Zero(t, held.Writes(), "written once %s", name)
			assert.Equal(t, float64(1), testutil.ToFloat64(metrics.dropped.WithLabelValues(tc.dropped)))
			assert.Equal(t, minBackoff, p.wait, "not looked at again")
		})
	}
}

// No verdict is reached, and so none logged to read as in effect without
// ever being written, on a cluster turned off since its turn began,
// whatever served the node's identity (review 219 F1).
func TestNoVerdictIsReachedOnAClusterTurnedOffSinceItsTurnBegan(t *testing.T) {
	ctx := context.Background()
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:a", "csr-a", time.Unix(1_000_000, 0)))
	p, list := f.turnOf(t, "system:node:a")
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	c.Spec.Security.KubeletServingCertificates.Enabled = false
	require.NoError(t, f.r.Client.Update(ctx, &c))

	require.ErrorIs(t, p.decide(ctx, &list[0]), errClusterChanged)
	assert.Empty(t, f.dec.calls(), "the rule decided on a cluster turned off")
}

// The flood rule, asked before any node is read, is asked as the verdict's
// rule is: not once the turn ended (nothing would be written), nor on a
// cluster turned off since the turn began, which ends the turn (review 220
// F1/F2).
func TestTheFloodRuleIsNotAskedOnceTheTurnEndedOrTheClusterWasTurnedOff(t *testing.T) {
	for name, tc := range map[string]struct{ ended, off bool }{
		"neither":          {},
		"the turn ended":   {ended: true},
		"turned off since": {off: true},
	} {
		t.Run(name, func(t *testing.T) {
			t0 := time.Unix(1_000_000, 0)
			var csrs []certificatesv1.CertificateSigningRequest
			for i := range 2 {
				csr := csrOf("system:node:a", fmt.Sprintf("csr-a%d", i), t0.Add(time.Duration(i)*time.Second))
				req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("a")})
				require.NoError(t, err)
				csr.Spec.Request = req
				csrs = append(csrs, csr)
			}
			f := newQueueFixture(t, clock.RealClock{}, csrs...)
			_, metrics := f.writing(t)
			// Past the flood rule, the node is unreadable: the cluster has
			// no secrets bundle.
			f.r.NodeReaders.Reader = f.r.Client
			ctx := context.Background()
			require.NoError(t, f.r.Client.Create(ctx, &ichorv1alpha1.TalosMachine{
				ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "a"},
				Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: f.cluster.Name, Hostname: "a", Endpoint: "10.0.0.2"},
			}))
			p, ok, err := f.r.passFor(ctx, f.cluster)
			require.NoError(t, err)
			require.True(t, ok)
			list, err := p.requestsOf(ctx, "system:node:a")
			require.NoError(t, err)
			require.Len(t, list, 2)
			if tc.off {
				var c ichorv1alpha1.TalosCluster
				require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
				c.Spec.Security.KubeletServingCertificates.Enabled = false
				require.NoError(t, f.r.Client.Update(ctx, &c))
			}
			turn := ctx
			if tc.ended {
				var end context.CancelFunc
				turn, end = context.WithCancel(ctx)
				end()
			}

			err = p.decide(turn, &list[0])
			switch {
			case tc.off:
				require.ErrorIs(t, err, errClusterChanged)
				assert.Equal(t, float64(1), testutil.ToFloat64(metrics.dropped.WithLabelValues("cluster_off")))
			case tc.ended:
				require.NoError(t, err)
				assert.Zero(t, testutil.CollectAndCount(metrics.dropped), "a turn ended counted as a change")
			default:
				assert.Equal(t, 1, f.dec.rejections, "the flood rule was not asked: the test proves nothing")
				return
			}
			assert.Zero(t, f.dec.rejections, "the flood rule was asked")
		})
	}
}

// A turn whose cluster is turned off under it ends at the first verdict it
// drops: its requester's other requests were listed for a cluster that
// no longer serves them, and each would be decided (its node read) only to
// be dropped in turn (review 219 F2).
func TestATurnEndsOnceItsClusterIsTurnedOff(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:a", "csr-a1", t0), csrOf("system:node:a", "csr-a2", t0.Add(time.Second)))
	held, metrics := f.writing(t)
	f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) {
		// Turned off while the first request is decided.
		var c ichorv1alpha1.TalosCluster
		if err := f.r.Client.Get(ctx, f.cluster, &c); err != nil {
			return engine.CSRDecision{}, err
		}
		c.Spec.Security.KubeletServingCertificates.Enabled = false
		return approve(), f.r.Client.Update(ctx, &c)
	}
	wait, err := f.r.decideRequester(ctx, requester{cluster: f.cluster, username: "system:node:a"})
	require.NoError(t, err)
	assert.Equal(t, []string{"csr-a1"}, f.dec.calls())
	assert.Equal(t, float64(1), testutil.ToFloat64(metrics.dropped.WithLabelValues("cluster_off")), "the turn went on: its other request was looked at, and dropped")
	assert.Zero(t, testutil.CollectAndCount(metrics.writeFailures), "the end of the turn counted as a failure")
	assert.Zero(t, held.Writes())
	assert.Equal(t, minBackoff, wait)
}

// An event for a requester whose turn is running is not dropped, even when
// that turn is the retry of one whose list failed: the queue turns the key
// again once the running turn is done (review 21). The clock does not move,
// so neither the backoff nor a resync can bring the new request in.
func TestAnEventDuringARetriedTurnIsNotDropped(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	f := newQueueFixture(t, clk, csrOf("system:node:a", "csr-a", clk.Now()))
	later := csrOf("system:node:a", "csr-later", clk.Now())
	later.UID = "uid-csr-later"
	var lists atomic.Int32
	f.r.Client = interceptor.NewClient(f.r.Client.(client.WithWatch), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*certificatesv1.CertificateSigningRequestList); !ok {
				return c.List(ctx, list, opts...)
			}
			switch lists.Add(1) {
			case 1:
				return errors.New("injected: the list failed")
			case 2:
				// The retried turn has listed; a request arrives, and its
				// event, before the turn is done.
				// assert, not require: this runs on the worker's goroutine.
				err := c.List(ctx, list, opts...)
				assert.NoError(t, c.Create(ctx, later.DeepCopy()))
				_, cerr := f.csrs.CertificatesV1().CertificateSigningRequests().Create(ctx, later.DeepCopy(), metav1.CreateOptions{})
				assert.NoError(t, cerr)
				f.add("system:node:a")
				return err
			}
			return c.List(ctx, list, opts...)
		},
	})
	f.start(t, 1)
	f.add("system:node:a")
	backingOff := func() bool {
		return f.r.queue.NumRequeues(requester{cluster: f.cluster, username: "system:node:a"}) == 1
	}
	require.Eventually(t, backingOff, 5*time.Second, 5*time.Millisecond, "the failed list did not back off")
	// The backoff's timer is set by the queue's delay loop: step until it
	// has fired (a step before it is set is lost).
	require.Eventually(t, func() bool {
		clk.Step(maxBackoff)
		return lists.Load() >= 2
	}, 5*time.Second, 5*time.Millisecond, "the retry did not come")
	require.Eventually(t, func() bool { return f.approved(t, "csr-a") }, 5*time.Second, 5*time.Millisecond)
	assert.Eventually(t, func() bool { return f.approved(t, "csr-later") }, 5*time.Second, 5*time.Millisecond,
		"the event that came during the retried turn was dropped: the request waits for the resync")
}

// A request for a name no machine has is pending in every cluster that
// judges the API server, and is none of theirs: it is not counted in any
// cluster's pending gauge, or one made-up request (any node, any holder of
// a bootstrap token) fires the pending alert for every cluster (review
// 169). One the rule keeps pending for a machine of the cluster is.
func TestARequestForNoMachineIsNotACountedPending(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:ghost", "csr-ghost", t0), csrOf("system:node:slow", "csr-slow", t0))
	f.dec.decide = func(_ context.Context, name string) (engine.CSRDecision, error) {
		if name == "csr-ghost" {
			return pendingAs(codeMachineUnknown), nil
		}
		return pendingAs("NodeUnreadable"), nil
	}
	ctx := context.Background()
	f.add("system:node:ghost")
	f.add("system:node:slow")
	require.True(t, f.r.next(ctx))
	require.True(t, f.r.next(ctx))
	list, err := f.csrs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	pending, withheld := f.r.leftPending(f.cluster, list.Items)
	assert.Equal(t, 1, pending, "the request for no machine was counted, or the machine's was not")
	assert.Zero(t, withheld)
}

// Review 177: a request another writer decided between Ichor's read and its
// write (kube-controller-manager's approver, a person, the leader before) is
// theirs: losing that race is no decision failure counted, logged as an
// error or tried again with backoff.
func TestARequestDecidedByAnotherWriterMeanwhileIsNoFailure(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:x", "csr-x", t0))
	metrics, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	f.r.Metrics = metrics
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	writes := 0
	f.csrs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		writes++
		theirs := a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).DeepCopy()
		theirs.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AutoApproved",
			Message: "Auto approving kubelet serving certificate after SubjectAccessReview.",
		}}
		if err := f.csrs.Tracker().Update(gvr, theirs, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(gvr.GroupResource(), theirs.Name, errors.New("the object has been modified"))
	})
	ctx := context.Background()
	f.add("system:node:x")
	require.True(t, f.r.next(ctx))
	require.Equal(t, 1, writes)
	for _, kind := range []string{"transient", "permanent"} {
		assert.Zero(t, testutil.ToFloat64(metrics.writeFailures.WithLabelValues(kind)), "losing the race counted as a %s failure", kind)
	}
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	csr, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, f.r.failures.Has((&pass{r: f.r, cluster: &c}).memoKey(csr)), "losing the race is tried again with backoff")
}

// A read cut short by the end of its worker's turn (the shard let go, the
// target withdrawn, the manager stopping) says nothing of the node: it is
// neither a read failure in the metrics nor an outcome for the cluster's
// Ready (review 185); the same read in a live turn is both.
func TestAReadCutShortByTheTurnsEndSaysNothingOfTheNode(t *testing.T) {
	f := newQueueFixture(t, clock.RealClock{})
	metrics, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	f.r.Metrics = metrics
	f.r.NodeReaders = &NodeReaders{Reader: f.r.Client}
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(context.Background(), f.cluster, &c))
	p := &pass{r: f.r, cluster: &c}
	machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: "m"}}
	machine.Spec.Endpoint = "192.0.2.1"
	outcomes := func() int {
		f.r.NodeReaders.mu.Lock()
		defer f.r.NodeReaders.mu.Unlock()
		return len(f.r.NodeReaders.reads[f.cluster])
	}

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	assert.False(t, p.readNode(ended, machine, true).Readable)
	assert.Zero(t, testutil.CollectAndCount(metrics.talosReadErrors), "a read cut short counted as the node's failure")
	assert.Zero(t, outcomes(), "a read cut short counted towards the cluster's Ready")

	assert.False(t, p.readNode(context.Background(), machine, true).Readable, "the cluster has no secrets bundle")
	assert.Equal(t, float64(1), testutil.ToFloat64(metrics.talosReadErrors.WithLabelValues(c.Namespace, c.Name)))
	assert.Equal(t, 1, outcomes())
}
