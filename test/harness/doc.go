// Package harness is the integration-test environment every controller test and
// the `make demo` sandbox run on: a real kube-apiserver and etcd (envtest), a
// CSR signer that is kube-controller-manager's CSR signing controller alone
// (tools/envtest/cmd/csrsigner, from the same pinned Kubernetes), a Talos
// secrets bundle made by Talos's own generator, Talos API test servers for the
// nodes, and simulated kubelets that request their certificates with the same
// certificate manager the kubelet runs.
//
// Nothing here approves a CSR: the signer has no csrapproving controller, so
// the approver under test is the only one. What the signer does is sign what
// was approved, as kube-controller-manager does, with the bundle's
// Kubernetes CA, which is also a client CA of the kube-apiserver. A credential
// Ichor signs with that CA therefore authenticates exactly as it would on a
// Talos cluster.
//
// The package does not import "testing": Start returns errors and the caller
// owns Stop, so the demo binary can use it as well as tests. A typical test:
//
//	env, err := harness.Start(ctx, harness.Options{})
//	require.NoError(t, err)
//	t.Cleanup(func() {
//		if t.Failed() {
//			t.Log(env.TailLogs(40))
//		}
//		require.NoError(t, env.Stop())
//	})
//
//	node, err := env.StartTalosNode(ctx, harness.NodeOptions{Name: "worker-1", Addresses: addrs})
//	kubelet, err := env.StartKubelet(ctx, harness.KubeletOptions{NodeName: "worker-1", IPs: ips})
//	// run the controller against env.Config, reading nodes at node.Endpoint()
//	cert, err := kubelet.WaitForCertificate(ctx)
package harness
