package chart

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
)

// TestOnlyTheManagerRaisesTheBundleEpochsFloor (review 227 F3) installs the
// chart into a real API server. The ConfigMap holding the highest bundle
// epoch is the floor below which every replica refuses a signed bundle:
// whoever may update ConfigMaps in the namespace (here an administrator,
// whom the policy does not spare either) may not change its data, make it
// immutable, delete it (alone or as a collection) or make it again with an
// epoch, and the manager itself may only raise it; labels stay anyone's.
func TestOnlyTheManagerRaisesTheBundleEpochsFloor(t *testing.T) {
	cfg, _ := installedChart(t)
	ctx := t.Context()
	c, err := client.New(cfg, client.Options{})
	require.NoError(t, err)
	manager := asTheManager(t, cfg)
	key := types.NamespacedName{Namespace: namespace, Name: bundleepoch.ConfigMapName}
	// Refused by the policy, for the rule whose message holds why (an
	// expression that fails to evaluate is refused under the policy's name
	// too).
	const (
		notDeleted   = "may not be deleted"
		madeEmpty    = "is made empty"
		notImmutable = "may not be made immutable"
		managerOnly  = "only the Ichor manager writes"
		onlyRises    = "may only rise"
	)
	refusedFor := func(err error, why string) bool {
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+release+"-bundle-epoch'") && strings.Contains(err.Error(), why)
	}
	refused := func(err error) bool { return refusedFor(err, "") }
	store := &bundleepoch.Store{Client: manager, Namespace: namespace}
	require.NoError(t, store.Raise(ctx, 12), "the manager records the epoch it activated")
	write := func(as client.Client, change func(*corev1.ConfigMap), opts ...client.UpdateOption) error {
		var cm corev1.ConfigMap
		require.NoError(t, c.Get(ctx, key, &cm))
		change(&cm)
		return as.Update(ctx, &cm, opts...)
	}
	set := func(highest string) func(*corev1.ConfigMap) {
		return func(cm *corev1.ConfigMap) { cm.Data[bundleepoch.Key] = highest }
	}

	// The policy is in force once a write it forbids is refused by it.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return refused(write(c, set("3"), client.DryRunAll)), nil
	}), "the bundle-epoch policy never refused a write")

	for what, change := range map[string]func(*corev1.ConfigMap){
		"lowering it":  set("3"),
		"raising it":   set("99"),
		"removing it":  func(cm *corev1.ConfigMap) { delete(cm.Data, bundleepoch.Key) },
		"emptying it":  func(cm *corev1.ConfigMap) { cm.Data = nil },
		"another key":  func(cm *corev1.ConfigMap) { cm.Data["other"] = "x" },
		"not a number": set("12 "),
		"binary data":  func(cm *corev1.ConfigMap) { cm.BinaryData = map[string][]byte{"other": []byte("1")} },
	} {
		assert.True(t, refusedFor(write(c, change), managerOnly), "someone else %s: not refused by the policy", what)
	}
	for what, change := range map[string]func(*corev1.ConfigMap){
		"lowering it": set("11"),
		"removing it": func(cm *corev1.ConfigMap) { delete(cm.Data, bundleepoch.Key) },
		"garbling it": set("twelve"),
	} {
		assert.True(t, refusedFor(write(manager, change), onlyRises), "the manager %s: not refused by the policy", what)
	}
	assert.True(t, refusedFor(write(c, func(cm *corev1.ConfigMap) { cm.Immutable = ptr.To(true) }), notImmutable),
		"someone else making it immutable, which would keep the manager from raising it: not refused by the policy")
	var cm corev1.ConfigMap
	require.NoError(t, c.Get(ctx, key, &cm))
	assert.True(t, refusedFor(c.Delete(ctx, &cm), notDeleted), "deleting the record: not refused by the policy")
	// A collection's DELETE is admitted item by item without a name
	// (review 228 N2).
	deleteAll := func() error {
		return c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(namespace), client.MatchingFields{"metadata.name": bundleepoch.ConfigMapName})
	}
	assert.True(t, refusedFor(deleteAll(), notDeleted), "deleting the record as a collection: not refused by the policy")
	// Made again with an epoch of someone's choosing (admission comes before
	// the API server finds the name taken).
	again := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: bundleepoch.ConfigMapName}, Data: map[string]string{bundleepoch.Key: "1"}}
	assert.True(t, refusedFor(c.Create(ctx, again, client.DryRunAll), madeEmpty), "making the record again with an epoch: not refused by the policy")
	// A ConfigMap of that name in another namespace is nobody's floor.
	elsewhere := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: bundleepoch.ConfigMapName}, Data: map[string]string{bundleepoch.Key: "1"}}
	require.NoError(t, c.Create(ctx, elsewhere))
	elsewhere.Data[bundleepoch.Key] = "0"
	require.NoError(t, c.Update(ctx, elsewhere))
	require.NoError(t, c.Delete(ctx, elsewhere))

	// What stays allowed: anyone's labels (helm upgrade writes them), and
	// the manager raising the epoch.
	require.NoError(t, write(c, func(cm *corev1.ConfigMap) { cm.Labels["example.com/team"] = "platform" }))
	require.NoError(t, store.Raise(ctx, 13))
	highest, err := store.Highest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(13), highest)

	// It goes with its namespace: the namespace controller empties a
	// namespace being deleted, under whichever name it runs as (none runs
	// here, so the namespace stays terminating and the administrator
	// empties it; review 229 R2).
	require.NoError(t, c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		err := deleteAll()
		if err != nil && !refusedFor(err, notDeleted) {
			return false, err
		}
		return err == nil, nil
	}), "the record of a namespace being deleted could not be deleted")
	assert.True(t, apierrors.IsNotFound(c.Get(ctx, key, &cm)), "the record is gone with its namespace")
}
