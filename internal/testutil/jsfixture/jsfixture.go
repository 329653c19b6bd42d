// Package jsfixture publishes JumpStart content in JumpStart's own layout to a test S3 server:
// a region's content bucket with models_manifest.json (one header per model version, each
// naming its spec file) and the spec files, a gated bucket, and each version's model files under
// its artifact prefix. The fields and layout are those the SageMaker Python SDK's
// JumpStartModelsCache parses (sagemaker/jumpstart/cache.py and types.py); the models are the
// ids of AWS's published JumpStartModel examples and of prewarm's own catalog.
package jsfixture

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
)

// Region is the fixture's region.
const Region = "us-west-2"

// Buckets are the region's content bucket and gated content bucket, named as JumpStart's are.
const (
	Bucket      = "jumpstart-cache-prod-" + Region
	GatedBucket = "jumpstart-private-cache-prod-" + Region
)

// DJLImage is the image the deepseek and mistral specs name for the region (a regional alias);
// TGIImage is the one the configuration must supply for flan-t5-xl's framework.
const (
	DJLImage     = "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.29.0-lmi11.0.0-cu124"
	TGIFramework = "huggingface-llm:1.1.0"
)

// Version is one published model version.
type Version struct {
	ModelID, Version string
	// Gated versions live in the gated bucket and have an EULA.
	Gated bool
	// Prefix is where its files are in its bucket; Files its files by name.
	Prefix string
	Files  map[string][]byte
}

// Bucket is the bucket that holds v's files.
func (v Version) Bucket() string {
	if v.Gated {
		return GatedBucket
	}
	return Bucket
}

// Versions are the model versions the fixture publishes.
var Versions = []Version{
	{ModelID: "deepseek-llm-r1-distill-qwen-1-5b", Version: "1.0.0"},
	{ModelID: "deepseek-llm-r1-distill-qwen-1-5b", Version: "2.0.4"},
	{ModelID: "huggingface-text2text-flan-t5-xl", Version: "1.0.0"},
	{ModelID: "huggingface-text2text-flan-t5-xl", Version: "2.1.0"},
	{ModelID: "meta-textgeneration-llama-3-1-8b-instruct", Version: "2.1.0", Gated: true},
	{ModelID: "huggingface-llm-mistral-7b-instruct", Version: "3.18.0"},
	{ModelID: "huggingface-llm-mistral-7b-instruct", Version: "3.19.0"},
	{ModelID: "huggingface-llm-mistral-7b-instruct", Version: "3.20.1"},
}

// Find is the published version of id and version.
func Find(id, version string) Version {
	for _, v := range Versions {
		if v.ModelID == id && v.Version == version {
			return v
		}
	}
	panic(fmt.Sprintf("jsfixture: no %s %s", id, version))
}

func init() {
	for i := range Versions {
		v := &Versions[i]
		family, _, _ := strings.Cut(v.ModelID, "-")
		kind := "inference-prepack"
		if strings.HasPrefix(v.ModelID, "huggingface-text2text") {
			kind = "inference" // an older spec: raw artifacts, no prepacked ones
		}
		v.Prefix = fmt.Sprintf("%s-infer/%s/artifacts/%s/v%s/", family, v.ModelID, kind, v.Version)
		seed := uint64(i + 1)
		v.Files = map[string][]byte{
			"config.json":       []byte(fmt.Sprintf(`{"model_id":%q,"version":%q}`, v.ModelID, v.Version)),
			"model.safetensors": gen.Bytes(seed, 3<<20+int(seed)*4096),
			"tokenizer.json":    gen.Bytes(seed+100, 64<<10),
		}
	}
}

// SpecKey is where v's spec file is in the content bucket.
func SpecKey(v Version) string {
	return fmt.Sprintf("community_models/%s/specs_v%s.json", v.ModelID, v.Version)
}

// spec is v's spec file, in JumpStart's format.
func spec(v Version) map[string]any {
	s := map[string]any{
		"model_id": v.ModelID, "version": v.Version, "min_sdk_version": "2.189.0",
		"hosting_artifact_s3_data_type": "S3Prefix", "hosting_artifact_compression_type": "None",
		"hosting_script_key":   "source-directory-tarballs/meta/inference/textgeneration/v1.2.3/sourcedir.tar.gz",
		"inference_vulnerable": false, "deprecated": false, "gated_bucket": v.Gated, "hosting_eula_key": nil,
		"default_inference_instance_type":    "ml.g5.2xlarge",
		"supported_inference_instance_types": []string{"ml.g5.2xlarge", "ml.g5.8xlarge", "ml.g5.24xlarge", "ml.p4d.24xlarge"},
		"inference_environment_variables": []map[string]any{
			{"name": "SAGEMAKER_PROGRAM", "type": "text", "default": "inference.py", "scope": "container", "required_for_model_class": true},
			{"name": "ENDPOINT_SERVER_TIMEOUT", "type": "int", "default": 3600, "scope": "container", "required_for_model_class": true},
			{"name": "HF_MODEL_ID", "type": "text", "default": "/opt/ml/model", "scope": "container", "required_for_model_class": true},
			{"name": "SAGEMAKER_MODEL_SERVER_WORKERS", "type": "int", "default": 1, "scope": "algorithm", "required_for_model_class": false},
		},
		"hosting_resource_requirements": map[string]any{"num_accelerators": 1, "min_memory_mb": 8192},
	}
	if strings.HasPrefix(v.ModelID, "huggingface-text2text") {
		s["hosting_artifact_key"] = v.Prefix
		s["hosting_prepacked_artifact_key"] = nil
		s["hosting_ecr_specs"] = map[string]any{"framework": "huggingface-llm", "framework_version": "1.1.0", "py_version": "py39"}
	} else {
		s["hosting_artifact_key"] = strings.Replace(v.Prefix, "inference-prepack", "inference", 1)
		s["hosting_prepacked_artifact_key"] = v.Prefix
		s["hosting_ecr_specs"] = map[string]any{"framework": "djl-lmi", "framework_version": "0.29.0", "py_version": "py310"}
		s["hosting_instance_type_variants"] = map[string]any{
			"regional_aliases": map[string]any{Region: map[string]any{"djl_image": DJLImage}},
			"variants": map[string]any{
				"ml.g5": map[string]any{"regional_properties": map[string]any{"image_uri": "$djl_image"}},
				"ml.p4d": map[string]any{"regional_properties": map[string]any{"image_uri": "$djl_image"},
					"properties": map[string]any{"environment_variables": map[string]any{"OPTION_TENSOR_PARALLEL_DEGREE": "8"}}},
			},
		}
	}
	if v.Gated {
		s["hosting_eula_key"] = "fmhMetadata/eula/llama3_1Eula.txt"
	}
	return s
}

// Manifest is the content bucket's models_manifest.json for versions.
func Manifest(versions []Version) ([]byte, error) {
	var headers []map[string]any
	for _, v := range versions {
		headers = append(headers, map[string]any{
			"model_id": v.ModelID, "version": v.Version, "min_version": "2.189.0", "spec_key": SpecKey(v),
			"deprecated": false, "search_keywords": []string{"Text Generation"},
		})
	}
	return json.MarshalIndent(headers, "", " ")
}

// Objects are the content bucket's manifest and spec files for versions, by key.
func Objects(versions []Version) (map[string][]byte, error) {
	manifest, err := Manifest(versions)
	if err != nil {
		return nil, err
	}
	objects := map[string][]byte{"models_manifest.json": manifest}
	for _, v := range versions {
		body, err := json.MarshalIndent(spec(v), "", " ")
		if err != nil {
			return nil, err
		}
		objects[SpecKey(v)] = body
	}
	return objects, nil
}

// Publish creates the region's buckets on srv and puts the manifest, the spec files and every
// version's files there.
func Publish(ctx context.Context, srv *s3fixture.Server) error {
	for _, b := range []string{Bucket, GatedBucket} {
		if err := srv.CreateBucket(ctx, b); err != nil {
			return err
		}
	}
	objects, err := Objects(Versions)
	if err != nil {
		return err
	}
	for key, body := range objects {
		if err := srv.PutBytes(ctx, Bucket, key, body); err != nil {
			return err
		}
	}
	for _, v := range Versions {
		for name, data := range v.Files {
			if err := srv.PutBytes(ctx, v.Bucket(), v.Prefix+name, data); err != nil {
				return err
			}
		}
	}
	return nil
}
