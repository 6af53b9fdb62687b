package faults_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// burst makes n nodes and their requests, and returns the requests' names.
func (f *fixture) burst(prefix string, n int, subnet int) []string {
	f.t.Helper()
	for i := range n {
		f.node(fmt.Sprintf("%s%02d", prefix, i), fmt.Sprintf("10.%d.0.%d", subnet, i+2))
	}
	names := make([]string, 0, n)
	for i := range n {
		names = append(names, f.submit(fmt.Sprintf("%s%02d", prefix, i), fmt.Sprintf("10.%d.0.%d", subnet, i+2), nil))
	}
	return names
}

// exactlyOnceApproved asserts every request carries exactly one decision,
// an approval.
func exactlyOnceApproved(ctx context.Context, t *testing.T, names []string) {
	t.Helper()
	got := decisions(ctx, t, names)
	require.Len(t, got, len(names))
	for name, conds := range got {
		require.Len(t, conds, 1, "%s carries %d decisions", name, len(conds))
		assert.Equal(t, certificatesv1.CertificateApproved, conds[0].Type, "%s: %s", name, conds[0].Message)
	}
}

// On SIGTERM the manager sends the decision-log service every entry it still
// holds before it exits. (Before: 41 of 41 lost, uncounted.)
func TestNoDecisionLogEntryIsLostAtSIGTERMWithAHealthySink(t *testing.T) {
	f := newFixture(t)
	svc := &harness.LogService{}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	m := f.manager("manager", []string{"--decision-log-url=" + srv.URL, "--decision-log-allow-insecure-http", "--decision-log-flush-timeout=10s"})
	names := f.burst("s", 20, 43)
	waitDecided(f.ctx, t, names, 60*time.Second)
	// At once, before the periodic upload: whatever is buffered now must
	// still arrive.
	require.NoError(t, m.Signal(syscall.SIGTERM))
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the manager did not exit within 30 s of SIGTERM")
	}
	logged := entries(t, m)
	require.NotEmpty(t, logged)
	var lost []string
	for _, e := range logged {
		if !svc.Has(e.DecisionID) {
			lost = append(lost, e.DecisionID)
		}
	}
	t.Logf("%d entries written to the console, %d received by the service", len(logged), svc.Received())
	assert.Empty(t, lost, "entries on the console that never reached the service")
}

// With two replicas, the leader stopped by SIGTERM releases its lease and the
// standby takes over at once. (Before: 16.3 s without verdicts.)
func TestFailoverTakesUnderFiveSeconds(t *testing.T) {
	f := newFixture(t)
	args := []string{"--leader-elect"} // the default timings, as the chart ships them
	ns := "POD_NAMESPACE=" + harness.ManagerNamespace
	a := f.manager("a", args, ns)
	b := f.manager("b", args, ns)
	var lease coordinationv1.Lease
	key := types.NamespacedName{Namespace: harness.ManagerNamespace, Name: "ichor-policy.ichor.dev"}
	require.Eventually(t, func() bool {
		return env.Client.Get(f.ctx, key, &lease) == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	}, 60*time.Second, 100*time.Millisecond, "nobody took the lease")
	var leader, standby *harness.ManagerProcess
	require.Eventually(t, func() bool {
		switch {
		case strings.Contains(readLog(t, a), "Successfully acquired lease"):
			leader, standby = a, b
		case strings.Contains(readLog(t, b), "Successfully acquired lease"):
			leader, standby = b, a
		}
		return leader != nil
	}, 30*time.Second, 100*time.Millisecond, "neither manager says it leads")
	first := *lease.Spec.HolderIdentity
	names := f.burst("f", 3, 44)
	waitDecided(f.ctx, t, names, 60*time.Second)

	stopped := time.Now()
	require.NoError(t, leader.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool {
		return env.Client.Get(f.ctx, key, &lease) == nil && lease.Spec.HolderIdentity != nil &&
			*lease.Spec.HolderIdentity != "" && *lease.Spec.HolderIdentity != first
	}, 30*time.Second, 50*time.Millisecond, "the standby did not take over")
	tookOver := time.Since(stopped)
	more := f.burst("g", 3, 45)
	waitDecided(f.ctx, t, more, 30*time.Second)
	verdict := time.Since(stopped)
	t.Logf("the standby held the lease %s after SIGTERM and decided new requests %s after", tookOver.Round(10*time.Millisecond), verdict.Round(10*time.Millisecond))
	assert.Less(t, tookOver, 5*time.Second)
	assert.Less(t, verdict, 8*time.Second)
	assert.Contains(t, readLog(t, standby), "Successfully acquired lease")
	exactlyOnceApproved(f.ctx, t, append(names, more...))
}

func readLog(t *testing.T, m *harness.ManagerProcess) string {
	t.Helper()
	b, err := os.ReadFile(m.Log)
	require.NoError(t, err)
	return string(b)
}

// A manager killed halfway through a burst: the next one decides the rest,
// every request exactly once, and nothing wrongly.
func TestAManagerKilledMidBurstLosesNothingAndDecidesNothingTwice(t *testing.T) {
	f := newFixture(t)
	first := f.manager("first", nil)
	names := f.burst("k", 30, 46)
	require.Eventually(t, func() bool { return len(decisions(f.ctx, t, names)) >= len(names)/3 }, 60*time.Second, 20*time.Millisecond)
	first.Kill()
	t.Logf("killed with %d of %d decided", len(decisions(f.ctx, t, names)), len(names))
	f.manager("second", nil)
	waitDecided(f.ctx, t, names, 60*time.Second)
	exactlyOnceApproved(f.ctx, t, names)
}

// A manager stopped by SIGTERM halfway through a burst, with its writes on
// the wire: it begins no more, finishes those and records them before it
// exits, and the next one decides the rest. Every request carries one
// verdict, and over both decision logs exactly one applied record, of the
// verdict in effect. (Before: a write on the wire was cancelled with the
// stop, and one the API server applied had no record: nobody records a
// leader's verdicts but itself.)
func TestAManagerStoppedMidBurstRecordsEveryVerdictItWrote(t *testing.T) {
	f := newFixture(t)
	// Each approval is applied at once and answered a second later: the
	// stop comes while they are on the wire.
	p := &faultProxy{holdAnswer: time.Second}
	first := f.manager("first", []string{"--kubeconfig=" + p.start(t)})
	names := f.burst("q", 30, 49)
	require.Eventually(t, func() bool { return len(decisions(f.ctx, t, names)) >= len(names)/3 }, 60*time.Second, 20*time.Millisecond)
	require.NoError(t, first.Signal(syscall.SIGTERM))
	select {
	case <-first.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the manager did not exit within 30 s of SIGTERM")
	}
	t.Logf("stopped with %d of %d decided, %d approvals sent", len(decisions(f.ctx, t, names)), len(names), p.writes.Load())
	second := f.manager("second", nil)
	waitDecided(f.ctx, t, names, 60*time.Second)
	exactlyOnceApproved(f.ctx, t, names)
	// Stopped too, so that its log holds the record of its last write.
	require.NoError(t, second.Signal(syscall.SIGTERM))
	select {
	case <-second.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the second manager did not exit within 30 s of SIGTERM")
	}

	records := map[string][]string{}
	for _, m := range []*harness.ManagerProcess{first, second} {
		for _, e := range entries(t, m) {
			var in struct {
				DecisionID string `json:"decision_id"`
				Object     string `json:"object"`
			}
			if e.Path == decisionlog.PathApplied && json.Unmarshal(e.Input, &in) == nil {
				records[in.Object] = append(records[in.Object], in.DecisionID)
			}
		}
	}
	for name, conds := range decisions(f.ctx, t, names) {
		id, ok := engine.DecisionOfMessage(conds[0].Message)
		require.True(t, ok, "%s: %s", name, conds[0].Message)
		assert.Equal(t, []string{id}, records["csr/"+name], "%s: applied records over both logs", name)
	}
}

// Two managers that both act (leader election off, by mistake): the API
// server's optimistic concurrency lets one write each decision; the other's
// write conflicts and it finds the request decided.
func TestTwoManagersAtOnceDecideEachRequestOnce(t *testing.T) {
	f := newFixture(t)
	a := f.manager("a", nil)
	b := f.manager("b", nil)
	names := f.burst("t", 30, 47)
	waitDecided(f.ctx, t, names, 60*time.Second)
	exactlyOnceApproved(f.ctx, t, names)
	// Of the verdicts both logged, exactly one per request is in effect.
	for _, name := range names {
		var inEffect []decisionlog.Entry
		for _, m := range []*harness.ManagerProcess{a, b} {
			for _, e := range decisionlog.InEffect(entries(t, m)) {
				if e.Object() == "csr/"+name {
					inEffect = append(inEffect, e)
				}
			}
		}
		// Both logs record the one verdict applied: the loser of the
		// conflict names the winner's.
		require.NotEmpty(t, inEffect, name)
		applied := map[string]bool{}
		for _, m := range []*harness.ManagerProcess{a, b} {
			for _, e := range entries(t, m) {
				var in struct {
					DecisionID string `json:"decision_id"`
					Object     string `json:"object"`
				}
				if e.Path == decisionlog.PathApplied && json.Unmarshal(e.Input, &in) == nil && in.Object == "csr/"+name {
					applied[in.DecisionID] = true
				}
			}
		}
		assert.Len(t, applied, 1, "%s: verdicts applied", name)
	}
}

// Bundles refused for different causes are Events of their own on the
// manager's Pod. (Before: one Event, naming the first cause.)
func TestEachCauseOfABundleRefusalIsItsOwnEvent(t *testing.T) {
	f := newFixture(t)
	key, pub := rsaPair(t)
	other, _ := rsaPair(t)
	good, err := bundles.Default()
	require.NoError(t, err)
	require.NoError(t, bundles.Sign(good, key, "RS256", "ichor"))
	path := f.dir + "/bundle.tar.gz"
	write := func(data []byte) {
		require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
		require.NoError(t, os.Rename(path+".tmp", path))
	}
	data, err := bundles.Bytes(good)
	require.NoError(t, err)
	write(data)
	require.NoError(t, os.WriteFile(f.dir+"/key.pem", []byte(pub), 0o600))

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: harness.ManagerNamespace, Name: "ichor-policy-faults"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "ichor"}}},
	}
	require.NoError(t, env.Client.Create(f.ctx, pod))
	m := f.manager("manager", []string{"--bundle=" + path, "--bundle-key=" + f.dir + "/key.pem", "--bundle-poll-interval=500ms"},
		"POD_NAMESPACE="+harness.ManagerNamespace, "POD_NAME="+pod.Name)
	// Serving the good bundle before any bad one replaces it.
	require.Eventually(t, func() bool { return strings.Contains(readLog(t, m), `"msg":"starting"`) }, 30*time.Second, 100*time.Millisecond)

	// Three causes: unsigned, corrupt, signed with another key.
	unsigned, err := bundles.Default()
	require.NoError(t, err)
	unsignedData, err := bundles.Bytes(unsigned)
	require.NoError(t, err)
	wrong, err := bundles.Default()
	require.NoError(t, err)
	require.NoError(t, bundles.Sign(wrong, other, "RS256", "ichor"))
	wrongData, err := bundles.Bytes(wrong)
	require.NoError(t, err)
	for i, bad := range [][]byte{unsignedData, []byte("not a tarball"), wrongData} {
		write(bad)
		require.Eventually(t, func() bool { return len(refusals(t, pod.Name)) > i }, 30*time.Second, 100*time.Millisecond,
			"refusal %d is not an Event of its own", i+1)
	}
	got := refusals(t, pod.Name)
	notes := map[string]bool{}
	for _, e := range got {
		t.Logf("%s %s: %s", e.Reason, e.Action, e.Note)
		notes[e.Note] = true
	}
	assert.Len(t, got, 3)
	assert.Len(t, notes, 3, "each Event names its own cause")
}

func refusals(t *testing.T, pod string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(harness.ManagerNamespace)))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == pod && e.Reason == "BundleRefused" {
			out = append(out, e)
		}
	}
	return out
}

func rsaPair(t *testing.T) (private, public string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// A request for a node name no machine has is left pending (ADR 0125), and
// not decided again until a machine takes its name or the request changes;
// or, now, another bundle is activated: the operator's new rules judge the
// requests the last ones left pending at once, not at the next resync (an
// hour here), and the decision log says under which revision. (Before: the
// verdict of the bundle it was first decided under held until a machine
// took the name, which may be never.)
func TestANewBundleJudgesTheRequestsTheLastOneLeftPending(t *testing.T) {
	f := newFixture(t)
	path := f.dir + "/bundle.tar.gz"
	serve := func(allowance int) string {
		b, err := bundles.Default()
		require.NoError(t, err)
		cfg := b.Data["ichor"].(map[string]any)["kubelet_serving"].(map[string]any)["config"].(map[string]any)
		cfg["min_undecided_allowance"] = json.Number(fmt.Sprint(allowance))
		b.Manifest.Revision = bundles.Digest(b)
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
		require.NoError(t, os.Rename(path+".tmp", path))
		return b.Manifest.Revision
	}
	pendingUnder := func(m *harness.ManagerProcess, name, revision string) int {
		n := 0
		for _, e := range entriesFor(t, name, m) {
			if e.Revision == revision && e.Action() == engine.ActionPending && slices.Equal(e.Codes(), []string{"MachineUnknown"}) {
				n++
			}
		}
		return n
	}
	first := serve(20)
	m := f.manager("manager", []string{"--bundle=" + path, "--bundle-poll-interval=200ms", "--resync-interval=1h"})
	name := f.submit("nobody-here", "10.45.0.9", nil)
	require.Eventually(t, func() bool { return pendingUnder(m, name, first) > 0 }, 30*time.Second, 100*time.Millisecond,
		"the request is left pending for want of a machine")

	second := serve(21)
	require.NotEqual(t, first, second)
	require.Eventually(t, func() bool { return pendingUnder(m, name, second) > 0 }, 30*time.Second, 100*time.Millisecond,
		"the request left pending under %s is judged again under %s", first, second)
	// Once under each: two more requests of the same requester, one after
	// the other, are each decided in a look at all of the requester's
	// requests; once the second is decided, the look of the first is over,
	// and it found the first request decided under this bundle already.
	names := []string{name}
	for range 2 {
		another := f.submit("nobody-here", "10.45.0.9", nil)
		require.Eventually(t, func() bool { return pendingUnder(m, another, second) > 0 }, 30*time.Second, 100*time.Millisecond)
		names = append(names, another)
	}
	assert.Equal(t, 1, pendingUnder(m, name, first), "decided once under the first bundle")
	assert.Equal(t, 1, pendingUnder(m, name, second), "decided once under the second")
	assert.Empty(t, decisions(f.ctx, t, names), "all stay pending")
}

// The reproduced attack of issue 21 (2), against the real manager process
// and API server: a signed bundle is served, then an older one signed with
// the same key. The running manager refuses it (an Event, the metric, the
// last good bundle kept), and a manager that restarts while the source
// serves the older bundle does not start: the highest epoch activated is
// kept in the ConfigMap of the manager's namespace, not in its memory.
func TestAnOlderSignedBundleIsRefusedAcrossARestart(t *testing.T) {
	f := newFixture(t)
	key, pub := rsaPair(t)
	epochs := types.NamespacedName{Namespace: harness.ManagerNamespace, Name: bundleepoch.ConfigMapName}
	t.Cleanup(func() {
		// The other tests of this package start at the floor.
		var cm corev1.ConfigMap
		if err := env.Client.Get(context.Background(), epochs, &cm); err == nil {
			cm.Data = nil
			_ = env.Client.Update(context.Background(), &cm)
		}
	})
	path := f.dir + "/bundle.tar.gz"
	serve := func(epoch int64) {
		b, err := bundles.Default()
		require.NoError(t, err)
		bundles.SetEpoch(b, epoch)
		require.NoError(t, bundles.Sign(b, key, "RS256", "ichor"))
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
		require.NoError(t, os.Rename(path+".tmp", path))
	}
	require.NoError(t, os.WriteFile(f.dir+"/key.pem", []byte(pub), 0o600))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: harness.ManagerNamespace, Name: "ichor-policy-epochs"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "ichor"}}},
	}
	require.NoError(t, env.Client.Create(f.ctx, pod))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pod) })
	args := []string{"--bundle=" + path, "--bundle-key=" + f.dir + "/key.pem", "--bundle-poll-interval=500ms"}
	podEnv := []string{"POD_NAMESPACE=" + harness.ManagerNamespace, "POD_NAME=" + pod.Name}
	newer, older := bundles.Floor()+2, bundles.Floor()+1

	serve(newer)
	m := f.manager("manager", args, podEnv...)
	require.Eventually(t, func() bool { return strings.Contains(readLog(t, m), `"msg":"starting"`) }, 60*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		var cm corev1.ConfigMap
		return env.Client.Get(f.ctx, epochs, &cm) == nil && cm.Data[bundleepoch.Key] == fmt.Sprint(newer)
	}, 30*time.Second, 100*time.Millisecond, "the epoch in service is recorded in the cluster")

	// The source moves back to an older signed bundle: refused, an Event.
	serve(older)
	require.Eventually(t, func() bool {
		for _, e := range refusals(t, pod.Name) {
			if strings.Contains(e.Note, fmt.Sprintf("epoch %d is below %d", older, newer)) {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "the older bundle's refusal is an Event")
	require.NoError(t, m.Stop(15*time.Second))

	// A restart while the source still serves the older bundle.
	again := f.manager("restarted", args, podEnv...)
	select {
	case <-again.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the restarted manager started with the older bundle")
	}
	assert.Contains(t, readLog(t, again), fmt.Sprintf("below %d, the highest epoch activated in this cluster", newer))
}

// Once its caches are synced, the manager process gives back the pages of
// its binary that only its start used (they are most of what it holds of
// the binary), and goes on deciding with what it needs mapped again: a
// request made after that is approved.
func TestAManagerGivesBackItsStartPagesAndDecidesOn(t *testing.T) {
	f := newFixture(t)
	f.node("paged", "10.43.0.2")
	m := f.manager("manager", nil)
	var released struct {
		Before int64 `json:"residentFileMiBBefore"`
		After  int64 `json:"residentFileMiBAfter"`
	}
	require.Eventually(t, func() bool {
		data, err := os.ReadFile(m.Log)
		require.NoError(t, err)
		for line := range strings.SplitSeq(string(data), "\n") {
			if strings.Contains(line, `"msg":"gave back the binary's start-up pages"`) {
				require.NoError(t, json.Unmarshal([]byte(line), &released), line)
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "the manager did not give back its start-up pages")
	t.Logf("the binary's resident pages: %d MiB before, %d MiB after", released.Before, released.After)
	assert.Greater(t, released.Before, int64(20), "an ichor binary's start maps tens of MiB of it")
	assert.Less(t, released.After, released.Before/2)

	name := f.submit("paged", "10.43.0.2", nil)
	waitDecided(f.ctx, t, []string{name}, 30*time.Second)
	assert.Equal(t, certificatesv1.CertificateApproved, decisions(f.ctx, t, []string{name})[name][0].Type)
}
