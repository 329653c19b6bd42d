package chart

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

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
		{"image.pullPolicy=Sometimes", "/image/pullPolicy"},
		{"priorityClass.preemptionPolicy=Always", "/priorityClass/preemptionPolicy"},
	} {
		cmd := exec.Command(helm, "lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm", "--set", tc.set)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("helm lint --set %s: %v; want it refused, naming %s:\n%s", tc.set, err, tc.want, out)
		}
	}
	// What the install doc sets, and a root given as a path alone, pass.
	runHelm(t, "lint", "--strict", "--kube-version", kubeVersion, "charts/prewarm", "-f", writeValues(t, `
serviceAccount: {agent: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/prewarm-agent"}}}
config:
  cacheRoots: [{path: /opt/dlami/nvme, nodePath: /mnt/nvme}, /local]
  sourceAccess: [{namespaces: ["*"], s3: {bucket: example-bucket}}]
  placement:
    instanceTypes: [{instanceType: ml.g5.24xlarge, nodeSelector: {cloud.google.com/gke-accelerator: nvidia-l4}}]
    extendedResourceTolerations: "on"
`))
}

// The schema's config section and the operator configuration's Go type have the same fields:
// a field added to one and not the other fails here.
func TestSchemaMatchesTheConfiguration(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "charts/prewarm/values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
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
		path := at + "." + name
		*out = append(*out, path)
		goPaths(f.Type, path, out)
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
// the maps of Kubernetes objects (resources) as one value.
func valueLeaves(v map[string]any, at string, out *[]string) {
	for k, x := range v {
		path := strings.TrimPrefix(at+"."+k, ".")
		m, ok := x.(map[string]any)
		if !ok || len(m) == 0 || strings.HasSuffix(path, "resources") || strings.HasSuffix(path, "nodeSelector") {
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
