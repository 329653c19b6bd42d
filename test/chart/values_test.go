package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/config"
)

// values.schema.json refuses what the chart cannot use: a wrong type fails helm lint (and
// install) with the value's path, as does a misspelt key.
func TestSchemaRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"controller.replicas=two", "/controller/replicas"},
		{"config.cacheRoot=/x", "cacheRoot"},
		{"config.placement.extendedResourceTolerations=maybe", "/config/placement/extendedResourceTolerations"},
		{"config.agent.verifyInterval=daily", "/config/agent/verifyInterval"},
		{"config.peers.port=70000", "/config/peers/port"},
		{`config.agent.kubelet.evictionHard.nodefs\.available=ten`, "/config/agent/kubelet/evictionHard"},
		{"config.agent.kubelet.marginPercent=60", "/config/agent/kubelet/marginPercent"},
		{"image.pullPolicy=Sometimes", "/image/pullPolicy"},
		{"priorityClass.preemptionPolicy=Always", "/priorityClass/preemptionPolicy"},
		{"priorityClass.value=1.5", "/priorityClass/value"},
		// A quantity or a duration the programs cannot parse would crash-loop every agent.
		{"config.agent.reserve=twenty", "/config/agent/reserve"},
		{"config.agent.partSize=-16Mi", "/config/agent/partSize"},
		{"config.namespaceQuotas[0].namespaces[0]=a,config.namespaceQuotas[0].maxBytes=1TB", "/config/namespaceQuotas/0/maxBytes"},
		{"config.s3.budget.maxRate=fast", "/config/s3/budget/maxRate"},
		{"config.peers.wait=soon", "/config/peers/wait"},
		{"config.agent.leaseDuration=3", "/config/agent/leaseDuration"},
		{"config.jumpStart.refresh=hourly", "/config/jumpStart/refresh"},
		{"agent.resources.requests.cpu=half", "/agent/resources/requests/cpu"},
		{"controller.resources.limits.memory=1GB", "/controller/resources/limits/memory"},
		{"agent.maxUnavailable=ten", "/agent/maxUnavailable"},
		{"serviceMonitor.interval=30", "/serviceMonitor/interval"},
		{"prometheusRule.diskFullFor=1 hour", "/prometheusRule/diskFullFor"},
		{"image.agent.digest=latest", "/image/agent/digest"},
		{"controller.topologySpreadConstraints[0].maxSkew=1,controller.topologySpreadConstraints[0].topologyKey=zone,controller.topologySpreadConstraints[0].whenUnsatisfiable=Never", "/controller/topologySpreadConstraints/0/whenUnsatisfiable"},
		{"agent.extraVolumeMounts[0].name=ca,agent.extraVolumeMounts[0].mountPath=etc/ca", "/agent/extraVolumeMounts/0/mountPath"},
	} {
		out, err := helmCmd(t, "lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm", "--set", tc.set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("helm lint --set %s: %v; want it refused, naming %s:\n%s", tc.set, err, tc.want, out)
		}
	}
	// What the install doc sets, and a root given as a path alone, pass.
	runHelm(t, "lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm", "-f", writeValues(t, `
serviceAccount: {agent: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/prewarm-agent"}}}
config:
  cacheRoots: [{path: /opt/dlami/nvme, nodePath: /mnt/k8s-disks/0}, /local]
  agent: {kubelet: {configFile: /etc/kubernetes/kubelet/config.json, evictionHard: {nodefs.available: 20Gi, imagefs.available: 15%}}}
  sourceAccess: [{namespaces: ["*"], s3: {bucket: example-bucket}}]
  placement:
    instanceTypes: [{instanceType: ml.g5.24xlarge, nodeSelector: {cloud.google.com/gke-accelerator: nvidia-l4}}]
    extendedResourceTolerations: "on"
  agent: {reserve: 1.5Ti, partSize: 8388608, verifyRate: 1e9, leaseDuration: 1m30s, mountWait: "0", maxScratchBytes: 0}
  peers: {uploadRate: 500M, wait: 1.5s}
agent:
  resources: {requests: {cpu: 0.5, memory: 512Mi}, limits: {memory: 2G}}
  maxUnavailable: 1
`))
}

// Every quantity and every duration of the operator configuration is checked by the schema as
// one (its definitions' patterns), so that a value the programs cannot parse fails helm lint
// instead of crash-looping the agents: a field of either Go type added without it fails here.
func TestSchemaChecksEveryQuantityAndDuration(t *testing.T) {
	schema := readSchema(t)
	want := map[reflect.Type]string{
		reflect.TypeFor[resource.Quantity](): "#/definitions/quantity",
		reflect.TypeFor[metav1.Duration]():   "#/definitions/duration",
	}
	var fields []typedPath
	goTypedPaths(reflect.TypeFor[config.OperatorConfiguration](), "config", &fields)
	checked := 0
	for _, f := range fields {
		ref, ok := want[f.t]
		if !ok {
			continue
		}
		checked++
		node := schemaAt(schema, f.path)
		if node == nil {
			t.Errorf("values.schema.json has no %s", f.path)
			continue
		}
		if node["$ref"] != ref {
			t.Errorf("values.schema.json: %s is a %s; want {\"$ref\": %q}, has %v", f.path, f.t, ref, node)
		}
	}
	if checked < 20 {
		t.Fatalf("found %d quantities and durations in the configuration; the walk misses some", checked)
	}
}

// readSchema is the chart's values.schema.json.
func readSchema(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "charts/prewarm/values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

type typedPath struct {
	path string
	t    reflect.Type
}

// goTypedPaths lists a struct's JSON fields as dotted paths (slices as []), with their types
// (pointers removed).
func goTypedPaths(t reflect.Type, at string, out *[]typedPath) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			at += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || opaque(at) {
		return
	}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		*out = append(*out, typedPath{at + "." + name, ft})
		goTypedPaths(f.Type, at+"."+name, out)
	}
}

// schemaAt is the schema of a dotted path (as goTypedPaths writes them), or nil.
func schemaAt(s map[string]any, path string) map[string]any {
	for _, part := range strings.Split(path, ".") {
		name, items := strings.CutSuffix(part, "[]")
		s = property(s, name)
		if s != nil && items {
			s, _ = s["items"].(map[string]any)
			if alt := property(s, ""); alt != nil {
				s = alt
			}
		}
		if s == nil {
			return nil
		}
	}
	return s
}

// property is the schema of s's property name (among its oneOf alternatives too); with name
// empty, the alternative that has properties.
func property(s map[string]any, name string) map[string]any {
	if s == nil {
		return nil
	}
	alts := []any{s}
	if list, ok := s["oneOf"].([]any); ok {
		alts = append(alts, list...)
	}
	for _, a := range alts {
		props, ok := a.(map[string]any)["properties"].(map[string]any)
		if !ok {
			continue
		}
		if name == "" {
			return a.(map[string]any)
		}
		if p, ok := props[name].(map[string]any); ok {
			return p
		}
	}
	return nil
}

// The schema's config section and the operator configuration's Go type have the same fields:
// a field added to one and not the other fails here.
func TestSchemaMatchesTheConfiguration(t *testing.T) {
	schema := readSchema(t)
	cfg := schema["properties"].(map[string]any)["config"].(map[string]any)
	var inSchema, inGo []string
	schemaPaths(cfg, "config", &inSchema)
	goPaths(reflect.TypeOf(config.OperatorConfiguration{}), "config", &inGo)
	slices.Sort(inSchema)
	slices.Sort(inGo)
	for _, p := range inGo {
		if !slices.Contains(inSchema, p) {
			t.Errorf("the operator configuration has %s; values.schema.json does not", p)
		}
	}
	for _, p := range inSchema {
		if !slices.Contains(inGo, p) {
			t.Errorf("values.schema.json has %s; the operator configuration does not", p)
		}
	}
}

// schemaPaths lists the object properties of a schema, as dotted paths (array items as []).
func schemaPaths(s map[string]any, at string, out *[]string) {
	if items, ok := s["items"].(map[string]any); ok {
		schemaPaths(items, at+"[]", out)
	}
	for _, alt := range []string{"oneOf", "anyOf"} {
		if list, ok := s[alt].([]any); ok {
			for _, a := range list {
				schemaPaths(a.(map[string]any), at, out)
			}
		}
	}
	props, ok := s["properties"].(map[string]any)
	if !ok {
		return
	}
	for name, p := range props {
		path := at + "." + name
		*out = append(*out, path)
		if ps, ok := p.(map[string]any); ok && !opaque(path) {
			schemaPaths(ps, path, out)
		}
	}
}

// opaque are the configuration's fields of Kubernetes types, which the schema does not spell out.
func opaque(path string) bool {
	return strings.HasSuffix(path, ".tolerations[]") || strings.HasSuffix(path, ".matchExpressions[]") || strings.HasSuffix(path, ".tolerations") || strings.HasSuffix(path, ".matchExpressions")
}

// goPaths lists a struct's JSON fields, as dotted paths.
func goPaths(t reflect.Type, at string, out *[]string) {
	var typed []typedPath
	goTypedPaths(t, at, &typed)
	for _, p := range typed {
		*out = append(*out, p.path)
	}
}

// The chart's README has a row for every value values.yaml sets.
func TestReadmeListsEveryValue(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "charts/prewarm/values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "charts/prewarm/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var leaves []string
	valueLeaves(values, "", &leaves)
	for _, leaf := range leaves {
		if !documented(string(readme), leaf) {
			t.Errorf("charts/prewarm/README.md has no row for %s", leaf)
		}
	}
}

// valueLeaves lists the values a user sets: paths down to scalars, lists and empty maps, and
// the maps of Kubernetes objects (resources, node selectors, affinities) as one value.
func valueLeaves(v map[string]any, at string, out *[]string) {
	for k, x := range v {
		path := strings.TrimPrefix(at+"."+k, ".")
		m, ok := x.(map[string]any)
		if !ok || len(m) == 0 || strings.HasSuffix(path, "resources") || strings.HasSuffix(path, "nodeSelector") || strings.HasSuffix(path, "affinity") {
			*out = append(*out, path)
			continue
		}
		valueLeaves(m, path, out)
	}
}

// documented reports whether the README names path in a row, itself or through a parent's
// wildcard (config.s3.*).
func documented(readme, path string) bool {
	if strings.Contains(readme, "`"+path+"`") {
		return true
	}
	for p := path; strings.Contains(p, "."); {
		p = p[:strings.LastIndex(p, ".")]
		if strings.Contains(readme, "`"+p+".*`") {
			return true
		}
	}
	return false
}

// keda.enabled installs KEDA (its operator and ScaledObject CRD) with the release, as HyperPod's
// chart bundles it; off, as by default, the release holds nothing of KEDA's; the configuration's
// autoscaling block reaches the controller as written.
func TestKEDAIsAnOptionalDependency(t *testing.T) {
	kedaObjects := func(objs []*unstructured.Unstructured) (operator, crd bool) {
		for _, o := range objs {
			switch {
			case o.GetKind() == "Deployment" && o.GetName() == "keda-operator":
				operator = true
			case o.GetKind() == "CustomResourceDefinition" && o.GetName() == "scaledobjects.keda.sh":
				crd = true
			}
		}
		return operator, crd
	}
	if op, crd := kedaObjects(render(t)); op || crd {
		t.Errorf("by default: keda-operator %v, ScaledObject CRD %v; want neither", op, crd)
	}
	if op, crd := kedaObjects(render(t, "--set", "keda.enabled=true")); !op || !crd {
		t.Errorf("keda.enabled=true: keda-operator %v, ScaledObject CRD %v; want both", op, crd)
	}
	values := writeValues(t, "config:\n  autoscaling:\n    prometheus: {serverAddress: \"http://prometheus-operated.monitoring:9090\"}\n    aws: {region: us-west-2}\n")
	for _, o := range render(t, "-f", values) {
		if o.GetKind() != "ConfigMap" || o.GetName() != "prewarm-config" {
			continue
		}
		cfg, _, _ := unstructured.NestedString(o.Object, "data", "config.yaml")
		if !strings.Contains(cfg, "serverAddress: http://prometheus-operated.monitoring:9090") || !strings.Contains(cfg, "region: us-west-2") {
			t.Errorf("config.yaml %s; want the autoscaling block", cfg)
		}
		return
	}
	t.Error("no prewarm-config ConfigMap")
}
