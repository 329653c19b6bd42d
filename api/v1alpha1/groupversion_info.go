// Package v1alpha1 holds the HyperPod kinds served only at version v1alpha1 of HyperPod's group:
// InferenceGatewayConfig, of the HyperPod inference EKS add-on's gateway. (HyperPod's other
// kinds are in api/v1; their v1alpha1 version is served from the same types.)
//
// +kubebuilder:object:generate=true
// +groupName=inference.sagemaker.aws.amazon.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is HyperPod's group at version v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "inference.sagemaker.aws.amazon.com", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the types of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &InferenceGatewayConfig{}, &InferenceGatewayConfigList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
