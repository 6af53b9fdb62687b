package kubeletserving

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// TestReadyIsFalseOnlyForARefusedConfiguration: every condition the nodes
// move (a machine waiting, verification waiting for it, a flood withheld,
// one machine of several not answering) leaves Ready True; a refusal of the
// configuration, including a reason this table does not know yet, makes it
// False with that reason, and so does a Talos API no machine of which
// answered.
func TestReadyIsFalseOnlyForARefusedConfiguration(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason + " message"}
	}
	waiting := cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ichorv1alpha1.ReasonMachinesPending)
	unreachable := cond(ichorv1alpha1.ConditionReady, metav1.ConditionFalse, ichorv1alpha1.ReasonTalosAPIUnreachable)
	unreachable.LastTransitionTime = metav1.NewTime(time.Unix(1_000_000, 0))
	unreachable.ObservedGeneration = 7
	unreachableBefore := unreachable
	unreachableBefore.ObservedGeneration = 6
	for _, tc := range []struct {
		name       string
		enabled    bool
		deleting   bool
		conditions []metav1.Condition
		reach      reachability
		status     metav1.ConditionStatus
		reason     string
		message    string
	}{
		{name: "off", status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonKubeletServingOff},
		{name: "not yet looked at", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing},
		{name: "every machine issued", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing, conditions: []metav1.Condition{
			cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionTrue, ichorv1alpha1.ReasonAllMachinesIssued),
		}},
		{name: "a node joining, verification waiting", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing, conditions: []metav1.Condition{
			waiting, cond(ichorv1alpha1.ConditionKubeletServingVerified, metav1.ConditionFalse, ichorv1alpha1.ReasonAwaitingCertificates),
		}},
		{name: "a flood withheld", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing, conditions: []metav1.Condition{
			waiting, cond(ichorv1alpha1.ConditionKubeletServingRequests, metav1.ConditionFalse, ichorv1alpha1.ReasonTooManyPendingRequests),
		}},
		{name: "kubeconfig unreadable", enabled: true, status: metav1.ConditionFalse, reason: ReasonKubeconfigUnreadable, conditions: []metav1.Condition{
			cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonKubeconfigUnreadable),
		}},
		{name: "the bundle cannot judge the kubeconfig", enabled: true, status: metav1.ConditionFalse, reason: ReasonPolicyEvaluationFailed,
			conditions: []metav1.Condition{cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonPolicyEvaluationFailed)},
			message:    "the manager cannot judge the configuration (its policy or its decision log failed): " + ReasonPolicyEvaluationFailed + " message"},
		{name: "local cluster not named", enabled: true, status: metav1.ConditionFalse, reason: ReasonLocalClusterNotNamed, conditions: []metav1.Condition{
			cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonLocalClusterNotNamed),
		}},
		{name: "a refusal added later", enabled: true, status: metav1.ConditionFalse, reason: "KubeconfigRefused", conditions: []metav1.Condition{
			cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, "KubeconfigRefused"),
		}},
		{name: "one machine of two unreachable", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing,
			conditions: []metav1.Condition{waiting}, reach: reachability{machines: 2, failed: 1, machine: "m-1", err: "timeout", total: 2}},
		{name: "the one machine read of three unreachable", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing,
			conditions: []metav1.Condition{waiting}, reach: reachability{machines: 1, failed: 1, machine: "m-1", err: "timeout", total: 3}},
		{name: "every machine read unreachable", enabled: true, status: metav1.ConditionFalse, reason: ichorv1alpha1.ReasonTalosAPIUnreachable,
			conditions: []metav1.Condition{waiting}, reach: reachability{machines: 2, failed: 2, machine: "m-1", err: "timeout\x1b[2J", total: 3},
			message: "no machine's Talos API answered: the 2 of the cluster's 3 machines read in the last 5m0s all failed; m-1: timeout^[[2J"},
		// Review 247, F2: a restart or a hand-over forgets the reads; until
		// some say something, what the last manager found stays.
		{name: "just after a restart, nothing read yet", enabled: true, status: metav1.ConditionFalse, reason: ichorv1alpha1.ReasonTalosAPIUnreachable,
			conditions: []metav1.Condition{waiting, unreachable}, reach: reachability{early: true, total: 3}, message: unreachable.Message},
		{name: "just after a restart, the reads failing for less than the grace", enabled: true, status: metav1.ConditionFalse, reason: ichorv1alpha1.ReasonTalosAPIUnreachable,
			conditions: []metav1.Condition{waiting, unreachable}, reach: reachability{early: true, machines: 2, total: 3}, message: unreachable.Message},
		{name: "just after a restart, a remote cluster waiting for its turn to start", enabled: true, status: metav1.ConditionFalse, reason: ichorv1alpha1.ReasonTalosAPIUnreachable,
			conditions: []metav1.Condition{cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonRemoteWatchStarting), unreachable}, message: unreachable.Message},
		{name: "a remote cluster waiting for its turn to start", enabled: true, status: metav1.ConditionFalse, reason: ReasonRemoteWatchStarting,
			conditions: []metav1.Condition{cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonRemoteWatchStarting)},
			message:    "the cluster's requests are not decided yet: " + ReasonRemoteWatchStarting + " message"},
		{name: "just after a restart, a machine answered", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing,
			conditions: []metav1.Condition{waiting, unreachable}, reach: reachability{early: true, machines: 2, answered: 1, total: 3}},
		{name: "just after a restart, of a spec changed since", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing,
			conditions: []metav1.Condition{waiting, unreachableBefore}, reach: reachability{early: true, total: 3}},
		{name: "long after a restart, nothing read", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing,
			conditions: []metav1.Condition{waiting, unreachable}, reach: reachability{total: 3}},
		{name: "just after a restart, Ready was not about the Talos API", enabled: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonServing,
			conditions: []metav1.Condition{waiting, cond(ichorv1alpha1.ConditionReady, metav1.ConditionFalse, ReasonKubeconfigUnreadable)}, reach: reachability{early: true, total: 3}},
		{name: "a refusal comes before reachability", enabled: true, status: metav1.ConditionFalse, reason: ReasonKubeconfigUnreadable,
			conditions: []metav1.Condition{cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonKubeconfigUnreadable)},
			reach:      reachability{machines: 1, failed: 1, machine: "m-1", err: "x", total: 1}},
		{name: "off, whatever was read", status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonKubeletServingOff,
			reach: reachability{machines: 1, failed: 1, machine: "m-1", err: "x", total: 1}},
		// Held by another controller's finalizer: no longer served, whatever
		// its spec and its conditions said (review 220 F3).
		{name: "being deleted", enabled: true, deleting: true, status: metav1.ConditionTrue, reason: ichorv1alpha1.ReasonDeleting,
			conditions: []metav1.Condition{cond(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, ReasonKubeconfigUnreadable)},
			reach:      reachability{machines: 1, failed: 1, machine: "m-1", err: "x", total: 1},
			message:    "the cluster is being deleted: nothing is approved for it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Generation: 7}}
			c.Spec.Security.KubeletServingCertificates.Enabled = tc.enabled
			if tc.deleting {
				c.DeletionTimestamp = &metav1.Time{Time: time.Unix(1_000_000, 0)}
			}
			c.Status.Conditions = slices.Clone(tc.conditions)
			kept := setReady(c, tc.reach)
			ready := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionReady)
			assert.Equal(t, tc.message == unreachable.Message, kept, "said kept")
			if ready != nil && kept {
				assert.Equal(t, unreachable.LastTransitionTime, ready.LastTransitionTime, "kept: its time unchanged")
			}
			if assert.NotNil(t, ready) {
				assert.Equal(t, tc.status, ready.Status)
				assert.Equal(t, tc.reason, ready.Reason)
				assert.EqualValues(t, 7, ready.ObservedGeneration)
				switch {
				case tc.message != "":
					assert.Equal(t, tc.message, ready.Message)
				case tc.status == metav1.ConditionFalse:
					assert.Equal(t, "the configuration is refused: "+tc.reason+" message", ready.Message)
				}
			}
			assert.EqualValues(t, 7, c.Status.ObservedGeneration)
		})
	}
}
