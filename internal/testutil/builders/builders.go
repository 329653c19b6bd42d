// Package builders builds the objects prewarm's tests create, shaped like the seed's manifests:
// HyperPod's kinds with the fields a test changes set by chained methods. It is dependency-free
// (the API types only; test/architecture holds it to that), so a unit test builds objects
// without the cluster harness.
package builders

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// IECWrapper builds an InferenceEndpointConfig for tests.
type IECWrapper struct {
	inferencev1.InferenceEndpointConfig
}

// MakeInferenceEndpointConfig returns a valid InferenceEndpointConfig shaped like the seed's:
// an S3 model on ml.g5.24xlarge nodes with both caches enabled.
func MakeInferenceEndpointConfig(namespace, name string) *IECWrapper {
	return &IECWrapper{inferencev1.InferenceEndpointConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: inferencev1.InferenceEndpointConfigSpec{
			ModelName: name,
			ModelSourceConfig: inferencev1.ModelSourceConfig{
				ModelSourceType: inferencev1.ModelSourceS3,
				S3Storage:       &inferencev1.S3Storage{BucketName: "example-bucket", Region: "us-west-2"},
				ModelLocation:   "models/" + name,
			},
			ModelCacheConfig: &inferencev1.ModelCacheConfig{
				WeightsCache: &inferencev1.WeightsCacheConfig{Enabled: true},
				ImageCache:   &inferencev1.ImageCacheConfig{Enabled: true},
			},
			InstanceType: "ml.g5.24xlarge",
			Worker: inferencev1.Worker{
				Image:               "vllm/vllm-openai:latest",
				ModelInvocationPort: inferencev1.ModelInvocationPort{ContainerPort: 8000},
				ModelVolumeMount:    inferencev1.ModelVolumeMount{Name: "model-weights", MountPath: "/opt/ml/model"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					"nvidia.com/gpu": resource.MustParse("4"),
				}},
			},
		},
	}}
}

// Obj returns the built object.
func (w *IECWrapper) Obj() *inferencev1.InferenceEndpointConfig { return &w.InferenceEndpointConfig }

// HuggingFace makes the model come from a Hugging Face repository.
func (w *IECWrapper) HuggingFace(modelID, commit string) *IECWrapper {
	w.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{
		ModelSourceType:  inferencev1.ModelSourceHuggingFace,
		HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: modelID, CommitSHA: commit},
	}
	return w
}

// HostPath sets the weights cache root.
func (w *IECWrapper) HostPath(p string) *IECWrapper {
	w.Spec.ModelCacheConfig.WeightsCache.HostPath = p
	return w
}

// Location sets the model's location inside its source.
func (w *IECWrapper) Location(loc string) *IECWrapper {
	w.Spec.ModelSourceConfig.ModelLocation = loc
	return w
}

// InstanceType places the model on nodes of one instance type.
func (w *IECWrapper) InstanceType(t string) *IECWrapper {
	w.Spec.InstanceType, w.Spec.InstanceTypes, w.Spec.NodeAffinity = t, nil, nil
	return w
}

// JSMWrapper builds a JumpStartModel for tests.
type JSMWrapper struct{ inferencev1.JumpStartModel }

// MakeJumpStartModel returns a valid JumpStartModel shaped like the seed's.
func MakeJumpStartModel(namespace, name string) *JSMWrapper {
	return &JSMWrapper{inferencev1.JumpStartModel{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: inferencev1.JumpStartModelSpec{
			Model:  inferencev1.JumpStartModelRef{ModelID: "meta-textgeneration-llama-3-1-8b-instruct", AcceptEula: true},
			Server: inferencev1.JumpStartServer{InstanceType: "ml.g5.24xlarge"},
			ModelCacheConfig: &inferencev1.ModelCacheConfig{
				WeightsCache: &inferencev1.WeightsCacheConfig{Enabled: true},
				ImageCache:   &inferencev1.ImageCacheConfig{Enabled: true},
			},
		},
	}}
}

// Obj returns the built object.
func (w *JSMWrapper) Obj() *inferencev1.JumpStartModel { return &w.JumpStartModel }

// MakeModelDataCacheConfig returns a valid ModelDataCacheConfig for an S3 model.
func MakeModelDataCacheConfig(namespace, name string) *inferencev1.ModelDataCacheConfig {
	return &inferencev1.ModelDataCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: inferencev1.ModelDataCacheConfigSpec{
			ParentReference: inferencev1.ParentReference{
				Kind: "InferenceEndpointConfig", Namespace: namespace, Name: "example-model",
				UID: "8c1b7d5e-1f7a-4c1e-9a53-2d7c1f0b9e11",
			},
			ModelSourceConfig: inferencev1.ModelSourceConfig{
				ModelSourceType: inferencev1.ModelSourceS3,
				S3Storage:       &inferencev1.S3Storage{BucketName: "example-bucket", Region: "us-west-2"},
				ModelLocation:   "models/example-model",
			},
			HostPath:  inferencev1.DefaultWeightsCacheHostPath,
			Placement: inferencev1.Placement{InstanceTypes: []string{"ml.g5.24xlarge"}},
		},
	}
}

// MakeInferenceImageCache returns a valid InferenceImageCache.
func MakeInferenceImageCache(namespace, name string) *inferencev1.InferenceImageCache {
	return &inferencev1.InferenceImageCache{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: inferencev1.InferenceImageCacheSpec{
			Image:     "vllm/vllm-openai:latest",
			Placement: inferencev1.Placement{InstanceTypes: []string{"ml.g5.24xlarge"}},
		},
	}
}
