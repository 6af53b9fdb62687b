// Package bundleepoch keeps the highest policy-bundle epoch the managers of
// a cluster have activated, in one ConfigMap of the manager's namespace, so
// that neither a restart nor another replica reopens the window a newer
// signed bundle closed (engine.EpochStore).
package bundleepoch

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConfigMapName is the ConfigMap, in the manager's namespace, that holds the
// highest epoch. The chart creates it empty, so the manager needs get and
// update on this one name, never create or list; Helm does not touch the
// data the manager writes.
const ConfigMapName = "ichor-policy-bundle-epoch"

// Key is the data key of the highest epoch, a decimal integer.
const Key = "highest"

// +kubebuilder:rbac:groups="",namespace=ichor-system,resources=configmaps,resourceNames=ichor-policy-bundle-epoch,verbs=get;update

// Store is the highest epoch in a ConfigMap, read uncached.
type Store struct {
	Client client.Client
	// Namespace is the manager's; Name is ConfigMapName when empty.
	Namespace, Name string
}

func (s *Store) key() types.NamespacedName {
	name := s.Name
	if name == "" {
		name = ConfigMapName
	}
	return types.NamespacedName{Namespace: s.Namespace, Name: name}
}

func (s *Store) get(ctx context.Context) (*corev1.ConfigMap, int64, error) {
	var cm corev1.ConfigMap
	if err := s.Client.Get(ctx, s.key(), &cm); err != nil {
		return nil, 0, fmt.Errorf("ConfigMap %s (the chart creates it): %w", s.key(), err)
	}
	raw, ok := cm.Data[Key]
	if !ok {
		return &cm, 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 {
		return nil, 0, fmt.Errorf("ConfigMap %s: %s is %q, not a non-negative integer", s.key(), Key, raw)
	}
	return &cm, n, nil
}

// Highest is the highest epoch recorded; 0 when none is.
func (s *Store) Highest(ctx context.Context) (int64, error) {
	_, n, err := s.get(ctx)
	return n, err
}

// Raise records epoch unless a higher one is recorded already. Replicas
// raise it concurrently: an update is conditional on the version read, and
// a conflict reads again, so the value only ever grows.
func (s *Store) Raise(ctx context.Context, epoch int64) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, n, err := s.get(ctx)
		if err != nil {
			return err
		}
		if n >= epoch {
			return nil
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[Key] = strconv.FormatInt(epoch, 10)
		if err := s.Client.Update(ctx, cm); err != nil {
			return fmt.Errorf("ConfigMap %s: %w", s.key(), err)
		}
		return nil
	})
}
