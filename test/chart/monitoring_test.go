package chart

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	promcrds "github.com/prometheus-operator/prometheus-operator/example"
	"github.com/prometheus/prometheus/promql/parser"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/testutil"
)

// monitoring are the values that turn on every monitoring object of the chart.
var monitoring = []string{"--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true",
	"--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring"}

// None of the monitoring objects is rendered unless asked for: they need the Prometheus
// Operator's CRDs, or a Grafana, that a cluster may not have.
func TestMonitoringIsOffByDefault(t *testing.T) {
	for _, u := range render(t) {
		if u.GetAPIVersion() == "monitoring.coreos.com/v1" || u.GetName() == "prewarm-grafana-dashboard" || strings.HasSuffix(u.GetName(), "-metrics") {
			t.Errorf("the chart renders %s by default", key(u))
		}
	}
	// Both scrape objects at once would scrape every pod twice: refused.
	cmd := helmCmd(t, "template", "prewarm", "charts/prewarm", "--kube-version", kubeVersion, "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "choose one") {
		t.Errorf("serviceMonitor and podMonitor both enabled: %v, %s; want refused", err, out)
	}
}

// The ServiceMonitor, the PodMonitor and the PrometheusRule are accepted by an API server that
// has the Prometheus Operator's CRDs (those of the module go.mod pins), under strict field
// validation, in every combination the values allow; the scrape objects select the pods of
// their component and name their metrics port.
func TestMonitorsAndRulesAreAccepted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	installPrometheusOperatorCRDs(ctx, t)
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName("monitored")
	if err := server.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, scrape := range []string{"serviceMonitor", "podMonitor"} {
		t.Run(scrape, func(t *testing.T) {
			objs := renderIn(t, "monitored", append([]string{"--set", scrape + ".enabled=true", "--set", scrape + ".labels.release=kube-prometheus-stack"}, monitoring...)...)
			kinds := map[string]int{}
			pods := map[string]map[string]string{}
			for _, u := range objs {
				if u.GetKind() == "Deployment" || u.GetKind() == "DaemonSet" {
					l, _, _ := unstructured.NestedStringMap(u.Object, "spec", "template", "metadata", "labels")
					pods[l["app.kubernetes.io/component"]] = l
				}
			}
			for _, u := range objs {
				if u.GetAPIVersion() != "monitoring.coreos.com/v1" && u.GetName() != "prewarm-grafana-dashboard" && !strings.HasSuffix(u.GetName(), "-metrics") {
					continue
				}
				kinds[u.GetKind()]++
				if err := server.Client.Create(ctx, u.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict")); err != nil {
					t.Errorf("%s: %v", key(u), err)
				}
				if u.GetKind() == "ServiceMonitor" || u.GetKind() == "PodMonitor" {
					if u.GetLabels()["release"] != "kube-prometheus-stack" {
						t.Errorf("%s lacks the labels of %s.labels: %v", key(u), scrape, u.GetLabels())
					}
					component := strings.TrimPrefix(u.GetName(), "prewarm-")
					sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
					for k, v := range sel {
						if pods[component][k] != v {
							t.Errorf("%s selects %s=%s; the %s's pods have %v", key(u), k, v, component, pods[component])
						}
					}
				}
			}
			want := map[string]int{"PrometheusRule": 1, "ConfigMap": 1}
			if scrape == "serviceMonitor" {
				want["ServiceMonitor"], want["Service"] = 2, 2
			} else {
				want["PodMonitor"] = 2
			}
			if !maps.Equal(kinds, want) {
				t.Errorf("monitoring objects rendered: %v; want %v", kinds, want)
			}
		})
	}
}

// installPrometheusOperatorCRDs creates the Prometheus Operator's ServiceMonitor, PodMonitor and
// PrometheusRule CRDs in the test API server and waits for them to be served.
func installPrometheusOperatorCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	var all bytes.Buffer
	if err := promcrds.PrintAll(&all); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, crd := range decode(t, all.Bytes()) {
		if !slices.Contains([]string{"servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"}, crd.GetName()) {
			continue
		}
		crd.SetResourceVersion("")
		if err := server.Client.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating CRD %s: %v", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	if len(names) != 3 {
		t.Fatalf("the Prometheus Operator's CRDs: found %v", names)
	}
	for _, name := range names {
		if err := testutil.Until(ctx, 2*time.Minute, func() error {
			crd := &unstructured.Unstructured{}
			crd.SetAPIVersion("apiextensions.k8s.io/v1")
			crd.SetKind("CustomResourceDefinition")
			if err := server.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				if m := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return errString("not established yet")
		}); err != nil {
			t.Fatalf("CRD %s: %v", name, err)
		}
	}
}

// Every alert's expression parses as PromQL, selects only series prewarm exports (or the
// scrapes' up), with the job labels the chart's scrape objects give them; its durations and
// thresholds are the values'.
func TestAlertsQueryExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	objs := render(t, append([]string{"--set", "prometheusRule.cacheFailedNodes=3", "--set", "prometheusRule.diskFullFor=45m", "--set", "prometheusRule.evictionsPerHour=1000000"}, monitoring...)...)
	var rule *unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "PrometheusRule" {
			rule = u
		}
	}
	if rule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	jobs := scrapeJobs(t)
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	alerts := map[string]map[string]any{}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			rm := r.(map[string]any)
			name, _ := rm["alert"].(string)
			alerts[name] = rm
			expr, _ := rm["expr"].(string)
			parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
			if err != nil {
				t.Errorf("alert %s: %q does not parse: %v", name, expr, err)
				continue
			}
			for _, sel := range parser.ExtractSelectors(parsed) {
				for _, m := range sel {
					switch {
					case m.Name == "__name__" && m.Value != "up" && !exported[m.Value]:
						t.Errorf("alert %s queries %s, which prewarm does not export", name, m.Value)
					case m.Name == "job" && !slices.Contains(jobs, m.Value):
						t.Errorf("alert %s selects job=%q; the chart's scrape objects set %v", name, m.Value, jobs)
					}
				}
			}
			for _, field := range []string{"summary", "description"} {
				if s, _, _ := unstructured.NestedString(rm, "annotations", field); s == "" {
					t.Errorf("alert %s has no %s", name, field)
				}
			}
		}
	}
	for _, want := range []string{"PrewarmAgentNotReporting", "PrewarmCacheFailedOnNodes", "PrewarmDiskOverHighWatermark", "PrewarmEvictionStorm", "PrewarmBudgetExceeded", "PrewarmOriginThrottling", "PrewarmOriginBudgetExhausted", "PrewarmControllerDown"} {
		if alerts[want] == nil {
			t.Errorf("no alert %s; the rule has %v", want, slices.Sorted(maps.Keys(alerts)))
		}
	}
	if e, _ := alerts["PrewarmCacheFailedOnNodes"]["expr"].(string); !strings.HasSuffix(e, ">= 3") {
		t.Errorf("PrewarmCacheFailedOnNodes: %q; want prometheusRule.cacheFailedNodes (3) as its threshold", e)
	}
	if e, _ := alerts["PrewarmEvictionStorm"]["expr"].(string); !strings.HasSuffix(e, "> 1000000") {
		t.Errorf("PrewarmEvictionStorm: %q; want prometheusRule.evictionsPerHour (1000000) as its threshold, an integer", e)
	}
	if f, _ := alerts["PrewarmDiskOverHighWatermark"]["for"].(string); f != "45m" {
		t.Errorf("PrewarmDiskOverHighWatermark is for %q; want prometheusRule.diskFullFor (45m)", f)
	}
}

// scrapeJobs are the job labels the chart's ServiceMonitors and PodMonitors give their series.
func scrapeJobs(t *testing.T) []string {
	t.Helper()
	var jobs []string
	for _, scrape := range []string{"serviceMonitor", "podMonitor"} {
		for _, u := range render(t, "--set", scrape+".enabled=true") {
			endpoints, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
			pme, _, _ := unstructured.NestedSlice(u.Object, "spec", "podMetricsEndpoints")
			for _, e := range append(endpoints, pme...) {
				relabels, _, _ := unstructured.NestedSlice(e.(map[string]any), "relabelings")
				for _, r := range relabels {
					rm := r.(map[string]any)
					if rm["targetLabel"] == "job" {
						jobs = append(jobs, rm["replacement"].(string))
					}
				}
			}
		}
	}
	if len(jobs) != 4 {
		t.Fatalf("the scrape objects set job on %d endpoints (%v); want both components' in both", len(jobs), jobs)
	}
	return jobs
}

// exportedMetrics are the metric names prewarm's binaries define (the controller's, the
// agent's, the engine's and the peers'), with a histogram's series.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
	name := regexp.MustCompile(`Name:\s+"(prewarm_[a-z_]+)"`)
	for _, dir := range []string{"internal/controller", "internal/agent", "pkg/engine", "pkg/engine/peer"} {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range name.FindAllStringSubmatch(string(src), -1) {
				defined[m[1]] = true
				for _, s := range []string{"_bucket", "_count", "_sum"} {
					defined[m[1]+s] = true
				}
			}
		}
	}
	if len(defined) < 40 {
		t.Fatalf("found only %d metric names: %v", len(defined), defined)
	}
	return defined
}

// The dashboard ConfigMap holds config/monitoring/grafana-dashboard.json as it is, labelled for
// Grafana's sidecar, in the namespace asked for.
func TestDashboardConfigMap(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(root, "config", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		ns    string
		label string
	}{
		{[]string{"--set", "grafanaDashboard.enabled=true"}, namespace, "grafana_dashboard"},
		{[]string{"--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=grafana", "--set", "grafanaDashboard.labels.dashboards=prewarm"}, "grafana", "dashboards"},
	} {
		var cm *unstructured.Unstructured
		for _, u := range render(t, tc.args...) {
			if u.GetKind() == "ConfigMap" && u.GetName() == "prewarm-grafana-dashboard" {
				cm = u
			}
		}
		if cm == nil {
			t.Fatalf("%v: no dashboard ConfigMap", tc.args)
		}
		if cm.GetNamespace() != tc.ns || cm.GetLabels()[tc.label] == "" {
			t.Errorf("%v: the dashboard ConfigMap is in %q with labels %v; want %q, labelled %s", tc.args, cm.GetNamespace(), cm.GetLabels(), tc.ns, tc.label)
		}
		got, _, _ := unstructured.NestedString(cm.Object, "data", "prewarm.json")
		if strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
			t.Errorf("%v: the ConfigMap's prewarm.json differs from config/monitoring/grafana-dashboard.json (run make manifests)", tc.args)
		}
	}
}
