package engine_test

import (
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/version"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

func newEngine(t *testing.T) (*engine.Engine, *harness.DecisionLog) {
	t.Helper()
	log := &harness.DecisionLog{}
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: log, ID: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	return e, log
}

func servingInput(t *testing.T, key csrgen.KeyType, ips ...string) csrinput.KubeletServing {
	t.Helper()
	k, err := csrgen.Key(key)
	require.NoError(t, err)
	r := csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), DNSNames: []string{"worker-1"}, Key: k}
	for _, ip := range ips {
		r.IPs = append(r.IPs, net.ParseIP(ip))
	}
	pemBytes, err := csrgen.PEM(r)
	require.NoError(t, err)
	obj := csrgen.ServingObject("csr-worker-1", "worker-1", pemBytes)
	obj.Spec.Extra = map[string]certificatesv1.ExtraValue{"example.com/secret-claim": {"s3cret"}}
	return csrinput.KubeletServing{
		CSR:     csrinput.Build(obj),
		Machine: &csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"},
		Node: &csrinput.Node{
			Readable: true, Nodename: "worker-1", Hostname: "worker-1",
			Addresses: []string{"10.5.0.2", "fd00::2"},
		},
	}
}

func TestKubeletServingApprovesEachKeyTypeAndLogsIt(t *testing.T) {
	e, log := newEngine(t)
	def, err := bundles.Default()
	require.NoError(t, err)

	for _, key := range []csrgen.KeyType{csrgen.ECDSA, csrgen.RSA, csrgen.Ed25519} {
		t.Run(string(key), func(t *testing.T) {
			d, err := e.KubeletServing(context.Background(), servingInput(t, key, "10.5.0.2", "fd00::2"))
			require.NoError(t, err)
			assert.Equal(t, engine.ActionApprove, d.Action)
			assert.Equal(t, "worker-1", d.Node)
			require.Len(t, d.Reasons, 1)
			assert.Equal(t, "IchorKubeletServing", d.Reasons[0].Code)
			assert.NotEmpty(t, d.DecisionID)
			assert.Equal(t, def.Manifest.Revision, d.Revision)
		})
	}

	entries := harness.Decisions[map[string]any](log, nil)
	require.Len(t, entries, 3)
	entry := entries[0]
	assert.Equal(t, "Decision Log", entry["msg"])
	assert.Equal(t, engine.PathKubeletServing, entry["path"])
	assert.NotEmpty(t, entry["decision_id"])
	assert.NotEmpty(t, entry["timestamp"])
	assert.Equal(t, "approve", entry["result"].(map[string]any)["action"])
	assert.Equal(t, def.Manifest.Revision, entry["bundles"].(map[string]any)["ichor"].(map[string]any)["revision"])
	assert.Equal(t, "worker-1", entry["input"].(map[string]any)["node"].(map[string]any)["nodename"])
	labels := entry["labels"].(map[string]any)
	assert.Equal(t, "ichor-policy", labels["app"])
	assert.Equal(t, version.Get().Version, labels["ichor_version"])
	// The mask in policy/system/log ran: the claim's key stays, its value does not.
	extra := entry["input"].(map[string]any)["csr"].(map[string]any)["extra"].(map[string]any)
	assert.Equal(t, []any{"**REDACTED**"}, extra["example.com/secret-claim"])
	assert.NotContains(t, log.String(), "s3cret")
}

func TestKubeletServingDeniesAnotherNodesIPAndLogsTheDenial(t *testing.T) {
	e, log := newEngine(t)

	d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.3"))

	require.NoError(t, err)
	assert.Equal(t, engine.ActionDeny, d.Action)
	assert.Equal(t, engine.Reasons{{Code: "IPNotNode", Message: `IP address 10.5.0.3 is not one of the node's addresses ["10.5.0.2", "fd00::2"]`}}, d.Reasons)
	entries := harness.Decisions[map[string]any](log, nil)
	require.Len(t, entries, 1)
	assert.Equal(t, d.DecisionID, entries[0]["decision_id"])
	assert.Equal(t, "deny", entries[0]["result"].(map[string]any)["action"])
}

func TestKubeletServingDeniesANodeNameInTheWrongForm(t *testing.T) {
	// The node's own name as a constructed [2]: not a DNS name to
	// crypto/x509, Kubernetes or the signer, so the request has no name it
	// could be signed for and is not approved.
	e, _ := newEngine(t)
	name, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, IsCompound: true, Bytes: []byte("worker-1")})
	require.NoError(t, err)
	value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: name})
	require.NoError(t, err)
	pemBytes, err := csrgen.PEM(csrgen.Request{
		Subject:    csrgen.NodeSubject("worker-1"),
		Extensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: value}},
	})
	require.NoError(t, err)
	in := servingInput(t, csrgen.ECDSA)
	in.CSR = csrinput.Build(csrgen.ServingObject("csr-worker-1", "worker-1", pemBytes))

	d, err := e.KubeletServing(context.Background(), in)

	require.NoError(t, err)
	assert.Equal(t, engine.ActionDeny, d.Action, "%v", d.Reasons)
}

func TestOtherSignerGetsNoDecisionButIsLogged(t *testing.T) {
	e, log := newEngine(t)
	in := servingInput(t, csrgen.ECDSA, "10.5.0.2")
	in.CSR.SignerName = certificatesv1.KubeAPIServerClientSignerName

	_, err := e.KubeletServing(context.Background(), in)

	require.ErrorIs(t, err, engine.ErrNoDecision)
	require.Len(t, harness.Decisions[map[string]any](log, nil), 1)
}

func TestConcurrentDecisionsAreEachLogged(t *testing.T) {
	e, log := newEngine(t)
	good := servingInput(t, csrgen.ECDSA, "10.5.0.2")
	bad := servingInput(t, csrgen.ECDSA, "10.9.9.9")

	const n = 50
	var wg sync.WaitGroup
	actions := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			in := good
			if i%2 == 1 {
				in = bad
			}
			d, err := e.KubeletServing(context.Background(), in)
			actions[i], errs[i] = d.Action, err
		})
	}
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		want := engine.ActionApprove
		if i%2 == 1 {
			want = engine.ActionDeny
		}
		assert.Equal(t, want, actions[i], "decision %d", i)
	}
	ids := map[any]bool{}
	for _, entry := range harness.Decisions[map[string]any](log, nil) {
		ids[entry["decision_id"]] = true
	}
	assert.Len(t, ids, n)
}

// The counts of the flood guards are taken with the rule's own limits: the
// cap of each requester's requests, and the prefix that makes a requester
// the node a request names.
func TestKubeletServingLimitsComeFromTheRule(t *testing.T) {
	e, _ := newEngine(t)
	limits, err := e.KubeletServingLimits(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 5, limits.MaxUndecidedPerRequester)
	assert.Equal(t, "system:node:", limits.NodeUserPrefix)
	assert.NotEmpty(t, limits.Revision)
}
