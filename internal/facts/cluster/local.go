// Package cluster gathers facts about TalosClusters that no cluster object
// can state about itself.
package cluster

import (
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// Local are the TalosClusters the operator named as judges of the
// API server the manager runs against. Anyone who may create a TalosCluster
// could otherwise vouch, through a Talos API they control, for a node of
// that API server. A nil *Local names none.
type Local struct {
	mu    sync.RWMutex
	names map[types.NamespacedName]bool
}

// ParseLocal reads "namespace/name" entries.
func ParseLocal(entries []string) (*Local, error) {
	l := &Local{}
	for _, e := range entries {
		ns, name, ok := strings.Cut(strings.TrimSpace(e), "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return nil, fmt.Errorf("%q is not a TalosCluster as namespace/name", e)
		}
		l.Add(types.NamespacedName{Namespace: ns, Name: name})
	}
	return l, nil
}

// Add names one more cluster.
func (l *Local) Add(key types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.names == nil {
		l.names = map[types.NamespacedName]bool{}
	}
	l.names[key] = true
}

// Len is how many clusters are named.
func (l *Local) Len() int {
	if l == nil {
		return 0
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.names)
}

// Judges reports whether c judges the API server the manager runs against:
// it has no kubeconfigRef and the operator named it.
func (l *Local) Judges(c *ichorv1alpha1.TalosCluster) bool {
	if l == nil || c.Spec.KubeconfigRef != nil {
		return false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.names[client.ObjectKeyFromObject(c)]
}
