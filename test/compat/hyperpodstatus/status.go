// Package hyperpodstatus checks a parent's status the way HyperPod's clients read it: against
// the status schema of HyperPod's published CRDs (../testdata/hyperpod) with no property beyond
// it, and against the status models of HyperPod's Python SDK and `hyp` CLI, which refuse any
// field they do not declare (pydantic, extra="forbid") and then show no status at all.
package hyperpodstatus

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Kinds are the parent kinds whose status HyperPod's clients read.
var Kinds = []string{"InferenceEndpointConfig", "JumpStartModel"}

// Check returns every way status (a parent's .status, as JSON decodes it) would not be read by
// HyperPod's clients: each problem names its path and which reader refuses it. kind is one of
// Kinds.
func Check(kind string, status map[string]any) ([]string, error) {
	schema, err := Published(kind)
	if err != nil {
		return nil, err
	}
	var out []string
	walkSchema(".status", schema, status, &out)
	model, ok := sdkModels[kind]
	if !ok {
		return nil, fmt.Errorf("no SDK status model for kind %q", kind)
	}
	walkModel(".status", model, status, &out)
	return out, nil
}

// Published is the status schema of kind's v1 version in HyperPod's published CRD.
func Published(kind string) (*apiextensionsv1.JSONSchemaProps, error) {
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(here), "..", "testdata", "hyperpod")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(b, crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if crd.Spec.Names.Kind != kind {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Name == "v1" && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
				st, ok := v.Schema.OpenAPIV3Schema.Properties["status"]
				if !ok {
					return nil, fmt.Errorf("%s: v1 has no status schema", f)
				}
				return &st, nil
			}
		}
	}
	return nil, fmt.Errorf("no published CRD of kind %q in %s", kind, dir)
}

// walkSchema checks v against schema s at path: every property is one the schema declares
// (nothing beyond it, at any depth), every required one is there, and each value has the
// schema's type and is one of its enum.
func walkSchema(path string, s *apiextensionsv1.JSONSchemaProps, v any, out *[]string) {
	refuse := func(format string, args ...any) {
		*out = append(*out, fmt.Sprintf("%s: %s (HyperPod's published schema)", path, fmt.Sprintf(format, args...)))
	}
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
		return
	}
	if !hasType(s.Type, v) {
		refuse("%s where the schema has %s", describe(v), s.Type)
		return
	}
	if len(s.Enum) > 0 {
		allowed := make([]string, 0, len(s.Enum))
		for _, e := range s.Enum {
			allowed = append(allowed, strings.Trim(string(e.Raw), `"`))
		}
		if str, ok := v.(string); ok && !slices.Contains(allowed, str) {
			refuse("%q is none of %v", str, allowed)
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for _, r := range s.Required {
			if _, ok := v[r]; !ok {
				refuse("required %s is missing", r)
			}
		}
		for _, k := range sortedKeys(v) {
			p, ok := s.Properties[k]
			switch {
			case ok:
				walkSchema(path+"."+k, &p, v[k], out)
			case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
				walkSchema(path+"."+k, s.AdditionalProperties.Schema, v[k], out)
			default:
				*out = append(*out, fmt.Sprintf("%s.%s: not in HyperPod's published schema", path, k))
			}
		}
	case []any:
		if s.Items != nil && s.Items.Schema != nil {
			for i, e := range v {
				walkSchema(fmt.Sprintf("%s[%d]", path, i), s.Items.Schema, e, out)
			}
		}
	}
}

// hasType reports whether v, as JSON decodes it, is of OpenAPI type t ("" allows any).
func hasType(t string, v any) bool {
	switch t {
	case "":
		return true
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "integer":
		return isInt(v)
	case "number":
		switch v.(type) {
		case float64, int64, int:
			return true
		}
	}
	return false
}

func isInt(v any) bool {
	switch n := v.(type) {
	case int64, int:
		return true
	case float64:
		return n == float64(int64(n))
	}
	return false
}

func describe(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
