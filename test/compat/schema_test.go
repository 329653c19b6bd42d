// Package compat checks that prewarm's API is a superset of the HyperPod inference operator's
// published one (testdata/hyperpod): the schemas field by field here, and manifests against a
// real API server in manifests_test.go.
package compat

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// deliberate are the differences between prewarm's schema and the published one that prewarm
// means, each with its reason; docs/hyperpod-compatibility.md explains them to users. A key is
// "<path> <keyword>": a path ending in "*" covers everything under it, and the keyword
// "validation" covers every keyword that only constrains values (not a missing path, nor a
// type, format, enum or default). Anything else that differs fails the test.
var deliberate = map[string]string{
	// Stricter, where the value could never work, with a message that says why.
	". required": "an object without a spec describes nothing to serve",
	".spec x-kubernetes-validations": "an InferenceEndpointConfig needs a place to run: instanceType, instanceTypes or " +
		"nodeAffinity (without one, a weights cache would be asked of every node of the cluster); a ModelWeightsCacheConfig " +
		"needs the storage block of its source type unless jumpStartModel names the model, and cannot cache a kubernetesVolume",
	".spec.modelSourceConfig x-kubernetes-validations": "a source type needs its storage block (s3Storage, fsxStorage, " +
		"huggingFaceModel); an fsx modelLocation must not climb out of the file system with '..'",
	".spec.modelCacheConfig.weightsCache.hostPath x-kubernetes-validations": "a node directory must be an absolute path " +
		"other than /, without '..' or control characters",
	".spec.hostPath x-kubernetes-validations": "a ModelWeightsCacheConfig's node directory must be an absolute path other " +
		"than /, without '..' or control characters",
	".spec.modelSourceConfig.huggingFaceModel.modelId x-kubernetes-validations": "a Hub repository id never contains '..'",
	".spec.replicas minimum": "a negative number of pods cannot be run",

	// Status is written by prewarm alone: its extra constraints keep it within the API's limits.
	".status* validation": "status is written by prewarm alone; its extra limits keep it within the API's",
}

// publishedKinds are the plurals of every CRD in HyperPod's published chart (testdata/hyperpod).
var publishedKinds = []string{"inferenceendpointconfigs", "jumpstartmodels", "modelweightscacheconfigs", "modelimagecaches", "sagemakerendpointregistrations"}

// compared are the schema keywords that must agree.
var compared = []string{
	"type", "format", "enum", "default", "nullable", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
	"pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
	"required", "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-list-map-keys",
}

// Every published path is in prewarm's schema alike, but for the deliberate differences; and
// every deliberate difference still exists (an entry that no longer matches anything goes).
func TestSchemasAreSupersetsOfTheirPublishedOnes(t *testing.T) {
	used := map[string]bool{}
	for _, kind := range publishedKinds {
		published := readCRD(t, filepath.Join("testdata", "hyperpod", "inference.sagemaker.aws.amazon.com_"+kind+".yaml"))
		ours := readCRD(t, filepath.Join("..", "..", "config", "crd", "bases", "inference.sagemaker.aws.amazon.com_"+kind+".yaml"))
		for _, pv := range published.Spec.Versions {
			t.Run(kind+"/"+pv.Name, func(t *testing.T) {
				ov := version(ours, pv.Name)
				if ov == nil || !ov.Served {
					t.Fatalf("prewarm does not serve %s %s", kind, pv.Name)
				}
				for _, d := range schemaDiffs(pv.Schema.OpenAPIV3Schema, ov.Schema.OpenAPIV3Schema) {
					if k, ok := allowed(d.key()); ok {
						used[k] = true
						continue
					}
					t.Errorf("%s: published %s, prewarm %s", d.key(), d.published, d.ours)
				}
			})
		}
	}
	for k := range deliberate {
		if !used[k] {
			t.Errorf("deliberate difference %q matches nothing any more; remove it (and its line in the docs)", k)
		}
	}
}

type schemaDiff struct {
	path, keyword   string
	published, ours string
}

func (d schemaDiff) key() string { return d.path + " " + d.keyword }

func allowed(key string) (string, bool) {
	if _, ok := deliberate[key]; ok {
		return key, true
	}
	path, keyword, _ := strings.Cut(key, " ")
	for k := range deliberate {
		kp, kk, _ := strings.Cut(k, " ")
		prefix, wild := strings.CutSuffix(kp, "*")
		pathOK := path == kp || (wild && strings.HasPrefix(path, prefix))
		keywordOK := keyword == kk || (kk == "validation" && !slices.Contains(shape, keyword))
		if pathOK && keywordOK {
			return k, true
		}
	}
	return "", false
}

// shape are the differences no deliberate entry of kind "validation" covers.
var shape = []string{"(path)", "type", "format", "enum", "default", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}

// schemaDiffs lists, for every path of the published schema, what prewarm's lacks or has
// otherwise. Paths only prewarm has are additions, and fine (their being optional is checked
// through their parent's required list).
func schemaDiffs(published, ours *apiextensionsv1.JSONSchemaProps) []schemaDiff {
	pub, our := map[string]*apiextensionsv1.JSONSchemaProps{}, map[string]*apiextensionsv1.JSONSchemaProps{}
	walk(published, ".", pub)
	walk(ours, ".", our)
	var out []schemaDiff
	var missing []string
	for _, path := range slices.Sorted(maps.Keys(pub)) {
		if slices.ContainsFunc(missing, func(m string) bool { return strings.HasPrefix(path, m) }) {
			continue // under a path already reported missing
		}
		o, ok := our[path]
		if !ok {
			missing = append(missing, path)
			out = append(out, schemaDiff{path, "(path)", "present", "missing"})
			continue
		}
		p := keywords(pub[path])
		q := keywords(o)
		for _, k := range compared {
			if p[k] != q[k] {
				out = append(out, schemaDiff{path, k, orNone(p[k]), orNone(q[k])})
			}
		}
	}
	return out
}

func walk(s *apiextensionsv1.JSONSchemaProps, path string, out map[string]*apiextensionsv1.JSONSchemaProps) {
	out[path] = s
	sep := "."
	if path == "." {
		sep = ""
	}
	for name, p := range s.Properties {
		walk(&p, path+sep+name, out)
	}
	if s.Items != nil && s.Items.Schema != nil {
		walk(s.Items.Schema, path+"[]", out)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		walk(s.AdditionalProperties.Schema, path+"{}", out)
	}
}

// patternTwin reports whether rule is the node's own pattern as a CEL rule, there only for its
// message, which says what to write. It refuses only what the pattern refuses (both are Go's
// RE2, matched anywhere in the value), and it leaves values over 64 Ki characters to the pattern
// alone, so that no value the pattern accepts is refused for the rule's cost: the set of
// accepted objects is the same.
func patternTwin(rule, pattern any) bool {
	p, ok := pattern.(string)
	return ok && rule == "size(self) > 65536 || self.matches(r'"+p+"')"
}

// keywords renders the compared keywords of one schema node, canonically: enums and required
// lists as sorted sets, rules as their rule and message.
func keywords(s *apiextensionsv1.JSONSchemaProps) map[string]string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	out := map[string]string{}
	for _, k := range compared {
		v, ok := m[k]
		if !ok {
			continue
		}
		switch k {
		case "enum", "required":
			var items []string
			for _, x := range v.([]any) {
				items = append(items, fmt.Sprint(x))
			}
			sort.Strings(items)
			v = items
		case "x-kubernetes-validations":
			var rules []string
			for _, r := range v.([]any) {
				r := r.(map[string]any)
				if patternTwin(r["rule"], m["pattern"]) {
					continue
				}
				rules = append(rules, fmt.Sprintf("%v (%v)", r["rule"], r["message"]))
			}
			if len(rules) == 0 {
				continue
			}
			v = rules
		}
		if b, ok := v.(bool); ok && !b && k != "default" {
			continue // false is the absence of the keyword
		}
		enc, _ := json.Marshal(v)
		out[k] = string(enc)
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func readCRD(t *testing.T, path string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(b, crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return crd
}

func version(crd *apiextensionsv1.CustomResourceDefinition, name string) *apiextensionsv1.CustomResourceDefinitionVersion {
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Name == name {
			return &crd.Spec.Versions[i]
		}
	}
	return nil
}
