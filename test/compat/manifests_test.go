package compat

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/testutil"
)

// publishedGroup is the API group HyperPod's CRDs are installed under, beside prewarm's, so
// that the same manifest can be sent to both.
const publishedGroup = "published.hyperpod.test"

var server *testutil.APIServer

func TestMain(m *testing.M) { os.Exit(testutil.RunWithAPIServer(m, &server)) }

// Every manifest HyperPod's published CRDs accept, prewarm's accept, under strict field
// validation, for both served versions, and read back as v1 with the same content and the same
// defaults. The manifests are made from the published schema itself: one that sets every field
// it defines (with a value its validation accepts), and one that sets only the required ones
// (and what prewarm's few deliberate checks need, so that the defaults are compared too).
func TestPublishedManifestsAreAcceptedAndDefaultedAlike(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, plural := range publishedKinds {
		published := readCRD(t, filepath.Join("testdata", "hyperpod", "inference.sagemaker.aws.amazon.com_"+plural+".yaml"))
		installPublished(t, ctx, published)
		for _, v := range published.Spec.Versions {
			for _, shape := range []string{"every field", "required fields"} {
				t.Run(plural+"/"+v.Name+"/"+shape, func(t *testing.T) {
					spec, err := example(v.Schema.OpenAPIV3Schema.Properties["spec"], ".spec", shape == "every field")
					if err != nil {
						t.Fatal(err)
					}
					if shape == "required fields" {
						withDeliberateMinimum(published.Spec.Names.Kind, spec.(map[string]any))
					}
					name := strings.ReplaceAll(v.Name+"-"+strings.Fields(shape)[0], " ", "-")
					create(t, ctx, publishedGroup, v.Name, published.Spec.Names.Kind, name, spec)
					create(t, ctx, "inference.sagemaker.aws.amazon.com", v.Name, published.Spec.Names.Kind, name, spec)
					// Read back through v1, as the controller reads it.
					ours := getV1(t, ctx, "inference.sagemaker.aws.amazon.com", published.Spec.Names.Kind, name)
					theirs := getV1(t, ctx, publishedGroup, published.Spec.Names.Kind, name)
					if diff := cmp.Diff(theirs.Object["spec"], ours.Object["spec"]); diff != "" {
						t.Errorf("read back as v1, prewarm's spec differs from HyperPod's (-HyperPod +prewarm):\n%s", diff)
					}
				})
			}
		}
	}
}

// withDeliberateMinimum adds to a manifest of only the required fields what prewarm's deliberate
// checks need (schema_test.go): a place to run, and the storage block of the source type.
func withDeliberateMinimum(kind string, spec map[string]any) {
	src, ok := spec["modelSourceConfig"].(map[string]any)
	if !ok {
		return // a JumpStartModel, an image cache, a registration: their required fields are enough
	}
	if kind == "InferenceEndpointConfig" {
		spec["instanceType"] = "ml.g5.24xlarge"
	}
	if src["modelSourceType"] == "fsx" {
		src["fsxStorage"] = map[string]any{"fileSystemId": "fs-0123456789abcdef0"}
	}
}

// Manifests as HyperPod users write them (testdata/samples: every source type, both versions,
// spec.kubernetes, probes, HyperPod's own blocks) are accepted strictly by both, and read back as
// v1 alike.
func TestHyperPodSamplesAreAcceptedAlike(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, plural := range publishedKinds {
		installPublished(t, ctx, readCRD(t, filepath.Join("testdata", "hyperpod", "inference.sagemaker.aws.amazon.com_"+plural+".yaml")))
	}
	paths, err := filepath.Glob(filepath.Join("testdata", "samples", "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := yaml.UnmarshalStrict(b, &u.Object); err != nil {
				t.Fatal(err)
			}
			gvk := u.GroupVersionKind()
			name := "sample-" + u.GetName()
			create(t, ctx, publishedGroup, gvk.Version, gvk.Kind, name, u.Object["spec"])
			create(t, ctx, gvk.Group, gvk.Version, gvk.Kind, name, u.Object["spec"])
			theirs := getV1(t, ctx, publishedGroup, gvk.Kind, name)
			ours := getV1(t, ctx, gvk.Group, gvk.Kind, name)
			if diff := cmp.Diff(theirs.Object["spec"], ours.Object["spec"]); diff != "" {
				t.Errorf("read back as v1 (-HyperPod +prewarm):\n%s", diff)
			}
		})
	}
}

// installPublished installs a published CRD under publishedGroup, converting between its
// versions as the API server does without a webhook (its versions share one schema shape).
func installPublished(t *testing.T, ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	crd = crd.DeepCopy()
	crd.Spec.Group = publishedGroup
	crd.ResourceVersion = ""
	crd.Name = crd.Spec.Names.Plural + "." + publishedGroup
	crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}
	crd.Annotations = nil
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(server.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("installing HyperPod's %s: %v", crd.Name, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(crd), got); err != nil {
			return false, err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("HyperPod's %s never became established: %v", crd.Name, err)
	}
	// Established is not yet served in discovery, which the test's client maps kinds with:
	// wait for each version's mapping too (on a busy machine it lags).
	gk := schema.GroupKind{Group: publishedGroup, Kind: crd.Spec.Names.Kind}
	for _, v := range crd.Spec.Versions {
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			_, err := server.Client.RESTMapper().RESTMapping(gk, v.Name)
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("HyperPod's %s %s is never served: %v", crd.Name, v.Name, err)
		}
	}
}

// create creates an object of spec in the default namespace, under strict field validation.
func create(t *testing.T, ctx context.Context, group, version, kind, name string, spec any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: version, Kind: kind})
	u.SetNamespace("default")
	u.SetName(name)
	if err := server.Client.Create(ctx, u, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("%s/%s refuses the manifest: %v", group, version, err)
	}
}

// getV1 reads an object back as v1.
func getV1(t *testing.T, ctx context.Context, group, kind, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: "v1", Kind: kind})
	if err := server.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, u); err != nil {
		t.Fatal(err)
	}
	return u
}

// samples are strings tried, in order, for a string field with a pattern: the first the
// pattern matches is used.
var samples = []string{
	"x", "http", "ml.g5.24xlarge", "org/model", "0e9e39f249a16976918f6564b8830bc894c89659", "fs-0123456789abcdef0",
	"arn:aws:iam::123456789012:role/prewarm", "arn:aws:acm:us-west-2:123456789012:certificate/abc",
	"arn:aws:sagemaker:us-west-2:123456789012:endpoint/e", "s3://bucket/prefix", "/ping", "mig-1g.10gb", "1.2.3",
	"https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-abc", "redis", "Z123ABC", "model.example.com", "alias/key",
}

// fixed are values for fields whose rules are not in the schema's patterns but that must hold
// a real value (prewarm checks them; HyperPod takes any string).
var fixed = map[string]any{
	".spec.modelCacheConfig.weightsCache.hostPath": "/opt/dlami/nvme",
	".spec.hostPath":                        "/opt/dlami/nvme",
	".spec.modelSourceConfig.modelLocation": "models/llama",
}

// example builds a value the schema accepts: with every property (all), or only the required
// ones.
func example(s apiextensionsv1.JSONSchemaProps, path string, all bool) (any, error) {
	if v, ok := fixed[path]; ok {
		return v, nil
	}
	if len(s.Enum) > 0 {
		var v any
		err := json.Unmarshal(s.Enum[0].Raw, &v)
		return v, err
	}
	switch {
	case s.XIntOrString:
		return int64(1), nil
	case s.Type == "object" && len(s.Properties) > 0:
		out := map[string]any{}
		for name, p := range s.Properties {
			if !all && !slices.Contains(s.Required, name) {
				continue
			}
			v, err := example(p, path+"."+name, all)
			if err != nil {
				return nil, err
			}
			out[name] = v
		}
		return out, nil
	case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		v, err := example(*s.AdditionalProperties.Schema, path+"{}", all)
		return map[string]any{"key": v}, err
	case s.Type == "object":
		return map[string]any{}, nil
	case s.Type == "array":
		v, err := example(*s.Items.Schema, path+"[]", all)
		return []any{v}, err
	case s.Type == "string":
		return sampleString(s, path)
	case s.Type == "integer":
		n := int64(1)
		if s.Minimum != nil {
			n = max(n, int64(*s.Minimum))
		}
		if s.Maximum != nil {
			n = min(n, int64(*s.Maximum))
		}
		return n, nil
	case s.Type == "number":
		return 1.5, nil
	case s.Type == "boolean":
		return true, nil
	}
	return nil, fmt.Errorf("%s: no example for type %q", path, s.Type)
}

func sampleString(s apiextensionsv1.JSONSchemaProps, path string) (string, error) {
	if s.Format == "date-time" {
		return "2026-12-01T00:00:00Z", nil
	}
	if s.Pattern == "" {
		v := "x"
		if s.MinLength != nil {
			v = strings.Repeat("x", int(*s.MinLength))
		}
		return v, nil
	}
	re, err := regexp.Compile(s.Pattern)
	if err != nil {
		return "", fmt.Errorf("%s: pattern %q: %w", path, s.Pattern, err)
	}
	for _, v := range samples {
		if re.MatchString(v) && (s.MinLength == nil || int64(len(v)) >= *s.MinLength) && (s.MaxLength == nil || int64(len(v)) <= *s.MaxLength) {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s: no sample matches the pattern %q; add one to samples", path, s.Pattern)
}
