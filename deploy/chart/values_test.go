package chart

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
)

// badValues are values the chart once ignored or rendered into nonsense,
// each with what the schema says about it.
var badValues = map[string]string{
	"replicas=5":                "additional properties 'replicas' not allowed",
	"imagee.tag=x":              "additional properties 'imagee' not allowed",
	"replicaCount=two":          "at '/replicaCount': got string, want integer",
	"replicaCount=0":            "at '/replicaCount': minimum",
	"manager.leaderElect=nope":  "at '/manager/leaderElect': got string, want boolean",
	"manager.logLevel=warn":     "at '/manager/logLevel'",
	"manager.logFormat=text":    "at '/manager/logFormat'",
	"manager.leaderElekt=true":  "additional properties 'leaderElekt' not allowed",
	"webhook.port=70000":        "at '/webhook/port': maximum",
	"manager.talosTimeout=10":   "at '/manager/talosTimeout'",
	"monitoring.prometheus=yes": "additional properties 'prometheus' not allowed",
	// Twice the same Role and RoleBinding, which an install refuses as
	// already there (review 189).
	"rbac.secretsNamespaces={team-a,team-a}": "at '/rbac/secretsNamespaces'",
	// Names written into the chart's CEL (review 24: a service account name
	// closed the CEL string) and its objects.
	"serviceAccount.name=x' || 'a' == 'a": "at '/serviceAccount/name'",
	"priorityClassName=High Priority":     "at '/priorityClassName'",
	// Names written into the pod's volumes, unquoted before.
	"manager.bundle.configMap.name=my bundle":            "at '/manager/bundle/configMap/name'",
	"manager.bundle.verification.configMap=Key":          "at '/manager/bundle/verification/configMap'",
	"manager.bundle.verification.sha256=ABC":             "at '/manager/bundle/verification/sha256'",
	"manager.bundle.registryCredentials.secretName=a: b": "at '/manager/bundle/registryCredentials/secretName'",
	"manager.decisionLog.tokenSecret.name=a: b":          "at '/manager/decisionLog/tokenSecret/name'",
	"manager.decisionLog.tokenSecret.key=../token":       "at '/manager/decisionLog/tokenSecret/key'",
	// Counts past what int64 holds rendered 0, the manager's default, in
	// silence (review 26).
	"manager.talosWatch.max=99999999999999999999": "at '/manager/talosWatch/max'",
	// The pods' hardening is not dropped by a value (review 62 L7): null
	// removes a value past a free-form object's check.
	"securityContext=null":                          "missing property 'securityContext'",
	"podSecurityContext=null":                       "missing property 'podSecurityContext'",
	"securityContext.readOnlyRootFilesystem=false":  "at '/securityContext/readOnlyRootFilesystem'",
	"securityContext.allowPrivilegeEscalation=true": "at '/securityContext/allowPrivilegeEscalation'",
	"securityContext.capabilities.drop={NET_RAW}":   "at '/securityContext/capabilities/drop'",
	"securityContext.capabilities.add={NET_ADMIN}":  "at '/securityContext/capabilities/add'",
	// Nor the system-call filter (review 166).
	"podSecurityContext.seccompProfile=null":            "missing property 'seccompProfile'",
	"podSecurityContext.seccompProfile.type=Unconfined": "at '/podSecurityContext/seccompProfile/type'",
	"securityContext.seccompProfile.type=Unconfined":    "at '/securityContext/seccompProfile/type'",
	"securityContext.privileged=true":                   "at '/securityContext/privileged'",
	"podSecurityContext.runAsNonRoot=false":             "at '/podSecurityContext/runAsNonRoot'",
	"podSecurityContext.runAsUser=0":                    "at '/podSecurityContext/runAsUser'",
	"securityContext.runAsNonRoot=false":                "at '/securityContext/runAsNonRoot'",
	"securityContext.runAsUser=0":                       "at '/securityContext/runAsUser'",
	"fullnameOverride=a b":                              "at '/fullnameOverride'",
	"nameOverride=Ichor":                                "at '/nameOverride'",
	"monitoring.grafanaDashboard.namespace=Ops":         "at '/monitoring/grafanaDashboard/namespace'",
	"manager.decisionLog.bufferEvents=1000000001":       "at '/manager/decisionLog/bufferEvents'",
	// Nor the other confinements, nor the root group (review 256 F3).
	"podSecurityContext.appArmorProfile.type=Unconfined": "at '/podSecurityContext/appArmorProfile/type'",
	"securityContext.appArmorProfile.type=Unconfined":    "at '/securityContext/appArmorProfile/type'",
	"podSecurityContext.seLinuxOptions.type=spc_t":       "at '/podSecurityContext/seLinuxOptions/type'",
	"securityContext.seLinuxOptions.type=unconfined_t":   "at '/securityContext/seLinuxOptions/type'",
	"podSecurityContext.runAsGroup=0":                    "at '/podSecurityContext/runAsGroup'",
	"podSecurityContext.fsGroup=0":                       "at '/podSecurityContext/fsGroup'",
	"podSecurityContext.supplementalGroups={1000,0}":     "at '/podSecurityContext/supplementalGroups'",
	"securityContext.runAsGroup=0":                       "at '/securityContext/runAsGroup'",
	// A budget of none, a stop that cuts the decision log's flush short, a
	// shard count of megabytes of alerts.
	"podDisruptionBudget.minAvailable=0%": "at '/podDisruptionBudget/minAvailable'",
	"terminationGracePeriodSeconds=0":     "at '/terminationGracePeriodSeconds'",
	"manager.sharding.shards=1025":        "at '/manager/sharding/shards'",
}

// TestValuesSchemaRefusesWhatTheChartWouldIgnore: a misspelt key, a string
// where a number or a boolean belongs, a value out of range fail helm lint
// and helm template, saying which value is wrong. TestInstallRefusesBadValues
// does the same for helm install.
func TestValuesSchemaRefusesWhatTheChartWouldIgnore(t *testing.T) {
	for set, want := range badValues {
		t.Run(set, func(t *testing.T) {
			for _, cmd := range [][]string{
				{"lint", "--strict", chartDir(t), "--namespace", namespace},
				{"template", release, chartDir(t), "--namespace", namespace},
			} {
				out, err := helmOutput(t, append(cmd, "--set", set)...)
				require.Error(t, err, "helm %s accepted --set %s", cmd[0], set)
				assert.Contains(t, string(out), want, "helm %s", cmd[0])
			}
		})
	}
}

// TestEveryValueIsAccepted: testdata/values-all.yaml sets every value to
// something an operator might write; the schema accepts all of it and the
// chart renders it.
func TestEveryValueIsAccepted(t *testing.T) {
	values := filepath.Join(chartDir(t), "testdata", "values-all.yaml")
	helm(t, nil, "lint", "--strict", chartDir(t), "--namespace", namespace, "-f", values)
	objs := decode(t, helm(t, nil, append([]string{"template", release, chartDir(t), "--namespace", namespace, "-f", values}, monitoringAPIs...)...))
	dep := objs.deployment(t)
	assert.Equal(t, "4", argValue(t, dep, "--zap-log-level"))
	assert.Equal(t, "5000", argValue(t, dep, "--decision-log-buffer-events"))
	assert.NotEmpty(t, objs.all("ServiceMonitor", ""))
	assert.NotEmpty(t, objs.all("PrometheusRule", ""))
}

// TestReplicasNeedLeaderElection: more than one replica without a leader
// would have every replica decide the same CSRs; the render fails and names
// the fix. One replica without it is fine.
func TestReplicasNeedLeaderElection(t *testing.T) {
	out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace, "--set", "replicaCount=3", "--set", "manager.leaderElect=false")
	require.Error(t, err)
	assert.Contains(t, string(out), "replicaCount is 3 but manager.leaderElect is false")
	assert.Contains(t, string(out), "Set manager.leaderElect=true, or replicaCount=1")

	dep := render(t, "replicaCount=1", "manager.leaderElect=false").deployment(t)
	assert.NotContains(t, args(dep), "--leader-elect")
	// Nor two during a rollout, but for the old one's termination (review
	// 256 F2, 258 F2): no surge. Not Recreate, which an upgrade of a release
	// installed before cannot switch to (TestAnUnelectedReleaseUpgrades).
	assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, dep.Spec.Strategy.Type)
	require.NotNil(t, dep.Spec.Strategy.RollingUpdate)
	assert.Equal(t, "0", dep.Spec.Strategy.RollingUpdate.MaxSurge.String())
	assert.Equal(t, "1", dep.Spec.Strategy.RollingUpdate.MaxUnavailable.String())
	assert.Empty(t, render(t).deployment(t).Spec.Strategy.Type, "elected replicas roll as Kubernetes rolls them")
}

// TestTheManagersAccountIsNotTheNamespaceDefault: bound to the manager's
// roles, the namespace's default account would give every pod that names
// no account the manager's rights (review 62 L5).
func TestTheManagersAccountIsNotTheNamespaceDefault(t *testing.T) {
	for _, set := range [][]string{{"serviceAccount.name=default"}, {"serviceAccount.create=false", "serviceAccount.name=default"}} {
		out, err := renderOutput(t, set...)
		require.Error(t, err, "rendered %v", set)
		assert.Contains(t, string(out), "serviceAccount.name: not default")
	}
	render(t, "serviceAccount.create=false", "serviceAccount.name=ichor-manager")
}

// TestTheReleaseNamespaceIsItsOwn: installed into a namespace Kubernetes
// uses, the manager's Role on its namespace's Secrets (and Leases, sharded)
// would reach the bootstrap tokens and the control plane's leader Leases
// (review 62 L1).
func TestTheReleaseNamespaceIsItsOwn(t *testing.T) {
	for _, ns := range []string{"kube-system", "kube-public", "kube-node-lease", "default"} {
		out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", ns)
		require.Error(t, err, "rendered into %s", ns)
		assert.Contains(t, string(out), "the release namespace is "+ns+", which Kubernetes itself uses")
	}
	_, err := helmOutput(t, "template", release, chartDir(t), "--namespace", "ichor-system")
	require.NoError(t, err)
	// Nor is any of them a namespace whose Secrets the manager reads: a
	// Role there reads the bootstrap tokens (review 166).
	for _, ns := range []string{"kube-system", "kube-public", "kube-node-lease", "default"} {
		out, err := renderOutput(t, "rbac.secretsNamespaces={team-a,"+ns+"}")
		require.Error(t, err, "a Secrets Role in %s", ns)
		assert.Contains(t, string(out), "rbac.secretsNamespaces names "+ns+", which Kubernetes itself uses")
	}
	render(t, "rbac.secretsNamespaces={team-a,team-b}")
}

// TestEveryServiceNameIsADNSLabelWhateverTheReleaseName: a release name of
// Helm's most (53 characters) gave Services of 70, which the API server
// refuses part-way through the install (review 189).
func TestEveryServiceNameIsADNSLabelWhateverTheReleaseName(t *testing.T) {
	for _, release := range []string{strings.Repeat("r", 53), strings.Repeat("r", 40) + "-ichor-policy", "ichor"} {
		out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace)
		require.NoError(t, err, "%s", out)
		services := decode(t, out).all("Service", "")
		require.NotEmpty(t, services)
		for _, svc := range services {
			assert.Empty(t, validation.IsDNS1035Label(svc.GetName()), "release %s: Service %s", release, svc.GetName())
		}
	}
	// Release names and namespaces that YAML 1.1 reads as a boolean or null
	// unquoted: every object was refused at the install (review 256 F6).
	for _, release := range []string{"on", "null", "yes"} {
		out, err := helmOutput(t, append([]string{"template", release, chartDir(t), "--namespace", "no",
			"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
			"--set", "monitoring.grafanaDashboard.enabled=true"}, monitoringAPIs...)...)
		require.NoError(t, err, "%s", out)
		objects := decode(t, out)
		require.NotEmpty(t, objects)
		for _, obj := range objects {
			labels, _, err := unstructured.NestedStringMap(obj.Object, "metadata", "labels")
			require.NoError(t, err, "release %s: %s %s", release, obj.GetKind(), obj.GetName())
			if _, ok := labels["app.kubernetes.io/instance"]; ok {
				assert.Equal(t, release, labels["app.kubernetes.io/instance"], "%s %s", obj.GetKind(), obj.GetName())
			}
			if ns, found, err := unstructured.NestedFieldNoCopy(obj.Object, "metadata", "namespace"); found {
				require.NoError(t, err)
				assert.Equal(t, "no", ns, "%s %s", obj.GetKind(), obj.GetName())
			}
		}
		sm := objects.all("ServiceMonitor", "")
		require.Len(t, sm, 1)
		names, _, err := unstructured.NestedSlice(sm[0].Object, "spec", "namespaceSelector", "matchNames")
		require.NoError(t, err)
		assert.Equal(t, []any{"no"}, names)
		require.Len(t, objects.all("ConfigMap", release+"-ichor-policy-dashboard"), 1)
	}
	out, err := helmOutput(t, "template", "ichor", chartDir(t), "--namespace", namespace, "--set", "fullnameOverride=off")
	require.Error(t, err, "fullnameOverride off rendered")
	assert.Contains(t, string(out), "reads as a boolean or null")
	// Names Helm takes that no Service can be named after: refused at once,
	// saying why, not part-way through the install (review 190).
	for _, release := range []string{"1ichor", "a.b"} {
		out, err := helmOutput(t, "template", release, chartDir(t), "--namespace", namespace)
		require.Error(t, err, "release %s rendered", release)
		assert.Contains(t, string(out), "is no DNS label that starts with a letter", release)
	}
}

// TestDisruptionBudgetOnlyWithReplicasToSpare: with one replica,
// minAvailable 1 would block every drain of its node.
func TestDisruptionBudgetOnlyWithReplicasToSpare(t *testing.T) {
	assert.Len(t, render(t).all("PodDisruptionBudget", ""), 1)
	// Replicas running but not ready are evicted whatever the budget:
	// they protect nothing, and would hold every drain (review 189).
	for _, pdb := range render(t).all("PodDisruptionBudget", "") {
		policy, _, _ := unstructured.NestedString(pdb.Object, "spec", "unhealthyPodEvictionPolicy")
		assert.Equal(t, "AlwaysAllow", policy)
	}
	assert.Len(t, render(t, "replicaCount=3").all("PodDisruptionBudget", ""), 1)
	assert.Empty(t, render(t, "replicaCount=1").all("PodDisruptionBudget", ""))
	assert.Empty(t, render(t, "podDisruptionBudget.enabled=false").all("PodDisruptionBudget", ""))
	// A budget that no eviction can meet is refused (review 24).
	for _, set := range [][]string{
		{"replicaCount=2", "podDisruptionBudget.minAvailable=2"},
		{"replicaCount=3", "podDisruptionBudget.minAvailable=100%"},
		// Rounded up, as the eviction API counts it: 2 of 2 (review 25).
		{"replicaCount=2", "podDisruptionBudget.minAvailable=51%"},
	} {
		out, err := renderOutput(t, set...)
		require.Error(t, err, "rendered %v", set)
		assert.Contains(t, string(out), "no pod could ever be evicted")
	}
	assert.Len(t, render(t, "replicaCount=3", "podDisruptionBudget.minAvailable=2").all("PodDisruptionBudget", ""), 1)
	assert.Len(t, render(t, "replicaCount=3", "podDisruptionBudget.minAvailable=50%").all("PodDisruptionBudget", ""), 1)
}

// TestLogLevelAndFormat: the zap flags only when set (empty is the
// manager's default), as given.
func TestLogLevelAndFormat(t *testing.T) {
	assert.NotContains(t, strings.Join(args(render(t).deployment(t)), " "), "--zap-")
	dep := render(t, "manager.logLevel=debug", "manager.logFormat=console").deployment(t)
	assert.Equal(t, "debug", argValue(t, dep, "--zap-log-level"))
	assert.Equal(t, "console", argValue(t, dep, "--zap-encoder"))
	assert.Equal(t, "3", argValue(t, render(t, "manager.logLevel=3").deployment(t), "--zap-log-level"))
	// null removes the value, past the schema: the default, not "<nil>" (review 24).
	assert.NotContains(t, strings.Join(args(render(t, "manager.logLevel=null").deployment(t)), " "), "--zap-")
}

// TestWebhookPortIsOneValue: the flag the manager listens on, the
// container's port and the Service's target are the one value.
func TestWebhookPortIsOneValue(t *testing.T) {
	for port, set := range map[int32][]string{9443: nil, 10443: {"webhook.port=10443"}} {
		objs := render(t, set...)
		dep := objs.deployment(t)
		assert.Equal(t, strconv.Itoa(int(port)), argValue(t, dep, "--webhook-port"))
		assert.Equal(t, port, containerPort(t, dep, "webhook"))
		svc := typed[corev1.Service](t, objs.get(t, "Service", release+"-webhook"))
		require.Len(t, svc.Spec.Ports, 1)
		assert.Equal(t, port, containerPort(t, dep, svc.Spec.Ports[0].TargetPort.StrVal), "the Service's target is not the webhook port")
	}
}

// TestPriorityClass: system-cluster-critical by default, none when unset.
func TestPriorityClass(t *testing.T) {
	assert.Equal(t, "system-cluster-critical", render(t).deployment(t).Spec.Template.Spec.PriorityClassName)
	assert.Empty(t, render(t, "priorityClassName=").deployment(t).Spec.Template.Spec.PriorityClassName)
}

// TestCRDsAreTheGeneratedOnesKeptOnUninstall: the chart renders deploy/crds
// (the files controller-gen generates) as templates, so helm upgrade
// upgrades them, annotated to be kept by helm uninstall; crds.keep and
// crds.install turn that off.
func TestCRDsAreTheGeneratedOnesKeptOnUninstall(t *testing.T) {
	sources, err := filepath.Glob(filepath.Join(root(t), "deploy", "crds", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, sources)
	objs := render(t)
	require.Len(t, objs.all("CustomResourceDefinition", ""), len(sources))
	for _, src := range sources {
		generated := decode(t, readFile(t, src))
		require.Len(t, generated, 1)
		want := typed[apiextensionsv1.CustomResourceDefinition](t, generated[0])
		got := typed[apiextensionsv1.CustomResourceDefinition](t, objs.get(t, "CustomResourceDefinition", want.Name))
		assert.Equal(t, want.Spec, got.Spec, "%s differs from %s", want.Name, src)
		assert.Equal(t, "keep", got.Annotations["helm.sh/resource-policy"], want.Name)
		assert.Equal(t, want.Annotations["controller-gen.kubebuilder.io/version"], got.Annotations["controller-gen.kubebuilder.io/version"])
		assert.Equal(t, "Helm", got.Labels["app.kubernetes.io/managed-by"])
	}
	for _, crd := range render(t, "crds.keep=false").all("CustomResourceDefinition", "") {
		assert.NotContains(t, crd.GetAnnotations(), "helm.sh/resource-policy")
	}
	assert.Empty(t, render(t, "crds.install=false").all("CustomResourceDefinition", ""))
}

// TestCountsAreWrittenAsIntegers: a count in a values file is a number YAML
// reads as a float, which Go writes as 1e+06 from a million: the manager's
// counts are written as integers, as its byte limits are (review 25).
func TestCountsAreWrittenAsIntegers(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	require.NoError(t, os.WriteFile(values, []byte("manager:\n  talosWatch:\n    max: 1000000\n  decisionLog:\n    bufferEvents: 2000000\n"+
		"  tenantServers:\n    maxCSRs: 3000000\n    maxCSRMiB: 4000000\n"), 0o600))
	dep := decode(t, helm(t, nil, "template", release, chartDir(t), "--namespace", namespace, "-f", values)).deployment(t)
	assert.Equal(t, "1000000", argValue(t, dep, "--talos-watch-max"))
	assert.Equal(t, "2000000", argValue(t, dep, "--decision-log-buffer-events"))
	assert.Equal(t, "3000000", argValue(t, dep, "--tenant-max-csrs"))
	assert.Equal(t, "4000000", argValue(t, dep, "--tenant-max-csr-mib"))
}
