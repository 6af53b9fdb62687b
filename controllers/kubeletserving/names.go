package kubeletserving

import (
	"sync"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// nodeNames remembers the node name each request of one API server is for,
// so that a request is parsed for it once in its life rather than by every
// event and by every cluster's reconcile: a request's spec cannot change
// after it is created, and its UID is never reused. The zero value is ready.
type nodeNames struct {
	mu sync.Mutex
	m  map[types.UID]string
}

// of is the node name the request is for (csrinput.NodeName), remembered.
func (n *nodeNames) of(csr *certificatesv1.CertificateSigningRequest) string {
	name := n.lookup(csr)
	if csr.UID == "" {
		return name
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[types.UID]string{}
	}
	n.m[csr.UID] = name
	return name
}

// lookup is the node name the request is for, remembered or parsed; it
// remembers nothing new. The events of the API server ask it; the passes
// and the flood counts (for an undecided request, on its first event) fill
// the memo, and a request's deletion and a cluster's reconciles, which
// follow within its resync, forget the requests gone, so that it holds no
// more than the requests the API server holds.
func (n *nodeNames) lookup(csr *certificatesv1.CertificateSigningRequest) string {
	n.mu.Lock()
	name, ok := n.m[csr.UID]
	n.mu.Unlock()
	if ok {
		return name
	}
	return csrinput.NodeName(csr)
}

// keepOnly forgets the requests not in live, every request of the API server
// a reconcile listed: those are gone. One created since the list may be
// forgotten too, and is parsed again when next asked for.
func (n *nodeNames) keepOnly(live map[types.UID]bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for uid := range n.m {
		if !live[uid] {
			delete(n.m, uid)
		}
	}
}

// forget forgets a request deleted.
func (n *nodeNames) forget(uid types.UID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.m, uid)
}
