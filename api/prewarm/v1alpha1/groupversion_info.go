// Package v1alpha1 holds prewarm's own internal API (group prewarm.io): objects that only
// prewarm's components write, kept apart from the compatibility group.
//
// +kubebuilder:object:generate=true
// +groupName=prewarm.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of prewarm's internal API.
var GroupVersion = schema.GroupVersion{Group: "prewarm.io", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the types of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &NodeCache{}, &NodeCacheList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
