package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// UnmarshalJSON takes a root as an object, or as a path alone.
func (r *CacheRoot) UnmarshalJSON(b []byte) error {
	var p string
	if err := json.Unmarshal(b, &p); err == nil {
		*r = CacheRoot{Path: p}
		return nil
	}
	type plain CacheRoot
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var v plain
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("a cache root is a path, or {path, nodePath, allowRootFilesystem, highWatermarkPercent, lowWatermarkPercent}: %w", err)
	}
	*r = CacheRoot(v)
	return nil
}

// Load reads the configuration at path; an empty path is the default configuration. Unknown
// fields are refused, so a misspelt key is an error and not a silent default.
func Load(path string) (OperatorConfiguration, error) {
	if path == "" {
		return Default(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return OperatorConfiguration{}, fmt.Errorf("reading the operator configuration: %w", err)
	}
	return Parse(b)
}

// Parse reads a configuration file's content: strictly (an unknown field is an error), with the
// defaults filled in, and validated.
func Parse(b []byte) (OperatorConfiguration, error) {
	var o OperatorConfiguration
	if err := yaml.UnmarshalStrict(b, &o); err != nil {
		if fe := badValue(b); fe != nil {
			return OperatorConfiguration{}, fmt.Errorf("operator configuration: %w", fe)
		}
		return OperatorConfiguration{}, fmt.Errorf("operator configuration: %w", err)
	}
	if (o.Kind != "" && o.Kind != Kind) || (o.APIVersion != "" && o.APIVersion != APIVersion) {
		return OperatorConfiguration{}, fmt.Errorf("operator configuration: want kind %s, apiVersion %s; got %s, %s", Kind, APIVersion, o.Kind, o.APIVersion)
	}
	o.defaults()
	if err := o.Validate(); err != nil {
		return OperatorConfiguration{}, fmt.Errorf("operator configuration: %w", err)
	}
	return o, nil
}

var (
	durationType = reflect.TypeFor[metav1.Duration]()
	quantityType = reflect.TypeFor[resource.Quantity]()
)

// badValue finds, in a file that did not decode, a duration or size that does not parse, and
// names its field: the decoder's own error does not say where it is.
func badValue(b []byte) *field.Error {
	var raw map[string]any
	if yaml.Unmarshal(b, &raw) != nil {
		return nil
	}
	return badValueIn(reflect.TypeFor[OperatorConfiguration](), raw, nil)
}

func badValueIn(t reflect.Type, v any, path *field.Path) *field.Error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		if s, ok := v.(string); !ok || !validDuration(s) {
			return field.Invalid(path, v, "want a duration such as 30s, 30m or 24h")
		}
	case t == quantityType:
		if _, err := resource.ParseQuantity(fmt.Sprint(v)); err != nil {
			return field.Invalid(path, v, "want a size such as 16Mi or 20Gi")
		}
	case t.Kind() == reflect.Slice:
		list, _ := v.([]any)
		for i, e := range list {
			if fe := badValueIn(t.Elem(), e, path.Index(i)); fe != nil {
				return fe
			}
		}
	case t.Kind() == reflect.Struct:
		m, _ := v.(map[string]any)
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if e, ok := m[name]; ok && name != "" {
				child := field.NewPath(name)
				if path != nil {
					child = path.Child(name)
				}
				if fe := badValueIn(f.Type, e, child); fe != nil {
					return fe
				}
			}
		}
	}
	return nil
}

func validDuration(s string) bool {
	_, err := time.ParseDuration(s)
	return err == nil
}

// Write writes o as a configuration file at path.
func (o OperatorConfiguration) Write(path string) error {
	o.defaults()
	b, err := yaml.Marshal(o)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
