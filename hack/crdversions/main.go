// Command crdversions adds to the CRDs controller-gen wrote the v1alpha1 version HyperPod also
// serves. HyperPod's v1alpha1 schema is its v1 schema with fewer source types (and, for a
// SageMakerEndpointRegistration, without data capture), so the API server
// converts between them on its own (conversion strategy None): no webhook, no certificate. (It
// also requires instanceType.) It runs after controller-gen in `make manifests`.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// alphaSourceTypes are the source types HyperPod's v1alpha1 knows.
var alphaSourceTypes = []string{"fsx", "s3"}

// alphaRequired are the spec fields HyperPod's v1alpha1 requires beyond v1's, by kind.
var alphaRequired = map[string][]string{"InferenceEndpointConfig": {"instanceType"}}

// alphaDropped are the spec fields of v1 that HyperPod's v1alpha1 does not have, by kind.
var alphaDropped = map[string][]string{"SageMakerEndpointRegistration": {"sageMakerEndpointDataCaptureConfig"}}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: crdversions CRD.yaml...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := addAlpha(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

func addAlpha(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		return err
	}
	var v1 *apiextensionsv1.CustomResourceDefinitionVersion
	versions := crd.Spec.Versions[:0]
	for i := range crd.Spec.Versions {
		switch crd.Spec.Versions[i].Name {
		case "v1":
			v1 = &crd.Spec.Versions[i]
			versions = append(versions, crd.Spec.Versions[i])
		case "v1alpha1": // from an earlier run: made again below
		default:
			versions = append(versions, crd.Spec.Versions[i])
		}
	}
	if v1 == nil {
		return fmt.Errorf("no v1 version")
	}
	alpha := *v1.DeepCopy()
	alpha.Name, alpha.Served, alpha.Storage = "v1alpha1", true, false
	if err := narrowSourceTypes(alpha.Schema.OpenAPIV3Schema); err != nil {
		return err
	}
	spec := alpha.Schema.OpenAPIV3Schema.Properties["spec"]
	spec.Required = append(spec.Required, alphaRequired[crd.Spec.Names.Kind]...)
	for _, f := range alphaDropped[crd.Spec.Names.Kind] {
		delete(spec.Properties, f)
	}
	alpha.Schema.OpenAPIV3Schema.Properties["spec"] = spec
	versions = append(versions, alpha)
	crd.Spec.Versions = versions
	// controller-gen's layout: a document marker first, and no status.
	b, err = json.Marshal(crd)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	delete(obj, "status")
	out, err := yaml.Marshal(obj)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte("---\n"), out...), 0o644)
}

// narrowSourceTypes restricts spec.modelSourceConfig.modelSourceType, where the kind has it, to
// the source types of v1alpha1.
func narrowSourceTypes(root *apiextensionsv1.JSONSchemaProps) error {
	spec, ok := root.Properties["spec"]
	if !ok {
		return fmt.Errorf("no spec in the schema")
	}
	msc, ok := spec.Properties["modelSourceConfig"]
	if !ok {
		return nil
	}
	t, ok := msc.Properties["modelSourceType"]
	if !ok {
		return fmt.Errorf("no modelSourceConfig.modelSourceType in the schema")
	}
	t.Enum = nil
	for _, v := range alphaSourceTypes {
		raw, _ := json.Marshal(v)
		t.Enum = append(t.Enum, apiextensionsv1.JSON{Raw: raw})
	}
	msc.Properties["modelSourceType"] = t
	spec.Properties["modelSourceConfig"] = msc
	root.Properties["spec"] = spec
	return nil
}
