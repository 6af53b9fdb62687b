package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// servingSelector selects every kubelet-serving CSR.
const servingSelector = "spec.signerName=" + certificatesv1.KubeletServingSignerName

// Request is one kubelet's serving certificate request, made before the
// clock starts: what client-go's certificate manager would send for the
// node (a fresh ECDSA P-256 key, CN=system:node:NAME, O=system:nodes, the
// node's name and IP, usages digital signature and server auth, generateName
// csr-), and the client that sends it as the node.
type Request struct {
	Machine *Machine
	Object  *certificatesv1.CertificateSigningRequest
	client  kubernetes.Interface
	http    *http.Client
}

// PrepareRequests makes one request per machine, each with a new key, as a
// kubelet rotating its certificate does.
func (f *Fleet) PrepareRequests(ctx context.Context, machines []*Machine) ([]*Request, error) {
	out := make([]*Request, len(machines))
	err := parallel(ctx, 2*f.Workers, len(machines), func(_ context.Context, i int) error {
		m := machines[i]
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		pemBytes, err := csrgen.PEM(csrgen.Request{
			Subject:  csrgen.NodeSubject(m.Name),
			DNSNames: []string{m.Name},
			IPs:      []net.IP{m.IP},
			Key:      key,
		})
		if err != nil {
			return err
		}
		obj := &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request:    pemBytes,
				SignerName: certificatesv1.KubeletServingSignerName,
				Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
			},
		}
		cfg, err := f.KubeletConfig(m)
		if err != nil {
			return err
		}
		// Every kubelet has its own connection, as on a cluster; a transport
		// of its own (not client-go's shared cache, keyed by the client
		// certificate) lets it be closed once the request is in.
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
		if err != nil {
			return err
		}
		out[i] = &Request{Machine: m, Object: obj, client: cs, http: hc}
		return nil
	})
	return out, err
}

// Submission is when one request went in.
type Submission struct {
	Name string
	// Start is when the create was sent, Created when the API server
	// answered.
	Start, Created time.Time
}

// Submit creates the requests, concurrency at a time, as fast as the API
// server takes them: every kubelet of the fleet asking at once.
func Submit(ctx context.Context, reqs []*Request, concurrency int) ([]Submission, error) {
	subs := make([]Submission, len(reqs))
	err := parallel(ctx, concurrency, len(reqs), func(ctx context.Context, i int) error {
		r := reqs[i]
		start := time.Now()
		var got *certificatesv1.CertificateSigningRequest
		var last error
		// A request refused for load (429) is retried, as the kubelet would.
		err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 8}, func(ctx context.Context) (bool, error) {
			createCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			got, last = r.client.CertificatesV1().CertificateSigningRequests().Create(createCtx, r.Object.DeepCopy(), metav1.CreateOptions{})
			return last == nil, nil
		})
		r.http.CloseIdleConnections()
		if err != nil {
			return fmt.Errorf("kubelet %s: create CSR: %w (last error: %v)", r.Machine.Name, err, last) //nolint:errorlint // last is detail for the reader, and may be nil
		}
		subs[i] = Submission{Name: got.Name, Start: start, Created: time.Now()}
		return nil
	})
	return subs, err
}

// Tracker watches every kubelet-serving CSR and records when each was first
// seen approved (or denied), from one informer in the driver.
type Tracker struct {
	informer cache.SharedIndexInformer
	stop     chan struct{}

	mu       sync.Mutex
	approved map[string]time.Time
	denied   map[string]string
	changed  chan struct{}
}

// NewTracker starts the informer and waits for its first list.
func NewTracker(ctx context.Context, cs kubernetes.Interface) (*Tracker, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = servingSelector
	}))
	t := &Tracker{
		informer: factory.Certificates().V1().CertificateSigningRequests().Informer(),
		stop:     make(chan struct{}),
		approved: map[string]time.Time{},
		denied:   map[string]string{},
		changed:  make(chan struct{}, 1),
	}
	if _, err := t.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    t.observe,
		UpdateFunc: func(_, obj any) { t.observe(obj) },
	}); err != nil {
		return nil, err
	}
	go t.informer.Run(t.stop)
	if !cache.WaitForCacheSync(ctx.Done(), t.informer.HasSynced) {
		close(t.stop)
		return nil, errors.New("CSR informer did not sync")
	}
	return t, nil
}

// Stop stops the informer.
func (t *Tracker) Stop() { close(t.stop) }

func (t *Tracker) observe(obj any) {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return
	}
	now := time.Now()
	for _, c := range csr.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		t.mu.Lock()
		switch c.Type {
		case certificatesv1.CertificateApproved:
			if _, seen := t.approved[csr.Name]; !seen {
				t.approved[csr.Name] = now
			}
		case certificatesv1.CertificateDenied:
			t.denied[csr.Name] = c.Reason + ": " + c.Message
		}
		t.mu.Unlock()
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
}

// Reset forgets what was seen.
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.approved)
	clear(t.denied)
}

// WaitDecided waits until every named request is approved or denied, or ctx
// ends, and returns when each was approved (zero time if it was not) and the
// denials.
func (t *Tracker) WaitDecided(ctx context.Context, names []string) (map[string]time.Time, map[string]string, error) {
	snapshot := func() (map[string]time.Time, map[string]string, bool) {
		t.mu.Lock()
		defer t.mu.Unlock()
		approved, denied := map[string]time.Time{}, map[string]string{}
		done := true
		for _, n := range names {
			if at, ok := t.approved[n]; ok {
				approved[n] = at
			} else if why, ok := t.denied[n]; ok {
				denied[n] = why
			} else {
				done = false
			}
		}
		return approved, denied, done
	}
	for {
		approved, denied, done := snapshot()
		if done {
			return approved, denied, nil
		}
		select {
		case <-ctx.Done():
			return approved, denied, fmt.Errorf("%d of %d requests decided: %w", len(approved)+len(denied), len(names), ctx.Err())
		case <-t.changed:
		case <-time.After(time.Second):
		}
	}
}

// DeleteRequests deletes every kubelet-serving CSR and waits until they are
// gone, so the next run starts from none.
func DeleteRequests(ctx context.Context, cs kubernetes.Interface) error {
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	if err := csrs.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: servingSelector}); err != nil {
		return fmt.Errorf("delete CSRs: %w", err)
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := csrs.List(ctx, metav1.ListOptions{FieldSelector: servingSelector, Limit: 1})
		if err != nil {
			return false, err
		}
		return len(list.Items) == 0, nil
	})
}

// Outcome is what one run of the load measured from the outside.
type Outcome struct {
	N int
	// First is when the first create was sent, LastApproved when the last
	// approval was seen.
	First, LastSubmitted, LastApproved time.Time
	// Latencies is, per approved request, from its creation to its approval
	// being seen, sorted.
	Latencies []time.Duration
	Denied    map[string]string
}

// Elapsed is from the first request to the last approval.
func (o Outcome) Elapsed() time.Duration { return o.LastApproved.Sub(o.First) }

// PerSecond is approvals per second over Elapsed.
func (o Outcome) PerSecond() float64 {
	if o.Elapsed() <= 0 {
		return 0
	}
	return float64(len(o.Latencies)) / o.Elapsed().Seconds()
}

// Quantile of the latencies, q in [0, 1].
func (o Outcome) Quantile(q float64) time.Duration {
	return quantile(o.Latencies, q)
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)))
	return sorted[min(i, len(sorted)-1)]
}

func outcome(subs []Submission, approved map[string]time.Time, denied map[string]string) Outcome {
	o := Outcome{N: len(subs), Denied: denied}
	for i, s := range subs {
		if i == 0 || s.Start.Before(o.First) {
			o.First = s.Start
		}
		if s.Created.After(o.LastSubmitted) {
			o.LastSubmitted = s.Created
		}
		at, ok := approved[s.Name]
		if !ok {
			continue
		}
		if at.After(o.LastApproved) {
			o.LastApproved = at
		}
		o.Latencies = append(o.Latencies, max(at.Sub(s.Created), 0))
	}
	slices.Sort(o.Latencies)
	return o
}
