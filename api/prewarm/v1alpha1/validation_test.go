package v1alpha1

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	v1 "github.com/prewarm/prewarm/api/v1"
)

// crdSchema is the part of an OpenAPI schema the test walks.
type crdSchema struct {
	Type       string               `json:"type"`
	MaxLength  *int                 `json:"maxLength"`
	MaxItems   *int                 `json:"maxItems"`
	Properties map[string]crdSchema `json:"properties"`
	Items      *crdSchema           `json:"items"`
}

// nodeCacheSchema reads the generated NodeCache CRD's crdSchema.
func nodeCacheSchema(t *testing.T) crdSchema {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "crd", "bases", "prewarm.io_nodecaches.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema crdSchema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// limit is one capped field of a list entry: its JSON path inside the entry and its cap.
type limit struct {
	path   []string
	max    int
	string bool // a maxLength; else a list's maxItems
}

// limits lists every capped field under s, at path.
func limits(s crdSchema, path []string) []limit {
	var out []limit
	if s.MaxLength != nil {
		out = append(out, limit{path: path, max: *s.MaxLength, string: true})
	}
	if s.MaxItems != nil {
		out = append(out, limit{path: path, max: *s.MaxItems})
	}
	for name, p := range s.Properties {
		out = append(out, limits(p, append(append([]string{}, path...), name))...)
	}
	if s.Items != nil && s.MaxItems != nil {
		// A list inside an entry: its items' limits are checked on its first item.
		for _, l := range limits(*s.Items, nil) {
			out = append(out, limit{path: append(append(append([]string{}, path...), "0"), l.path...), max: l.max, string: l.string})
		}
	}
	return out
}

// set sets the value at path in the JSON object o, making what is missing on the way (a "0"
// segment is a list's first item).
func set(o map[string]any, path []string, v any) {
	for i, k := range path[:len(path)-1] {
		next := path[i+1]
		if next == "0" {
			l, _ := o[k].([]any)
			if len(l) == 0 {
				l = []any{map[string]any{}}
				o[k] = l
			}
			if i+2 == len(path) {
				return // a list of strings: none is capped here
			}
			o = l[0].(map[string]any)
			path = path[i+2:]
			set(o, path, v)
			return
		}
		if k == "0" {
			continue
		}
		m, _ := o[k].(map[string]any)
		if m == nil {
			m = map[string]any{}
			o[k] = m
		}
		o = m
	}
	o[path[len(path)-1]] = v
}

// over builds, from a valid entry, one whose field at l is one past its cap.
func over[T any](t *testing.T, valid T, l limit) T {
	t.Helper()
	b, err := json.Marshal(valid)
	if err != nil {
		t.Fatal(err)
	}
	o := map[string]any{}
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	if l.string {
		set(o, l.path, strings.Repeat("é", l.max+1)) // characters, not bytes, are counted
	} else {
		items := make([]any, l.max+1)
		for i := range items {
			items[i] = map[string]any{"node": "n", "address": "10.0.0.1:1"}
		}
		set(o, l.path, items)
	}
	if b, err = json.Marshal(o); err != nil {
		t.Fatal(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %v", l.path, err)
	}
	return out
}

// Every cap the NodeCache crdSchema puts on a request's or a report's fields is one Validate
// checks: a field one past its cap is refused, naming the field; the valid entries pass.
func TestValidateFollowsTheCRD(t *testing.T) {
	root := nodeCacheSchema(t)
	const uid = "0b9c3f3e-5b1a-4c47-9d4e-1f0f6b9f2a10"
	request := CacheRequest{UID: uid, Namespace: "team-a", Name: "m", Root: "/mnt/nvme",
		Source:      CacheSource{Type: v1.ModelSourceS3, Bucket: "b", Prefix: "p", Region: "us-west-2"},
		Credentials: &SealedCredentials{KeyID: "k", Digest: "d", Sealed: "s"}, RetainedSince: "2026-01-01T00:00:00Z",
		Peers: []CachePeer{{Node: "n", Address: "10.0.0.1:1"}}, Refused: &CacheRefusal{Reason: "BudgetExceeded", Message: "m"}}
	report := CacheStatus{UID: uid, CopyStatus: v1.CopyStatus{State: v1.CacheReady, Reason: "Verified", Message: "m"}, Revision: "r"}
	rootReport := RootStatus{Path: "/mnt/nvme", NodePath: "/local", Reason: "NoLocalDisk", Message: "m"}
	for _, tc := range []struct {
		name     string
		schema   crdSchema
		validate func(l limit) field.ErrorList
		valid    field.ErrorList
	}{
		{"spec.caches", *root.Properties["spec"].Properties["caches"].Items,
			func(l limit) field.ErrorList { return over(t, request, l).Validate(field.NewPath("x")) },
			request.Validate(field.NewPath("x"))},
		{"status.caches", *root.Properties["status"].Properties["caches"].Items,
			func(l limit) field.ErrorList { return over(t, report, l).Validate(field.NewPath("x")) },
			report.Validate(field.NewPath("x"))},
		{"status.roots", *root.Properties["status"].Properties["roots"].Items,
			func(l limit) field.ErrorList { return over(t, rootReport, l).Validate(field.NewPath("x")) },
			rootReport.Validate(field.NewPath("x"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.valid) > 0 {
				t.Fatalf("the valid entry is refused: %v", tc.valid)
			}
			ls := limits(tc.schema, nil)
			if len(ls) < 4 {
				t.Fatalf("found only %d capped fields in the crdSchema", len(ls))
			}
			for _, l := range ls {
				want := "x." + strings.ReplaceAll(strings.Join(l.path, "."), ".0.", "[0].")
				errs := tc.validate(l)
				if !strings.Contains(fmt.Sprint(errs), want) {
					t.Errorf("%s one past its cap of %d: Validate says %v, want an error naming %s", strings.Join(l.path, "."), l.max, errs, want)
				}
			}
		})
	}
}
