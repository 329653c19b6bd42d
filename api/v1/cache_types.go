package v1

import (
	corev1 "k8s.io/api/core/v1"
)

// ParentReference names the object that uses a cache: an InferenceEndpointConfig or
// JumpStartModel, or a ModelWeightsCacheConfig or ModelImageCache a user wrote.
type ParentReference struct {
	// kind is InferenceEndpointConfig or JumpStartModel; ModelWeightsCacheConfig for a weights
	// cache a user asked for, ModelImageCache for an image cache.
	// +required
	// +kubebuilder:validation:Enum=InferenceEndpointConfig;JumpStartModel;ModelWeightsCacheConfig;ModelImageCache
	Kind string `json:"kind"`
	// namespace is the parent's namespace.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// name is the parent's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// uid is the parent's UID.
	// +required
	// +kubebuilder:validation:MaxLength=36
	UID string `json:"uid"`
}

// Placement says which nodes a cache is for: the nodes the inference pods may run on.
type Placement struct {
	// instanceTypes selects nodes whose node.kubernetes.io/instance-type is one of these.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	InstanceTypes []string `json:"instanceTypes,omitempty"`

	// nodeAffinity selects nodes by its required terms.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`

	// tolerations let the cache run on tainted nodes.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// CacheState is a weights cache's overall state.
// +kubebuilder:validation:Enum=Pending;Downloading;Ready;Failed;Deleting
type CacheState string

const (
	CachePending     CacheState = "Pending"
	CacheDownloading CacheState = "Downloading"
	CacheReady       CacheState = "Ready"
	CacheFailed      CacheState = "Failed"
	CacheDeleting    CacheState = "Deleting"
)

// ImageCachePhase is an image cache's overall phase.
// +kubebuilder:validation:Enum=Pending;Pulling;Complete;Failed;Deleting
type ImageCachePhase string

const (
	ImagePending  ImageCachePhase = "Pending"
	ImagePulling  ImageCachePhase = "Pulling"
	ImageComplete ImageCachePhase = "Complete"
	ImageFailed   ImageCachePhase = "Failed"
	ImageDeleting ImageCachePhase = "Deleting"
)
