package chart

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"
)

// The API versions prometheus-operator's CRDs serve, as `helm template
// --api-versions` takes them.
var monitoringAPIs = []string{
	"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
	"--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
}

var monitoringOn = []string{"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true"}

// TestMonitoringIsOptInAndNeedsTheOperator: neither the ServiceMonitor nor
// the PrometheusRule by default, nor when enabled on a cluster that does not
// serve prometheus-operator's kinds (the chart still installs there); both
// when enabled where it does, the ServiceMonitor scraping the metrics
// Service's port.
func TestMonitoringIsOptInAndNeedsTheOperator(t *testing.T) {
	for name, objs := range map[string]objects{
		"default":              render(t),
		"default, operator":    renderWith(t, monitoringAPIs),
		"enabled, no operator": render(t, monitoringOn...),
	} {
		assert.Empty(t, objs.all("ServiceMonitor", ""), name)
		assert.Empty(t, objs.all("PrometheusRule", ""), name)
	}

	objs := renderWith(t, monitoringAPIs, append(monitoringOn, "monitoring.serviceMonitor.labels.release=kps",
		"monitoring.serviceMonitor.interval=30s", "monitoring.prometheusRule.labels.release=kps")...)
	sm := objs.get(t, "ServiceMonitor", release)
	assert.Equal(t, "kps", sm.GetLabels()["release"])
	metrics := typed[corev1.Service](t, objs.get(t, "Service", release+"-metrics"))
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	assert.Equal(t, metrics.Labels, mergeLabels(metrics.Labels, selector), "the ServiceMonitor does not select the metrics Service")
	assert.NotContains(t, selector, "app.kubernetes.io/version", "a selector with the version would lose the Service at the next upgrade")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	require.Len(t, endpoints, 1)
	endpoint := endpoints[0].(map[string]any)
	assert.Equal(t, metrics.Spec.Ports[0].Name, endpoint["port"])
	assert.Equal(t, "30s", endpoint["interval"])
	assert.Equal(t, true, endpoint["honorLabels"], "the metrics' own namespace label (the TalosCluster's) must survive the scrape")
	assert.Equal(t, "kps", objs.get(t, "PrometheusRule", release).GetLabels()["release"])

	// A severity is a label's string whatever it reads as in YAML: "on" was
	// rendered unquoted, a boolean the API server refuses in a label (review 24).
	rule := renderWith(t, monitoringAPIs, append(monitoringOn, "monitoring.prometheusRule.severity.warning=on")...).get(t, "PrometheusRule", release)
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	require.NotEmpty(t, groups)
	rules, _, _ := unstructured.NestedSlice(groups[0].(map[string]any), "rules")
	require.NotEmpty(t, rules)
	severities := map[any]bool{}
	for _, r := range rules {
		labels, _, _ := unstructured.NestedMap(r.(map[string]any), "labels")
		severities[labels["severity"]] = true
	}
	assert.True(t, severities["on"], "the severities rendered: %v", severities)
	assert.False(t, severities[true], "a severity rendered as a boolean: %v", severities)

	// The ServiceMonitor scrapes the Service: without it, the render says so.
	out, err := helmOutput(t, append([]string{"template", release, chartDir(t), "--namespace", namespace, "--set", "monitoring.serviceMonitor.enabled=true",
		"--set", "metrics.service.enabled=false"}, monitoringAPIs...)...)
	require.Error(t, err)
	assert.Contains(t, string(out), "monitoring.serviceMonitor.enabled needs metrics.service.enabled")
}

// mergeLabels is a with b's labels over it.
func mergeLabels(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// rule is an alerting rule of the PrometheusRule.
type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

// alertGroups are the rule groups of the chart's PrometheusRule, rendered
// with the values set.
func alertGroups(t *testing.T, set ...string) []ruleGroup {
	t.Helper()
	objs := renderWith(t, monitoringAPIs, append(slices.Clone(monitoringOn), set...)...)
	spec, ok := objs.get(t, "PrometheusRule", release).Object["spec"].(map[string]any)
	require.True(t, ok)
	data, err := sigsyaml.Marshal(spec["groups"])
	require.NoError(t, err)
	var groups []ruleGroup
	require.NoError(t, sigsyaml.UnmarshalStrict(data, &groups), "the PrometheusRule holds something other than alerting rules")
	require.NotEmpty(t, groups)
	return groups
}

// definedMetrics are the names of the metrics the manager's code defines
// (Name: "ichor_..." in engine, controllers, webhook and internal/shard),
// with the series a histogram adds.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	name := regexp.MustCompile(`Name:\s+"(ichor_[a-z0-9_]+)"`)
	histogram := regexp.MustCompile(`prometheus\.NewHistogram(Vec)?\(prometheus\.HistogramOpts\{\s*Name:\s+"(ichor_[a-z0-9_]+)"`)
	out := map[string]bool{}
	for _, dir := range []string{"engine", "controllers", "webhook", filepath.Join("internal", "shard")} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root(t), dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src := readFile(t, path)
			for _, m := range name.FindAllSubmatch(src, -1) {
				out[string(m[1])] = true
			}
			for _, m := range histogram.FindAllSubmatch(src, -1) {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					out[string(m[2])+suffix] = true
				}
			}
			return nil
		}))
	}
	require.Contains(t, out, "ichor_kubelet_serving_pending_csrs", "the metric definitions were not found")
	return out
}

// TestAlertRules checks the rules without Prometheus: the alerts an operator
// needs are there, every expression reads only metrics the manager defines
// (a renamed metric would leave an alert that never fires), every duration
// parses, every alert has a severity and says what to do, and the values
// reach the expressions.
func TestAlertRules(t *testing.T) {
	defined := definedMetrics(t)
	metric := regexp.MustCompile(`\bichor_[a-z0-9_]+`)
	var alerts []string
	for _, g := range alertGroups(t, shardingOn...) {
		assert.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "a rule that is not an alert: %+v", r)
			alerts = append(alerts, r.Alert)
			names := metric.FindAllString(r.Expr, -1)
			if r.Alert != "IchorManagerAbsent" {
				assert.NotEmpty(t, names, "%s reads no ichor metric: %s", r.Alert, r.Expr)
			}
			for _, n := range names {
				assert.True(t, defined[n], "%s reads %s, which the manager does not define", r.Alert, n)
			}
			assert.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), "%s: unbalanced parentheses", r.Alert)
			for _, d := range regexp.MustCompile(`\[([^\]]+)\]|offset ([0-9a-z]+)`).FindAllStringSubmatch(r.Expr, -1) {
				_, err := model.ParseDuration(d[1] + d[2])
				assert.NoError(t, err, "%s: range or offset %q", r.Alert, d[0])
			}
			if r.For != "" {
				_, err := model.ParseDuration(r.For)
				assert.NoError(t, err, "%s: for", r.Alert)
			}
			assert.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], r.Alert)
			for _, a := range []string{"summary", "description", "runbook_url"} {
				assert.NotEmpty(t, r.Annotations[a], "%s has no %s", r.Alert, a)
			}
		}
	}
	for _, want := range []string{
		"IchorKubeletServingCSRPending", "IchorPolicyBundleRefused", "IchorDecisionLogEntriesDropped",
		"IchorDecisionLogUploadDropped", "IchorWebhookCertificateExpiring", "IchorTalosIdentityReadsFailing",
		"IchorManagerAbsent", "IchorKubeletServingAuditStale", "IchorShardUnheld", "IchorShardReplicasMissing",
	} {
		assert.Contains(t, alerts, want)
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(alerts))), len(alerts), "an alert name is used twice")

	// The values reach the rules.
	byName := func(groups []ruleGroup, name string) rule {
		for _, g := range groups {
			for _, r := range g.Rules {
				if r.Alert == name {
					return r
				}
			}
		}
		t.Fatalf("no alert %s", name)
		return rule{}
	}
	// The manager's absence is read from the job the chart's own
	// ServiceMonitor scrapes: the metrics Service's name (no jobLabel).
	defaults := alertGroups(t)
	absent := byName(defaults, "IchorManagerAbsent")
	assert.Equal(t, `absent(up{job="`+release+`-metrics", namespace="`+namespace+`"} == 1)`, absent.Expr)
	assert.Equal(t, "10m", absent.For)
	assert.Equal(t, "critical", absent.Labels["severity"])
	sm := renderWith(t, monitoringAPIs, monitoringOn...).get(t, "ServiceMonitor", release)
	_, hasJobLabel, _ := unstructured.NestedString(sm.Object, "spec", "jobLabel")
	assert.False(t, hasJobLabel, "a jobLabel changes the job IchorManagerAbsent watches")
	render(t).get(t, "Service", release+"-metrics")
	// The audit is stale after three of its intervals by default.
	assert.Equal(t, "time() - max(ichor_kubelet_serving_audit_last_success_timestamp_seconds) > 3 * max(ichor_kubelet_serving_audit_interval_seconds)",
		byName(defaults, "IchorKubeletServingAuditStale").Expr)

	groups := alertGroups(t, "monitoring.prometheusRule.csrPendingMinutes=45", "monitoring.prometheusRule.certificateExpiryDays=14",
		"monitoring.prometheusRule.severity.critical=page", "monitoring.prometheusRule.additionalLabels.team=platform",
		"monitoring.prometheusRule.managerAbsentMinutes=20", "monitoring.prometheusRule.managerJob=kubernetes-pods",
		"monitoring.prometheusRule.auditStaleMinutes=90")
	assert.Equal(t, "45m", byName(groups, "IchorKubeletServingCSRPending").For)
	assert.Equal(t, "20m", byName(groups, "IchorManagerAbsent").For)
	assert.Contains(t, byName(groups, "IchorManagerAbsent").Expr, `up{job="kubernetes-pods", namespace="`+namespace+`"}`)
	assert.Equal(t, "time() - max(ichor_kubelet_serving_audit_last_success_timestamp_seconds) > 90 * 60",
		byName(groups, "IchorKubeletServingAuditStale").Expr)
	assert.Contains(t, byName(groups, "IchorWebhookCertificateExpiring").Expr, "< 14 * 86400")
	shardAlerts(t, defaults, groups, byName)
	assert.Equal(t, "page", byName(groups, "IchorPolicyBundleRefused").Labels["severity"])
	assert.Equal(t, "platform", byName(groups, "IchorTalosIdentityReadsFailing").Labels["team"])
	// Written after each alert's own severity, an added one replaced it in
	// silence (review 256 F4).
	out, err := renderOutput(t, "monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.additionalLabels.severity=info")
	require.Error(t, err, "an added severity rendered")
	assert.Contains(t, string(out), "monitoring.prometheusRule.additionalLabels has severity")
	render(t, "monitoring.prometheusRule.additionalLabels.severity=info") // the rule off: a value left over fails nothing
}

// TestAlertsNeedTheirScrape (review 166): the alerts read the job the
// chart's ServiceMonitor scrapes; with no ServiceMonitor and no job named,
// nothing is scraped under that job and IchorManagerAbsent would fire for
// ever. Refused at render, saying what to set.
func TestAlertsNeedTheirScrape(t *testing.T) {
	out, err := helmOutput(t, append([]string{"template", release, chartDir(t), "--namespace", namespace,
		"--set", "monitoring.prometheusRule.enabled=true"}, monitoringAPIs...)...)
	require.Error(t, err)
	assert.Contains(t, string(out), "monitoring.prometheusRule.enabled without monitoring.serviceMonitor.enabled")
	groups := alertGroups(t, "monitoring.serviceMonitor.enabled=false", "monitoring.prometheusRule.managerJob=kubernetes-pods")
	assert.NotEmpty(t, groups)
}

// shardingOn turns sharding on for the alert tests: four shards among the
// default two replicas, as testdata/alerts_test.yaml has them.
var shardingOn = []string{"manager.sharding.shards=4"}

// shardAlerts: the sharding's alerts are there only with sharding on, read
// this release's replicas, and take the configured shards and replicas and
// their values.
func shardAlerts(t *testing.T, defaults, customised []ruleGroup, byName func([]ruleGroup, string) rule) {
	t.Helper()
	for _, groups := range [][]ruleGroup{defaults, customised} {
		for _, g := range groups {
			for _, r := range g.Rules {
				assert.NotContains(t, r.Alert, "Shard", "a sharding alert without sharding")
			}
		}
	}
	on := alertGroups(t, shardingOn...)
	unheld := byName(on, "IchorShardUnheld")
	sel := `job="` + release + `-metrics", namespace="` + namespace + `"`
	assert.Equal(t, `4 - (count(count by (shard) (ichor_shard_held{`+sel+`, shard=~"0|1|2|3"} == 1)) or vector(0)) > 0`, unheld.Expr)
	assert.Equal(t, "5m", unheld.For)
	assert.Equal(t, "critical", unheld.Labels["severity"])
	missing := byName(on, "IchorShardReplicasMissing")
	assert.Equal(t, `(min(ichor_shard_live_replicas{`+sel+`}) or vector(0)) < 2`, missing.Expr)
	assert.Equal(t, "15m", missing.For)
	assert.Equal(t, "warning", missing.Labels["severity"])

	set := alertGroups(t, "manager.sharding.shards=12", "replicaCount=3", "monitoring.prometheusRule.managerJob=kubernetes-pods",
		"monitoring.prometheusRule.shardUnheldMinutes=2", "monitoring.prometheusRule.shardReplicasMissingMinutes=30",
		"monitoring.prometheusRule.additionalLabels.team=platform")
	unheld, missing = byName(set, "IchorShardUnheld"), byName(set, "IchorShardReplicasMissing")
	assert.True(t, strings.HasPrefix(unheld.Expr, `12 - (count(count by (shard) (ichor_shard_held{job="kubernetes-pods", namespace="`+namespace+`", shard=~"0|1|2|3|4|5|6|7|8|9|10|11"}`), unheld.Expr)
	assert.Equal(t, "2m", unheld.For)
	assert.True(t, strings.HasSuffix(missing.Expr, ") < 3"), missing.Expr)
	assert.Equal(t, "30m", missing.For)
	assert.Equal(t, "platform", missing.Labels["team"])
}

// TestAlertsFire runs testdata/alerts_test.yaml with promtool: every alert
// (the sharding's included) fires from synthetic series, and the near
// misses do not. promtool is $PROMTOOL; `make chart-test` (and so `make
// test`) and `make alerts-test` build the one pinned in tools/promtool (a
// cold build takes minutes, once).
func TestAlertsFire(t *testing.T) {
	promtool := os.Getenv("PROMTOOL")
	if promtool == "" {
		t.Skip("PROMTOOL is not set; `make alerts-test` runs this test with the pinned promtool")
	}
	dir := t.TempDir()
	// Sharding on, so that its alerts are tested too.
	groups := alertGroups(t, shardingOn...)
	write := func(name string, groups []ruleGroup) {
		data, err := sigsyaml.Marshal(map[string]any{"groups": groups})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	write("checked.yaml", groups)
	out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "checked.yaml")).CombinedOutput() //nolint:gosec // G702: $PROMTOOL is the promtool make alerts-test built
	require.NoError(t, err, "promtool check rules:\n%s", out)

	// The unit tests compare labels; annotations are text, checked above.
	for i := range groups {
		for j := range groups[i].Rules {
			groups[i].Rules[j].Annotations = nil
		}
	}
	write("rules.yaml", groups)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), readFile(t, filepath.Join(chartDir(t), "testdata", "alerts_test.yaml")), 0o600))
	out, err = exec.Command(promtool, "test", "rules", filepath.Join(dir, "alerts_test.yaml")).CombinedOutput() //nolint:gosec // G702: as above
	require.NoError(t, err, "promtool test rules:\n%s", out)
	t.Logf("promtool test rules:\n%s", out)

	// Every alert is exercised by the unit tests.
	tests := string(readFile(t, filepath.Join(chartDir(t), "testdata", "alerts_test.yaml")))
	for _, g := range groups {
		for _, r := range g.Rules {
			assert.Contains(t, tests, "alertname: "+r.Alert, "testdata/alerts_test.yaml does not fire %s", r.Alert)
		}
	}
}

// TestGrafanaDashboard: off by default; on, a ConfigMap for the Grafana
// sidecar holding JSON whose every query reads metrics the manager defines.
func TestGrafanaDashboard(t *testing.T) {
	assert.Empty(t, render(t).all("ConfigMap", release+"-dashboard"))
	cm := typed[corev1.ConfigMap](t, render(t, "monitoring.grafanaDashboard.enabled=true").get(t, "ConfigMap", release+"-dashboard"))
	assert.Equal(t, "1", cm.Labels["grafana_dashboard"])
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal([]byte(cm.Data["ichor-policy.json"]), &dashboard))
	require.NotEmpty(t, dashboard.Panels)
	defined := definedMetrics(t)
	metric := regexp.MustCompile(`\bichor_[a-z0-9_]+`)
	for _, p := range dashboard.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, target := range p.Targets {
			names := metric.FindAllString(target.Expr, -1)
			assert.NotEmpty(t, names, "%s: %s", p.Title, target.Expr)
			for _, n := range names {
				assert.True(t, defined[n], "panel %q reads %s, which the manager does not define", p.Title, n)
			}
		}
	}
}
