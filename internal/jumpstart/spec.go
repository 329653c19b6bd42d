// Package jumpstart resolves JumpStart model ids from JumpStart's own public metadata, as the
// SageMaker Python SDK's JumpStartModelsCache does: the regional content bucket's model manifest
// (models_manifest.json, one header per model version) names each version's spec file, and the
// spec says where the model's files are, whether it is gated, its default image and its
// environment. A JumpStartModel (or a ModelWeightsCacheConfig's jumpStartModel) resolves to a
// catalog.Entry, as one from the catalog ConfigMap does.
package jumpstart

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/catalog"
)

// ManifestKey is the manifest's key in the content bucket.
const ManifestKey = "models_manifest.json"

// Header is one model version in the manifest.
type Header struct {
	ModelID    string `json:"model_id"`
	Version    string `json:"version"`
	MinVersion string `json:"min_version"`
	SpecKey    string `json:"spec_key"`
}

// ECRSpecs names a spec's container framework.
type ECRSpecs struct {
	Framework        string `json:"framework"`
	FrameworkVersion string `json:"framework_version"`
	PyVersion        string `json:"py_version"`
}

// EnvironmentVariable is one of a spec's inference environment variables.
type EnvironmentVariable struct {
	Name string `json:"name"`
	// Default is a string or a number.
	Default json.RawMessage `json:"default"`
	Scope   string          `json:"scope"`
}

// Variant is what a spec says of one instance type or family.
type Variant struct {
	Properties         map[string]json.RawMessage `json:"properties,omitempty"`
	RegionalProperties map[string]string          `json:"regional_properties,omitempty"`
}

// InstanceTypeVariants are a spec's per-instance-type properties, with regional aliases.
type InstanceTypeVariants struct {
	RegionalAliases map[string]map[string]string `json:"regional_aliases,omitempty"`
	Variants        map[string]Variant           `json:"variants,omitempty"`
}

// Specs is the part of a model version's spec file that serving it needs.
type Specs struct {
	ModelID                         string                `json:"model_id"`
	Version                         string                `json:"version"`
	HostingArtifactKey              string                `json:"hosting_artifact_key"`
	HostingPrepackedArtifactKey     string                `json:"hosting_prepacked_artifact_key"`
	HostingArtifactS3DataType       string                `json:"hosting_artifact_s3_data_type"`
	HostingArtifactCompressionType  string                `json:"hosting_artifact_compression_type"`
	GatedBucket                     bool                  `json:"gated_bucket"`
	HostingEULAKey                  string                `json:"hosting_eula_key"`
	DefaultInferenceInstanceType    string                `json:"default_inference_instance_type"`
	SupportedInferenceInstanceTypes []string              `json:"supported_inference_instance_types"`
	HostingECRSpecs                 *ECRSpecs             `json:"hosting_ecr_specs"`
	InferenceEnvironmentVariables   []EnvironmentVariable `json:"inference_environment_variables"`
	HostingInstanceTypeVariants     *InstanceTypeVariants `json:"hosting_instance_type_variants"`
	HostingResourceRequirements     *ResourceRequirements `json:"hosting_resource_requirements"`
}

// ResourceRequirements are what a spec says one copy of the model needs.
type ResourceRequirements struct {
	NumAccelerators int   `json:"num_accelerators"`
	MinMemoryMB     int64 `json:"min_memory_mb"`
}

// ParseManifest reads a manifest: a JSON list of headers.
func ParseManifest(data []byte) ([]Header, error) {
	var hs []Header
	if err := json.Unmarshal(data, &hs); err != nil {
		return nil, fmt.Errorf("the JumpStart manifest is not a JSON list of model headers: %w", err)
	}
	for i, h := range hs {
		if h.ModelID == "" || h.Version == "" || h.SpecKey == "" {
			return nil, fmt.Errorf("the JumpStart manifest's entry %d lacks model_id, version or spec_key", i)
		}
	}
	return hs, nil
}

// ParseSpecs reads a spec file.
func ParseSpecs(data []byte) (*Specs, error) {
	s := &Specs{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("the JumpStart spec is not valid JSON of a model spec: %w", err)
	}
	if s.ModelID == "" || (s.HostingArtifactKey == "" && s.HostingPrepackedArtifactKey == "") {
		return nil, errors.New("the JumpStart spec lacks model_id or hosting_artifact_key")
	}
	return s, nil
}

// Where says where a region's JumpStart content is.
type Where struct {
	Region      string
	Bucket      string
	GatedBucket string
	// Images maps "framework:version" (a spec's hosting_ecr_specs) to the image to run, for a
	// spec that names no image for the region.
	Images map[string]string
}

// Entry turns a spec into what serving the model on instanceType needs: the model's files (the
// prepacked inference artifacts where the spec has them, as the SDK deploys them), the image
// (the spec's for the region and instance type, else the configured image of its framework), the
// container's environment, and whether the model is gated. Without needImage (a cache of the
// weights alone), a spec that names no image is no error.
func (s *Specs) Entry(w Where, instanceType string, needImage bool) (*catalog.Entry, error) {
	key := s.HostingPrepackedArtifactKey
	if key == "" {
		key = s.HostingArtifactKey
		if t := s.HostingArtifactCompressionType; t != "" && t != "None" {
			return nil, fmt.Errorf("%s %s's artifacts are compressed (%s): prewarm caches a model's files as they are, under a prefix", s.ModelID, s.Version, t)
		}
	}
	bucket := w.Bucket
	if s.GatedBucket {
		bucket = w.GatedBucket
	}
	image := s.image(w, instanceType)
	if image == "" && needImage {
		framework := "no hosting_ecr_specs"
		if e := s.HostingECRSpecs; e != nil {
			framework = e.Framework + ":" + e.FrameworkVersion
		}
		return nil, fmt.Errorf("%s %s names no image for region %s and instance type %s (%s): set jumpStart.images[%q] in the operator configuration, or add the model to the catalog",
			s.ModelID, s.Version, w.Region, instanceType, framework, framework)
	}
	e := &catalog.Entry{
		ModelID: s.ModelID, Version: s.Version, Gated: s.GatedBucket || s.HostingEULAKey != "",
		Source: inferencev1.ModelSourceConfig{
			ModelSourceType: inferencev1.ModelSourceS3,
			S3Storage:       &inferencev1.S3Storage{BucketName: bucket, Region: w.Region},
			ModelLocation:   key,
		},
		Image: image, Port: 8080, MountPath: inferencev1.DefaultModelMountPath,
	}
	if r := s.HostingResourceRequirements; r != nil {
		e.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
		if r.NumAccelerators > 0 {
			gpus := *resource.NewQuantity(int64(r.NumAccelerators), resource.DecimalSI)
			e.Resources.Limits["nvidia.com/gpu"], e.Resources.Requests["nvidia.com/gpu"] = gpus, gpus
		}
		if r.MinMemoryMB > 0 {
			e.Resources.Requests[corev1.ResourceMemory] = *resource.NewQuantity(r.MinMemoryMB<<20, resource.BinarySI)
		}
	}
	for _, v := range s.InferenceEnvironmentVariables {
		if v.Scope != "" && v.Scope != "container" {
			continue
		}
		e.EnvironmentVariables = append(e.EnvironmentVariables, corev1.EnvVar{Name: v.Name, Value: scalar(v.Default)})
	}
	for name, value := range s.variantEnvironment(instanceType) {
		i := slices.IndexFunc(e.EnvironmentVariables, func(x corev1.EnvVar) bool { return x.Name == name })
		if i >= 0 {
			e.EnvironmentVariables[i].Value = value
		} else {
			e.EnvironmentVariables = append(e.EnvironmentVariables, corev1.EnvVar{Name: name, Value: value})
		}
	}
	slices.SortStableFunc(e.EnvironmentVariables, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return e, nil
}

// image is the spec's image for the region and instance type, as the SDK finds it: the instance
// type's variant, else its family's, naming a regional alias; else the configured image of the
// spec's framework.
func (s *Specs) image(w Where, instanceType string) string {
	if v := s.HostingInstanceTypeVariants; v != nil {
		for _, key := range []string{instanceType, family(instanceType)} {
			alias, ok := v.Variants[key].RegionalProperties["image_uri"]
			if !ok || !strings.HasPrefix(alias, "$") {
				continue
			}
			if img := v.RegionalAliases[w.Region][alias[1:]]; img != "" {
				return img
			}
		}
	}
	if e := s.HostingECRSpecs; e != nil {
		return w.Images[e.Framework+":"+e.FrameworkVersion]
	}
	return ""
}

// variantEnvironment is the environment the instance type's family, then the type itself, add.
func (s *Specs) variantEnvironment(instanceType string) map[string]string {
	out := map[string]string{}
	v := s.HostingInstanceTypeVariants
	if v == nil {
		return out
	}
	for _, key := range []string{family(instanceType), instanceType} {
		raw, ok := v.Variants[key].Properties["environment_variables"]
		if !ok {
			continue
		}
		vars := map[string]json.RawMessage{}
		if json.Unmarshal(raw, &vars) != nil {
			continue
		}
		for name, value := range vars {
			out[name] = scalar(value)
		}
	}
	return out
}

// family is an instance type's family, as the SDK names it: ml.g5.24xlarge → ml.g5.
func family(instanceType string) string {
	parts := strings.Split(instanceType, ".")
	if len(parts) < 3 {
		return ""
	}
	return parts[0] + "." + parts[1]
}

// scalar is a JSON string's value, or a number's or boolean's text.
func scalar(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if string(raw) == "null" {
		return ""
	}
	return string(raw)
}
