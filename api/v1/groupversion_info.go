// Package v1 holds the compatibility API of prewarm: the kinds and field names of the Amazon
// SageMaker HyperPod inference operator (group inference.sagemaker.aws.amazon.com, version v1),
// so that manifests written for HyperPod apply unchanged on any Kubernetes cluster.
//
// +kubebuilder:object:generate=true
// +groupName=inference.sagemaker.aws.amazon.com
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of the compatibility API.
var GroupVersion = schema.GroupVersion{Group: "inference.sagemaker.aws.amazon.com", Version: "v1"}

var (
	// SchemeBuilder registers the types of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&InferenceEndpointConfig{}, &InferenceEndpointConfigList{},
		&JumpStartModel{}, &JumpStartModelList{},
		&ModelDataCacheConfig{}, &ModelDataCacheConfigList{},
		&InferenceImageCache{}, &InferenceImageCacheList{},
		&ModelWeightsCacheConfig{}, &ModelWeightsCacheConfigList{},
		&ModelImageCache{}, &ModelImageCacheList{},
		&SageMakerEndpointRegistration{}, &SageMakerEndpointRegistrationList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
