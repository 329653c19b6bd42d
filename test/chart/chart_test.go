// Package chart tests the Helm chart charts/prewarm with the helm binary hack/testbin.sh builds:
// it lints, it renders, what it renders is accepted by a real API server under strict field
// validation, and with its default values it installs what the kustomize manifests in config/
// install.
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/testutil"
)

const namespace = "hyperpod-inference-system"

var (
	server *testutil.APIServer
	helm   string
	root   string
	// kubeVersion is the Kubernetes the chart is rendered for: the test API server's (a helm
	// built from source otherwise assumes an old default), so make test-oldest renders it for the
	// oldest supported Kubernetes.
	kubeVersion string
)

func TestMain(m *testing.M) {
	if testutil.SkipPackageIfShort() {
		return
	}
	var err error
	if root, err = testutil.ModuleRoot(); err == nil {
		helm, err = helmBinary()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testutil.RunWithAPIServer(versioned{m}, &server))
}

// versioned runs the package's tests with kubeVersion set to the API server's.
type versioned struct{ m *testing.M }

func (r versioned) Run() int {
	var err error
	if kubeVersion, err = server.KubeVersion(); err != nil {
		fmt.Fprintln(os.Stderr, "the API server's version:", err)
		return 1
	}
	fmt.Printf("rendering the chart for Kubernetes %s, the test API server's\n", kubeVersion)
	return r.m.Run()
}

// helmBinary is the helm hack/testbin.sh builds, at the version the script pins.
func helmBinary() (string, error) {
	dir, err := testutil.TestBinDir()
	if err != nil {
		return "", err
	}
	version, err := testutil.TestBinPin("HELM_VERSION")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "helm-"+version)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is not built: run `make testbin` (hack/testbin.sh helm)", path)
	}
	return path, nil
}

// helmCmd is helm with args, run in the module root, with caches and settings of its own.
func helmCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(helm, args...)
	cmd.Dir = root
	// helm keeps caches and settings under these; none of the user's is read.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	return cmd
}

func runHelm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := helmCmd(t, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.Bytes()
}

func TestChartLints(t *testing.T) {
	runHelm(t, "lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm")
	runHelm(t, "lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm", "--set", "serviceMonitor.enabled=true", "--set", "priorityClass.create=false")
	runHelm(t, append([]string{"lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm", "--set", "podMonitor.enabled=true"}, monitoring...)...)
}

// What the chart renders, with its defaults and with every option on, is accepted by the API
// server under strict field validation (the CRDs are installed by the harness, from config/,
// which hack/chart copies into the chart).
func TestRenderedObjectsAreAccepted(t *testing.T) {
	ctx := context.Background()
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(namespace)
	if err := server.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"fsx, credentials and extra args", []string{"-f", writeValues(t, `
config:
  cacheRoots: [/opt/dlami/nvme, /mnt/k8s-disks/0]
  fsx:
    - {fileSystemId: fs-0123456789abcdef0, mountPath: /fsx}
agent:
  envFrom: [{secretRef: {name: prewarm-aws}}]
  extraArgs: ["-v=1"]
controller:
  extraArgs: ["-v=1"]
serviceAccount:
  agent:
    annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/prewarm-agent"}
image:
  pullSecrets: [{name: registry}]
  agent: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
apiPriority:
  enabled: true
networkPolicy:
  metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}, {ipBlock: {cidr: 10.0.0.0/16}}]
`)}},
		{"a private CA, pod metadata and spread", []string{"-f", writeValues(t, `
controller:
  extraEnv: [{name: SSL_CERT_FILE, value: /etc/prewarm-ca/ca-certificates.crt}]
  extraVolumes: [{name: prewarm-ca, configMap: {name: prewarm-ca}}]
  extraVolumeMounts: [{name: prewarm-ca, mountPath: /etc/prewarm-ca, readOnly: true}]
  podLabels: {team: ml-platform}
  podAnnotations: {example.com/owner: ml-platform}
  topologySpreadConstraints:
    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
    - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, minDomains: 2}
agent:
  extraEnv: [{name: SSL_CERT_DIR, value: /etc/prewarm-ca}, {name: HTTPS_PROXY, valueFrom: {secretKeyRef: {name: proxy, key: url}}}]
  extraVolumes: [{name: prewarm-ca, secret: {secretName: prewarm-ca}}]
  extraVolumeMounts: [{name: prewarm-ca, mountPath: /etc/prewarm-ca, readOnly: true}]
  podLabels: {team: ml-platform}
  podAnnotations: {example.com/owner: ml-platform}
`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.args...)
			for _, u := range objs {
				if u.GetKind() == "PriorityClass" {
					// The test harness installs these from config/, which the chart matches
					// (TestChartMatchesKustomize): the API server has taken them.
					if err := server.Client.Get(ctx, client.ObjectKeyFromObject(u), u.DeepCopy()); err != nil {
						t.Errorf("PriorityClass %s: %v", u.GetName(), err)
					}
					continue
				}
				if err := server.Client.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
					t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
				}
			}
		})
	}
}

// The agent mounts each cache root and FSx mount of the configuration, and nothing else of the
// host; the pods restart when the configuration changes (its checksum is on their template).
func TestAgentMountsFollowTheConfiguration(t *testing.T) {
	objs := render(t, "--set", "config.cacheRoots={/opt/dlami/nvme,/mnt/disk1}", "--set", "config.fsx[0].fileSystemId=fs-0123456789abcdef0", "--set", "config.fsx[0].mountPath=/fsx")
	ds := agentObject(t, objs, "DaemonSet")
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	var hostPaths []string
	for _, v := range vols {
		if p, ok, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path"); ok {
			hostPaths = append(hostPaths, p)
		}
	}
	// The kubelet's directories of the CSI node plugin (the pods' volumes, its socket, the
	// registration socket), then the cache roots and FSx mounts of the configuration.
	want := []string{"/var/lib/kubelet/pods", "/var/lib/kubelet/plugins/csi.prewarm.io", "/var/lib/kubelet/plugins_registry", "/opt/dlami/nvme", "/mnt/disk1", "/fsx"}
	if diff := cmp.Diff(want, hostPaths); diff != "" {
		t.Errorf("host paths (-want +got):\n%s", diff)
	}
	// Only the pods' volume directory propagates mounts back to the node.
	ctrs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	mounts, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "volumeMounts")
	for _, m := range mounts {
		mm := m.(map[string]any)
		prop, _ := mm["mountPropagation"].(string)
		if (prop == "Bidirectional") != (mm["mountPath"] == "/var/lib/kubelet/pods") {
			t.Errorf("mount %v: propagation %q; want Bidirectional on /var/lib/kubelet/pods only", mm["mountPath"], prop)
		}
	}
	// The kubelet's configuration file, when the configuration names it: its directory (the
	// drop-ins beside it), or the file alone when it is in the kubelet's directory, read-only.
	for _, tc := range []struct{ file, path, typ string }{
		{"/etc/kubernetes/kubelet/config.json", "/etc/kubernetes/kubelet", "DirectoryOrCreate"},
		{"/var/lib/kubelet/config.yaml", "/var/lib/kubelet/config.yaml", "File"},
	} {
		d := agentObject(t, render(t, "--set", "config.agent.kubelet.configFile="+tc.file), "DaemonSet")
		vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
		i := slices.IndexFunc(vols, func(v any) bool { return v.(map[string]any)["name"] == "kubelet-config" })
		if i < 0 {
			t.Errorf("configFile %s: no kubelet-config volume", tc.file)
			continue
		}
		path, _, _ := unstructured.NestedString(vols[i].(map[string]any), "hostPath", "path")
		typ, _, _ := unstructured.NestedString(vols[i].(map[string]any), "hostPath", "type")
		ctrs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		mounts, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "volumeMounts")
		j := slices.IndexFunc(mounts, func(m any) bool { return m.(map[string]any)["name"] == "kubelet-config" })
		if path != tc.path || typ != tc.typ || j < 0 || mounts[j].(map[string]any)["mountPath"] != tc.path || mounts[j].(map[string]any)["readOnly"] != true {
			t.Errorf("configFile %s: volume %s (%s), mount %v; want %s (%s) mounted read-only at the same path", tc.file, path, typ, mounts, tc.path, tc.typ)
		}
	}
	// A kubelet with another --root-dir: every kubelet path and flag follows.
	moved := agentObject(t, render(t, "--set", "agent.csi.kubeletDir=/data/kubelet"), "DaemonSet")
	ctrs, _, _ = unstructured.NestedSlice(moved.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
	for _, a := range []string{"--kubelet-dir=/data/kubelet", "--csi-endpoint=/data/kubelet/plugins/csi.prewarm.io/csi.sock",
		"--csi-registration=/data/kubelet/plugins_registry/csi.prewarm.io-reg.sock"} {
		if !slices.Contains(args, a) {
			t.Errorf("agent args %v lack %s", args, a)
		}
	}
	sum := func(objs []*unstructured.Unstructured) string {
		d := agentObject(t, objs, "DaemonSet")
		s, _, _ := unstructured.NestedString(d.Object, "spec", "template", "metadata", "annotations", "prewarm.io/config-checksum")
		return s
	}
	if a, b := sum(render(t)), sum(render(t, "--set", "config.agent.maxParallel=4")); a == "" || a == b {
		t.Errorf("config checksum %q, then %q after a configuration change; want it to change", a, b)
	}
}

// With its default values the chart installs what `kubectl apply -k config/default` installs:
// the same objects, with the same content (labels aside, and the configuration compared as the
// object it encodes). The CRDs, RBAC roles and catalog are generated from config/ by hack/chart;
// this holds the hand-written templates to the same.
func TestChartMatchesKustomize(t *testing.T) {
	chart := map[string]*unstructured.Unstructured{}
	for _, u := range render(t, "--include-crds") {
		chart[key(u)] = normalize(t, u)
	}
	kustom := map[string]*unstructured.Unstructured{}
	for _, u := range kustomizeObjects(t) {
		if u.GetKind() == "Namespace" {
			continue // helm install --create-namespace makes it
		}
		kustom[key(u)] = normalize(t, u)
	}
	if diff := cmp.Diff(sortedKeys(kustom), sortedKeys(chart)); diff != "" {
		t.Errorf("objects (-kustomize +chart):\n%s", diff)
	}
	for k, want := range kustom {
		got, ok := chart[k]
		if !ok {
			continue
		}
		if diff := cmp.Diff(want.Object, got.Object); diff != "" {
			t.Errorf("%s (-kustomize +chart):\n%s", k, diff)
		}
	}
}

// The agents' API priority objects are off by default, so not in config/default; the copy in
// config/agent (which make bench-apf applies) is what the chart renders when they are on.
func TestAPIPriorityMatchesItsKustomizeCopy(t *testing.T) {
	got := render(t, "--set", "apiPriority.enabled=true", "--show-only", "templates/flowcontrol.yaml")
	raw, err := os.ReadFile(filepath.Join(root, "config", "agent", "flowcontrol.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*unstructured.Unstructured{}
	for _, u := range decode(t, raw) {
		want[key(u)] = normalize(t, u)
	}
	rendered := map[string]*unstructured.Unstructured{}
	for _, u := range got {
		rendered[key(u)] = normalize(t, u)
	}
	if diff := cmp.Diff(sortedKeys(want), sortedKeys(rendered)); diff != "" {
		t.Fatalf("API priority objects (-config/agent +chart):\n%s", diff)
	}
	for k, w := range want {
		if diff := cmp.Diff(w.Object, rendered[k].Object); diff != "" {
			t.Errorf("%s (-config/agent +chart):\n%s", k, diff)
		}
	}
	for _, u := range render(t) {
		if u.GetAPIVersion() == "flowcontrol.apiserver.k8s.io/v1" {
			t.Errorf("the chart renders %s by default; apiPriority.enabled is off", key(u))
		}
	}
}

func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderIn(t, namespace, args...)
}

// renderIn renders the chart as a release in namespace ns.
func renderIn(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := runHelm(t, append([]string{"template", "prewarm", "charts/prewarm", "--namespace", ns, "--kube-version", kubeVersion}, args...)...)
	return decode(t, out)
}

func writeValues(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func decode(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// kustomizeObjects are the objects config/default lists (its resources, in order: it has no
// patches or generators).
func kustomizeObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config", "default", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	for field := range k {
		if !slices.Contains([]string{"apiVersion", "kind", "resources"}, field) {
			t.Fatalf("config/default/kustomization.yaml has %s; this test reads only its resources", field)
		}
	}
	var out []*unstructured.Unstructured
	for _, res := range k["resources"].([]any) {
		raw, err := os.ReadFile(filepath.Join(root, "config", "default", res.(string)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decode(t, raw)...)
	}
	return out
}

func key(u *unstructured.Unstructured) string {
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// normalize drops what the two installs may differ in by design: labels and annotations (Helm's
// release labels, the configuration checksum), and the configuration's text (compared as the
// object it encodes).
func normalize(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	u = u.DeepCopy()
	u.SetLabels(nil)
	u.SetAnnotations(nil)
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "annotations")
	if u.GetKind() == "ConfigMap" {
		data, _, _ := unstructured.NestedStringMap(u.Object, "data")
		parsed := map[string]any{}
		for k, v := range data {
			var obj any
			if err := yaml.Unmarshal([]byte(v), &obj); err != nil {
				t.Fatalf("%s: data %s: %v", key(u), k, err)
			}
			parsed[k] = obj
		}
		u.Object["data"] = parsed
	}
	return u
}

// agentObject returns the rendered object of kind named prewarm-agent (the DaemonSet, its
// NetworkPolicy, ...).
func agentObject(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	const name = "prewarm-agent"
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func sortedKeys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The agents' NetworkPolicy selects the agents' pods, names only ports they have, and lets the
// peer port be reached from agents' pods alone; with peers off it has no peer rule.
func TestAgentNetworkPolicyFitsTheAgents(t *testing.T) {
	objs := render(t)
	ds := agentObject(t, objs, "DaemonSet")
	np := agentObject(t, objs, "NetworkPolicy")
	podLabels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
	sel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	if len(sel) == 0 {
		t.Fatal("the NetworkPolicy selects every pod of the namespace")
	}
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("the NetworkPolicy selects %s=%s; the agents' pods have %v", k, v, podLabels)
		}
	}
	ctrs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	ports, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "ports")
	named := map[string]bool{}
	for _, p := range ports {
		named[p.(map[string]any)["name"].(string)] = true
	}
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	peerRule := false
	for _, r := range rules {
		rule := r.(map[string]any)
		rp, _, _ := unstructured.NestedSlice(rule, "ports")
		for _, p := range rp {
			name, _ := p.(map[string]any)["port"].(string)
			if !named[name] {
				t.Errorf("the NetworkPolicy opens port %q, which the agent does not have (%v)", name, named)
			}
			if name != "peers" {
				continue
			}
			peerRule = true
			from, _, _ := unstructured.NestedSlice(rule, "from")
			if len(from) != 1 {
				t.Fatalf("the peer port is open from %v; want the agents' pods only", from)
			}
			fromSel, _, _ := unstructured.NestedStringMap(from[0].(map[string]any), "podSelector", "matchLabels")
			if !cmp.Equal(fromSel, sel) {
				t.Errorf("the peer port is open to pods %v; want the agents' %v", fromSel, sel)
			}
		}
	}
	if !peerRule {
		t.Error("the NetworkPolicy has no rule for the peer port: agents could not share")
	}
	for _, r := range agentObject(t, render(t, "--set", "config.peers.disabled=true"), "NetworkPolicy").Object["spec"].(map[string]any)["ingress"].([]any) {
		if strings.Contains(fmt.Sprint(r), "peers") {
			t.Errorf("with peers disabled the NetworkPolicy still opens %v", r)
		}
	}
	for _, u := range render(t, "--set", "networkPolicy.enabled=false") {
		if u.GetKind() == "NetworkPolicy" {
			t.Error("networkPolicy.enabled=false still renders a NetworkPolicy")
		}
	}
}

// The metrics port of the agents and of the controller is reachable only from the peers
// networkPolicy.metricsFrom lists (none by default); health stays open to the kubelet's probes.
func TestMetricsReachableOnlyAsConfigured(t *testing.T) {
	metricsFrom := func(np *unstructured.Unstructured) (rules [][]any, open bool) {
		ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
		for _, r := range ingress {
			rule := r.(map[string]any)
			ports, _, _ := unstructured.NestedSlice(rule, "ports")
			for _, p := range ports {
				if p.(map[string]any)["port"] != "metrics" {
					continue
				}
				from, ok, _ := unstructured.NestedSlice(rule, "from")
				if !ok || len(from) == 0 {
					open = true // a rule with no from admits every source
				}
				rules = append(rules, from)
			}
		}
		return rules, open
	}
	for _, component := range []string{"agent", "controller"} {
		name := "prewarm-" + component
		find := func(objs []*unstructured.Unstructured) *unstructured.Unstructured {
			for _, u := range objs {
				if u.GetKind() == "NetworkPolicy" && u.GetName() == name {
					return u
				}
			}
			t.Fatalf("no NetworkPolicy %s", name)
			return nil
		}
		objs := render(t)
		np := find(objs)
		sel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
		for _, u := range objs {
			if (u.GetKind() == "Deployment" || u.GetKind() == "DaemonSet") && u.GetName() == name {
				labels, _, _ := unstructured.NestedStringMap(u.Object, "spec", "template", "metadata", "labels")
				for k, v := range sel {
					if labels[k] != v {
						t.Errorf("%s selects %s=%s; the pods have %v", name, k, v, labels)
					}
				}
			}
		}
		if rules, open := metricsFrom(np); len(rules) > 0 || open {
			t.Errorf("%s: the metrics port is reachable by default (%v)", name, rules)
		}
		if !strings.Contains(fmt.Sprint(np.Object["spec"]), "port:health") {
			t.Errorf("%s: the health port is closed: the kubelet's probes would fail", name)
		}
		np = find(render(t, "-f", writeValues(t, `
networkPolicy:
  metricsFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
      podSelector: {matchLabels: {app.kubernetes.io/name: prometheus}}
`)))
		rules, open := metricsFrom(np)
		want := []any{map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}},
			"podSelector":       map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "prometheus"}},
		}}
		if open || len(rules) != 1 || !cmp.Equal(rules[0], want) {
			t.Errorf("%s: the metrics port is open to %v; want only %v", name, rules, want)
		}
	}
}

// The knobs of the controller's and agents' pods land where Kubernetes reads them: extra
// environment, volumes and mounts in their container and pod (a private CA bundle, here),
// labels and annotations on the pod template without displacing the selector's labels or the
// configuration's checksum, spread constraints that select the controller's own pods, and
// image digests in place of the tag, in the configuration's agent image too.
func TestPodKnobs(t *testing.T) {
	const agentDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const controllerDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	values := writeValues(t, `
image:
  agent: {digest: `+agentDigest+`}
  controller: {digest: `+controllerDigest+`}
controller:
  extraEnv: [{name: SSL_CERT_FILE, value: /etc/prewarm/ca/ca-certificates.crt}]
  extraVolumes: [{name: ca, configMap: {name: private-ca}}]
  extraVolumeMounts: [{name: ca, mountPath: /etc/prewarm/ca, readOnly: true}]
  podLabels: {team: ml-platform, app.kubernetes.io/component: other}
  podAnnotations: {example.com/owner: ml-platform}
  topologySpreadConstraints:
    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}
agent:
  extraEnv: [{name: SSL_CERT_FILE, value: /etc/prewarm/ca/ca-certificates.crt}]
  extraVolumes: [{name: ca, configMap: {name: private-ca}}]
  extraVolumeMounts: [{name: ca, mountPath: /etc/prewarm/ca, readOnly: true}]
  podLabels: {team: ml-platform}
  podAnnotations: {example.com/owner: ml-platform, prewarm.io/config-checksum: mine}
`)
	objs := render(t, "-f", values)
	for _, kind := range []string{"Deployment", "DaemonSet"} {
		var w *unstructured.Unstructured
		for _, u := range objs {
			if u.GetKind() == kind && strings.HasPrefix(u.GetName(), "prewarm-") {
				w = u
			}
		}
		if w == nil {
			t.Fatalf("no %s", kind)
		}
		component := strings.TrimPrefix(w.GetName(), "prewarm-")
		pod, _, _ := unstructured.NestedMap(w.Object, "spec", "template")
		labels, _, _ := unstructured.NestedStringMap(pod, "metadata", "labels")
		sel, _, _ := unstructured.NestedStringMap(w.Object, "spec", "selector", "matchLabels")
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s: pod label %s=%s; the selector wants %s", kind, k, labels[k], v)
			}
		}
		if labels["team"] != "ml-platform" {
			t.Errorf("%s: pod labels %v lack podLabels' team", kind, labels)
		}
		ann, _, _ := unstructured.NestedStringMap(pod, "metadata", "annotations")
		if ann["example.com/owner"] != "ml-platform" || len(ann["prewarm.io/config-checksum"]) != 64 {
			t.Errorf("%s: pod annotations %v; want podAnnotations' and the configuration's checksum", kind, ann)
		}
		ctrs, _, _ := unstructured.NestedSlice(pod, "spec", "containers")
		ctr := ctrs[0].(map[string]any)
		if img := ctr["image"].(string); !strings.HasSuffix(img, "/"+component+"@"+map[string]string{"agent": agentDigest, "controller": controllerDigest}[component]) {
			t.Errorf("%s: image %s; want it by its digest", kind, img)
		}
		env, _, _ := unstructured.NestedSlice(ctr, "env")
		if !slices.ContainsFunc(env, func(e any) bool { return e.(map[string]any)["name"] == "SSL_CERT_FILE" }) {
			t.Errorf("%s: env %v lacks extraEnv's SSL_CERT_FILE", kind, env)
		}
		mounts, _, _ := unstructured.NestedSlice(ctr, "volumeMounts")
		if !slices.ContainsFunc(mounts, func(m any) bool { return m.(map[string]any)["mountPath"] == "/etc/prewarm/ca" }) {
			t.Errorf("%s: mounts %v lack extraVolumeMounts'", kind, mounts)
		}
		vols, _, _ := unstructured.NestedSlice(pod, "spec", "volumes")
		if !slices.ContainsFunc(vols, func(v any) bool { return v.(map[string]any)["name"] == "ca" }) {
			t.Errorf("%s: volumes %v lack extraVolumes'", kind, vols)
		}
		if kind == "Deployment" {
			spread, _, _ := unstructured.NestedSlice(pod, "spec", "topologySpreadConstraints")
			if len(spread) != 1 {
				t.Fatalf("topologySpreadConstraints %v; want the one set", spread)
			}
			got, _, _ := unstructured.NestedStringMap(spread[0].(map[string]any), "labelSelector", "matchLabels")
			if !cmp.Equal(got, sel) {
				t.Errorf("the spread constraint selects %v; want the controller's pods %v", got, sel)
			}
		}
	}
	cfg := agentConfig(t, objs)
	if !strings.HasSuffix(cfg, "/agent@"+agentDigest) {
		t.Errorf("the configuration's agentImage is %s; want the agent image by its digest", cfg)
	}
	// What these values render the API server takes (the volumes, mounts and spread
	// constraints are Kubernetes objects of their own).
	for _, u := range objs {
		if u.GetKind() != "Deployment" && u.GetKind() != "DaemonSet" {
			continue
		}
		u.SetNamespace("default")
		if err := server.Client.Create(context.Background(), u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
			t.Errorf("%s: %v", key(u), err)
		}
	}
}

// agentConfig is the agent image the rendered operator configuration names.
func agentConfig(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == "ConfigMap" && u.GetName() == "prewarm-config" {
			text, _, _ := unstructured.NestedString(u.Object, "data", "config.yaml")
			var cfg struct {
				Controller struct {
					AgentImage string `json:"agentImage"`
				} `json:"controller"`
			}
			if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
				t.Fatal(err)
			}
			return cfg.Controller.AgentImage
		}
	}
	t.Fatal("no prewarm-config rendered")
	return ""
}

// Every number the chart writes where Kubernetes reads an integer is written as one, however
// large (Helm reads values.yaml's numbers as floats, which print as 1e+06): the rendered text
// has no number in exponent form, and the PriorityClass it renders is one the API server takes.
func TestNumbersRenderAsIntegers(t *testing.T) {
	// From a values file, as users set them (--set parses integers as integers).
	big := writeValues(t, `
priorityClass: {value: 1000000}
controller: {replicas: 1000000, podDisruptionBudget: {maxUnavailable: 1000000}}
agent: {terminationGracePeriodSeconds: 1000000, maxUnavailable: 1000000}
apiPriority: {enabled: true, agentConcurrencyShares: 1000000}
prometheusRule: {enabled: true, evictionsPerHour: 1000000, cacheFailedNodes: 1000000}
config:
  agent: {maxParallel: 1000000}
  controller: {clientBurst: 1000000}
`)
	out := string(runHelm(t, "template", "prewarm", "charts/prewarm", "--namespace", namespace, "--kube-version", kubeVersion, "-f", big))
	if m := regexp.MustCompile(`(?m)^.*[0-9]e\+[0-9]+.*$`).FindAllString(out, -1); len(m) > 0 {
		t.Errorf("numbers in exponent form: %q", m)
	}
	for _, want := range []string{"value: 1000000", "replicas: 1000000", "terminationGracePeriodSeconds: 1000000", "nominalConcurrencyShares: 1000000"} {
		if !strings.Contains(out, want) {
			t.Errorf("the render lacks %q", want)
		}
	}
	for _, u := range decode(t, []byte(out)) {
		if u.GetKind() != "PriorityClass" || u.GetName() != "prewarm-node-agent" {
			continue
		}
		u.SetName("prewarm-integer-check")
		if err := server.Client.Create(context.Background(), u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
			t.Errorf("PriorityClass: %v", err)
		}
		return
	}
	t.Error("no PriorityClass prewarm-node-agent rendered")
}
