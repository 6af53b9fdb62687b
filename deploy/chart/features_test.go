package chart

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/version"
	sigsyaml "sigs.k8s.io/yaml"
)

// TestAnUnsignedConfigMapBundleIsRefusedUnlessChosen (review 62 L2): the
// built-in edit role updates ConfigMaps, so a ConfigMap's unsigned bundle
// is anyone's of the namespace to rewrite; it renders signed, or chosen.
func TestAnUnsignedConfigMapBundleIsRefusedUnlessChosen(t *testing.T) {
	out, err := renderOutput(t, "manager.bundle.configMap.name=ichor-bundle")
	require.Error(t, err)
	assert.Contains(t, string(out), `manager.bundle.configMap.name is "ichor-bundle" and manager.bundle.verification.configMap is empty`)
	for _, set := range [][]string{
		{"manager.bundle.configMap.name=ichor-bundle", "manager.bundle.verification.configMap=ichor-bundle-key"},
		{"manager.bundle.configMap.name=ichor-bundle", "manager.bundle.configMap.unsigned=true"},
	} {
		dep := render(t, set...).deployment(t)
		assert.Equal(t, "/etc/ichor-policy/bundle/bundle.tar.gz", argValue(t, dep, "--bundle"), "%v", set)
	}
	// The key's digest pinned in the Deployment, where the ConfigMap's
	// writers cannot change it (review 166); a pin of no key is refused.
	pin := strings.Repeat("ab", 32)
	dep := render(t, "manager.bundle.configMap.name=ichor-bundle", "manager.bundle.verification.configMap=ichor-bundle-key",
		"manager.bundle.verification.sha256="+pin).deployment(t)
	assert.Equal(t, pin, argValue(t, dep, "--bundle-key-sha256"))
	out, err = renderOutput(t, "manager.bundle.configMap.name=ichor-bundle", "manager.bundle.configMap.unsigned=true", "manager.bundle.verification.sha256="+pin)
	require.Error(t, err)
	assert.Contains(t, string(out), "the pin is of the key that ConfigMap holds")
	// A path beside the ConfigMap passed over its check: the path may name
	// the ConfigMap's own file, re-read at each poll (review 166).
	out, err = renderOutput(t, "manager.bundle.configMap.name=ichor-bundle", "manager.bundle.path=/etc/ichor-policy/bundle/bundle.tar.gz")
	require.Error(t, err)
	assert.Contains(t, string(out), "are both set: give the bundle one way")
}

// TestExtraArgsDoNotSetWhatTheChartSets (review 166): the last of a flag
// given twice wins, so a flag of the chart's own given again in
// manager.extraArgs would run the pods otherwise than the chart checked,
// wired and granted rights for them (--leader-elect=false under two
// replicas: both would decide). Each flag the chart renders from its values
// is refused there, and the others pass.
func TestExtraArgsDoNotSetWhatTheChartSets(t *testing.T) {
	values := filepath.Join(chartDir(t), "testdata", "values-all.yaml")
	dep := decode(t, helm(t, nil, "template", release, chartDir(t), "--namespace", namespace, "-f", values)).deployment(t)
	var args []string
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "manager" {
			args = c.Args
		}
	}
	require.NotEmpty(t, args)
	owned := 0
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") || name == "--shadow-bundle" || name == "--bundle" || name == "--decision-log-url" || strings.HasPrefix(name, "--zap-") ||
			slices.Contains([]string{"--bundle-poll-interval", "--bundle-max-compressed-bytes", "--bundle-max-uncompressed-bytes", "--bundle-max-files",
				"--decision-log-buffer-events", "--decision-log-flush-timeout", "--resync-interval", "--talos-timeout", "--talos-watch", "--talos-watch-max",
				"--talos-watch-max-age", "--tenant-max-csrs", "--tenant-max-csr-mib", "--talos-reader-lifetime"}, name) {
			// The extra args themselves; the two with checks of their
			// own; and the tunings no check or object follows.
			continue
		}
		owned++
		out, err := renderOutput(t, "manager.extraArgs={"+name+"=x}")
		require.Error(t, err, "manager.extraArgs set %s again", name)
		assert.Contains(t, string(out), "manager.extraArgs has "+name+", which the chart sets from its values")
	}
	assert.Greater(t, owned, 15, "the chart's own flags were not found in its arguments")
	// Flags the chart does not render (their defaults are what its objects
	// and rights follow), refused all the same (review 242 F4).
	for _, name := range []string{"--admission-key-secret", "--webhook"} {
		out, err := renderOutput(t, "manager.extraArgs={"+name+"=x}")
		require.Error(t, err, "manager.extraArgs set %s", name)
		assert.Contains(t, string(out), "manager.extraArgs has "+name+", which the chart sets from its values")
	}
	// Nor another identity than the ServiceAccount the chart's rights and
	// admission policies are written for (review 256 F7).
	out, err := renderOutput(t, "manager.extraArgs={--kubeconfig=/etc/other/kubeconfig}")
	require.Error(t, err, "manager.extraArgs set --kubeconfig")
	assert.Contains(t, string(out), "manager.extraArgs has --kubeconfig")
	render(t, "manager.extraArgs={--talos-watch-max=10,--shadow-bundle=/etc/shadow/bundle.tar.gz,--leader-elected=x,--webhook-something=x}")
}

// TestARemoteBundleWithoutAKeyIsRefusedAtRender: the manager refuses to start
// on a bundle fetched over the network that it cannot verify, so the chart
// refuses to render one, saying what to set, rather than install pods that
// crash-loop. A key, or a local source, renders; plain HTTP needs the
// manager's own opt-in flag as well.
func TestARemoteBundleWithoutAKeyIsRefusedAtRender(t *testing.T) {
	const key = "manager.bundle.verification.configMap=bundle-key"
	for _, tc := range []struct {
		path string
		set  []string
		want string // "" renders
	}{
		{path: "https://bundles.example/ichor.tar.gz", want: "a bundle fetched over the network, and manager.bundle.verification.configMap is empty"},
		{path: "oci://registry.example/ichor/policy:v1", want: "a bundle fetched over the network"},
		{path: "http://bundles.example/ichor.tar.gz", want: "a bundle fetched over the network"},
		{path: "oci+http://registry.example/ichor/policy:v1", want: "a bundle fetched over the network"},
		{path: "https://bundles.example/ichor.tar.gz", set: []string{key}},
		{path: "oci://registry.example/ichor/policy@sha256:" + strings.Repeat("a", 64), set: []string{key}},
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key}, want: "plain HTTP"},
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key, "manager.extraArgs={--bundle-allow-insecure-http}"}},
		// The opt-in as the manager's flag parser reads it: a value, the last one winning.
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key, "manager.extraArgs={--bundle-allow-insecure-http=true}"}},
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key, "manager.extraArgs={--bundle-allow-insecure-http=false}"}, want: "plain HTTP"},
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key, "manager.extraArgs={--bundle-allow-insecure-http,--bundle-allow-insecure-http=0}"}, want: "plain HTTP"},
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key, "manager.extraArgs={--bundle-allow-insecure-http=false,--bundle-allow-insecure-http}"}},
		{path: "http://bundles.example/ichor.tar.gz", set: []string{key, "manager.extraArgs={--bundle-allow-insecure-http-not}"}, want: "plain HTTP"},
		{path: "/etc/ichor/bundle.tar.gz"},
		// Past the check through the manager's flags (review 24).
		{path: "/etc/ichor/bundle.tar.gz", set: []string{"manager.extraArgs={--bundle=https://bundles.example/ichor.tar.gz}"}, want: "the bundle is manager.bundle.path"},
	} {
		t.Run(tc.path+fmt.Sprint(len(tc.set)), func(t *testing.T) {
			out, err := renderOutput(t, append([]string{"manager.bundle.path=" + tc.path}, tc.set...)...)
			if tc.want != "" {
				require.Error(t, err, "rendered %s", tc.path)
				assert.Contains(t, string(out), tc.want)
				return
			}
			require.NoError(t, err, "%s", out)
			assert.Equal(t, tc.path, argValue(t, decode(t, out).deployment(t), "--bundle"))
		})
	}
}

// TestAPlainHTTPDecisionLogServiceIsRefusedAtRender: the manager refuses a
// decision-log service over plain http without its opt-in flag, so the chart
// refuses to render one, without quoting the URL (it may hold a password).
func TestAPlainHTTPDecisionLogServiceIsRefusedAtRender(t *testing.T) {
	for _, tc := range []struct {
		url  string
		set  []string
		want string // "" renders
	}{
		{url: "http://ichor:s3cret@logs.example", want: "manager.decisionLog.url is plain HTTP"},
		{url: "http://logs.example", set: []string{"manager.extraArgs={--decision-log-allow-insecure-http}"}},
		{url: "http://logs.example", set: []string{"manager.extraArgs={--decision-log-allow-insecure-http=True}"}},
		{url: "http://logs.example", set: []string{"manager.extraArgs={--decision-log-allow-insecure-http,--decision-log-allow-insecure-http=false}"}, want: "manager.decisionLog.url is plain HTTP"},
		{url: "https://logs.example"},
		// Past the check through the manager's flags.
		{url: "", set: []string{"manager.extraArgs={--decision-log-url=http://ichor:s3cret@logs.example}"}, want: "the service is manager.decisionLog.url"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			out, err := renderOutput(t, append([]string{"manager.decisionLog.url=" + tc.url}, tc.set...)...)
			if tc.want != "" {
				require.Error(t, err, "rendered %s", tc.url)
				assert.Contains(t, string(out), tc.want)
				assert.NotContains(t, string(out), "s3cret")
				return
			}
			require.NoError(t, err, "%s", out)
			assert.Equal(t, tc.url, argValue(t, decode(t, out).deployment(t), "--decision-log-url"))
			assert.NotContains(t, string(out), "s3cret")
		})
	}
}

// TestNetworkPolicyIsOffByDefaultAndLetsTheManagerWork: no NetworkPolicy by
// default; turned on, one policy selects exactly the manager's pods and lets
// in the webhook and the metrics on the ports the pods serve them on, and
// out DNS, the API servers, the Talos API (and the kubelets, with the audit
// on), each to the peers named.
// The rendered policy opens the ports the manager uses; that a manager works
// under it is not run here (no CNI enforces a NetworkPolicy in envtest).
func TestNetworkPolicyIsOffByDefaultAndOpensTheManagersPorts(t *testing.T) {
	assert.Empty(t, render(t).all("NetworkPolicy", ""), "a NetworkPolicy by default")

	objs := render(t, "networkPolicy.enabled=true")
	nps := objs.all("NetworkPolicy", "")
	require.Len(t, nps, 1)
	np := typed[networkingv1.NetworkPolicy](t, nps[0])
	dep := objs.deployment(t)
	sel, err := labels.ValidatedSelectorFromSet(np.Spec.PodSelector.MatchLabels)
	require.NoError(t, err)
	assert.True(t, sel.Matches(labels.Set(dep.Spec.Template.Labels)), "the policy does not select the manager's pods")
	probe := objs.testPod(t)
	assert.False(t, sel.Matches(labels.Set(probe.Labels)), "the policy selects the test Pod")
	assert.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)

	containerPort := func(name string) int {
		for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
			if p.Name == name {
				return int(p.ContainerPort)
			}
		}
		t.Fatalf("no container port %s", name)
		return 0
	}
	assert.Equal(t, [][]int{{containerPort("webhook")}, {containerPort("metrics")}}, rulePorts(np.Spec.Ingress))
	assert.Equal(t, [][]int{{53, 53}, {443, 6443}, {50000}}, egressPorts(np.Spec.Egress))
	for _, in := range np.Spec.Ingress {
		assert.Empty(t, in.From, "no peers named: from anywhere")
	}

	// With the audit on, the kubelets too; peers named are the only ones,
	// and the test Pod may still scrape.
	np = typed[networkingv1.NetworkPolicy](t, render(t, "networkPolicy.enabled=true", "manager.kubeletServingAudit.interval=1h",
		"networkPolicy.talos.to[0].ipBlock.cidr=10.1.0.0/16", "networkPolicy.apiServer.ports={6443}",
		"networkPolicy.metrics.from[0].namespaceSelector.matchLabels.name=monitoring").all("NetworkPolicy", "")[0])
	assert.Equal(t, [][]int{{53, 53}, {6443}, {50000}, {10250}}, egressPorts(np.Spec.Egress))
	assert.Equal(t, "10.1.0.0/16", np.Spec.Egress[2].To[0].IPBlock.CIDR)
	assert.Equal(t, "10.1.0.0/16", np.Spec.Egress[3].To[0].IPBlock.CIDR)
	metricsFrom := np.Spec.Ingress[1].From
	require.Len(t, metricsFrom, 2)
	assert.Equal(t, "monitoring", metricsFrom[0].NamespaceSelector.MatchLabels["name"])
	testSel, err := labels.ValidatedSelectorFromSet(metricsFrom[1].PodSelector.MatchLabels)
	require.NoError(t, err)
	assert.True(t, testSel.Matches(labels.Set(probe.Labels)), "the test Pod may not scrape once peers are named")
}

func rulePorts(rules []networkingv1.NetworkPolicyIngressRule) [][]int {
	var out [][]int
	for _, r := range rules {
		out = append(out, ports(r.Ports))
	}
	return out
}

func egressPorts(rules []networkingv1.NetworkPolicyEgressRule) [][]int {
	var out [][]int
	for _, r := range rules {
		out = append(out, ports(r.Ports))
	}
	return out
}

func ports(ps []networkingv1.NetworkPolicyPort) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.Port.IntValue())
	}
	return out
}

// testPod is the `helm test` hook Pod; there is exactly one.
func (o objects) testPod(t *testing.T) *corev1.Pod {
	t.Helper()
	var pods []*corev1.Pod
	for _, obj := range o.all("Pod", "") {
		if obj.GetAnnotations()["helm.sh/hook"] == "test" {
			pods = append(pods, typed[corev1.Pod](t, obj))
		}
	}
	require.Len(t, pods, 1, "helm test Pods")
	return pods[0]
}

// TestHelmTestProbesTheMetricsWithoutPrivilege: the `helm test` Pod runs the
// manager's own image (ichor probe) against the metrics Service, with no
// ServiceAccount token and the manager's hardening, and is kept when it
// fails so `helm test --logs` shows why.
func TestHelmTestProbesTheMetricsWithoutPrivilege(t *testing.T) {
	objs := render(t, "image.digest=sha256:"+strings.Repeat("b", 64))
	pod := objs.testPod(t)
	dep := objs.deployment(t)
	manager := dep.Spec.Template.Spec.Containers[0]
	require.Len(t, pod.Spec.Containers, 1)
	c := pod.Spec.Containers[0]
	assert.Equal(t, manager.Image, c.Image, "the test runs the manager's image")
	svc := objs.get(t, "Service", release+"-metrics")
	assert.Equal(t, []string{"probe", fmt.Sprintf("http://%s.%s.svc:%d/metrics", svc.GetName(), namespace, 8080), "--contains=ichor_build_info", "--timeout=2m"}, c.Args)
	assert.Equal(t, corev1.RestartPolicyNever, pod.Spec.RestartPolicy)
	require.NotNil(t, pod.Spec.AutomountServiceAccountToken)
	assert.False(t, *pod.Spec.AutomountServiceAccountToken, "the test needs no API access")
	assert.Empty(t, pod.Spec.ServiceAccountName)
	assert.Equal(t, dep.Spec.Template.Spec.SecurityContext, pod.Spec.SecurityContext)
	assert.Equal(t, manager.SecurityContext, c.SecurityContext)
	assert.NotEmpty(t, c.Resources.Limits)
	assert.Equal(t, "before-hook-creation,hook-succeeded", pod.Annotations["helm.sh/hook-delete-policy"])

	assert.Empty(t, render(t, "metrics.service.enabled=false").all("Pod", ""), "a test of a Service not installed")
	assert.Empty(t, render(t, "tests.enabled=false").all("Pod", ""))
}

// minKubeVersion is the first Kubernetes minor that serves each API the
// chart renders. A kind missing here fails TestKubeVersionIsWhatTheChartRenders:
// add it with the version that serves it, and raise kubeVersion if need be.
var minKubeVersion = map[string]string{
	"v1/ConfigMap": "1.0", "v1/Namespace": "1.0", "v1/Pod": "1.0", "v1/Secret": "1.0", "v1/Service": "1.0", "v1/ServiceAccount": "1.0",
	"apps/v1/Deployment":                                               "1.9",
	"rbac.authorization.k8s.io/v1/ClusterRole":                         "1.8",
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding":                  "1.8",
	"rbac.authorization.k8s.io/v1/Role":                                "1.8",
	"rbac.authorization.k8s.io/v1/RoleBinding":                         "1.8",
	"networking.k8s.io/v1/NetworkPolicy":                               "1.7",
	"policy/v1/PodDisruptionBudget":                                    "1.21",
	"apiextensions.k8s.io/v1/CustomResourceDefinition":                 "1.16",
	"admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration":   "1.16",
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":        "1.30",
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding": "1.30",
	// Not Kubernetes': served by the operators they belong to.
	"cert-manager.io/v1/Issuer": "", "cert-manager.io/v1/Certificate": "",
	"monitoring.coreos.com/v1/ServiceMonitor": "", "monitoring.coreos.com/v1/PrometheusRule": "",
}

// TestKubeVersionIsWhatTheChartRenders: Chart.yaml's kubeVersion is the
// newest first version among the APIs the chart renders with every value
// set (ValidatingAdmissionPolicy v1: 1.30), so Helm refuses a cluster that
// could not serve the release rather than fail halfway through it; a
// vendor's pre-release build of that version is admitted.
func TestKubeVersionIsWhatTheChartRenders(t *testing.T) {
	var chart struct {
		KubeVersion string `json:"kubeVersion"`
	}
	require.NoError(t, sigsyaml.Unmarshal(readFile(t, filepath.Join(chartDir(t), "Chart.yaml")), &chart))
	values := filepath.Join(chartDir(t), "testdata", "values-all.yaml")
	var rendered objects
	for _, args := range [][]string{
		{"-f", values},
		{"--set", "webhook.certManager.enabled=true", "--set", "podDisruptionBudget.enabled=true"},
	} {
		out := helm(t, nil, slices.Concat([]string{"template", release, chartDir(t), "--namespace", namespace, "--include-crds"}, monitoringAPIs, args)...)
		rendered = append(rendered, decode(t, out)...)
	}
	floor := version.MustParseGeneric("1.0")
	for _, obj := range rendered {
		gvk := obj.GetAPIVersion() + "/" + obj.GetKind()
		v, ok := minKubeVersion[gvk]
		require.True(t, ok, "the chart renders %s: add the Kubernetes version that serves it to minKubeVersion", gvk)
		if v != "" && floor.LessThan(version.MustParseGeneric(v)) {
			floor = version.MustParseGeneric(v)
		}
	}
	assert.Equal(t, fmt.Sprintf(">=%d.%d.0-0", floor.Major(), floor.Minor()), chart.KubeVersion)

	for kube, admitted := range map[string]bool{
		fmt.Sprintf("v%d.%d.0", floor.Major(), floor.Minor()):            true,
		fmt.Sprintf("v%d.%d.4-eks-1a2b3c", floor.Major(), floor.Minor()): true,
		"v1.37.2": true, // the envtest API server the install tests use
		fmt.Sprintf("v%d.%d.9", floor.Major(), floor.Minor()-1): false,
	} {
		out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--kube-version", kube)
		if admitted {
			assert.NoError(t, err, "kubernetes %s: %s", kube, out)
		} else {
			require.Error(t, err, "kubernetes %s is admitted", kube)
			assert.Contains(t, string(out), "chart requires kubeVersion")
		}
	}
}

// TestEachValueIsOneArgumentAsGiven: a value is the manager's argument as it
// is given, whatever it holds, even past the schema (which refuses
// whitespace in these): one that YAML would read as a map, or one that holds
// a line of its own, was written into the Deployment unquoted, which made it
// invalid, or added an argument of its own (review 24).
func TestEachValueIsOneArgumentAsGiven(t *testing.T) {
	keyID := "a: b"
	path := "/etc/ichor/bundle.tar.gz\n            - --bundle=https://bundles.example/evil.tar.gz"
	out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--skip-schema-validation",
		"--set-string", "manager.bundle.path="+path,
		"--set", "manager.bundle.verification.configMap=bundle-key", "--set-string", "manager.bundle.verification.keyID="+keyID)
	require.NoError(t, err, "%s", out)
	dep := decode(t, out).deployment(t)
	assert.Equal(t, keyID, argValue(t, dep, "--bundle-key-id"))
	var bundles []string
	for _, a := range args(dep) {
		if strings.HasPrefix(a, "--bundle=") {
			bundles = append(bundles, a)
		}
	}
	assert.Equal(t, []string{"--bundle=" + path}, bundles)
}
