package v1

import (
	"cmp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InferenceImageCacheSpec is one image, to be pulled and pinned on every target node. prewarm
// writes it, one per (image, placement), shared by every parent that uses that image there.
type InferenceImageCacheSpec struct {
	// image is the image to pull and pin. It is immutable: the cache is named after its image
	// and placement, and its parents rely on it holding exactly that image.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.image is immutable: an image cache holds the image its parents named; prewarm creates another cache for another image"
	Image string `json:"image"`

	// imagePullSecrets are Secrets in the operator namespace used to pull the image.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// placement is the set of target nodes. It is immutable, as image is.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.placement is immutable: an image cache serves the placement its parents named; prewarm creates another cache for another placement"
	Placement Placement `json:"placement"`

	// parentReferences are the parents that use this image cache; it is deleted when the last
	// one goes.
	// +optional
	// +listType=map
	// +listMapKey=uid
	// +kubebuilder:validation:MaxItems=1000
	ParentReferences []ParentReference `json:"parentReferences,omitempty"`
}

// NodeImageStatus is one node's copy of the image.
type NodeImageStatus struct {
	// name is the node's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// phase is the node's pull phase.
	// +required
	Phase ImageCachePhase `json:"phase"`
	// reason is the pull's reason, e.g. ErrImagePull or ImagePullBackOff.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// message is the pull's message.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// InferenceImageCacheStatus is what prewarm observed of an image cache.
type InferenceImageCacheStatus struct {
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// phase is the cache's overall phase.
	// +optional
	Phase ImageCachePhase `json:"phase,omitempty"`
	// cachedNodes is the number of nodes that hold the image.
	// +optional
	CachedNodes int32 `json:"cachedNodes"`
	// targetNodes is the number of nodes that should hold it.
	// +optional
	TargetNodes int32 `json:"targetNodes"`
	// failedNodes is the number of target nodes that cannot pull it.
	// +optional
	FailedNodes int32 `json:"failedNodes,omitempty"`
	// imageDigest is the digest the nodes resolved the image to.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ImageDigest string `json:"imageDigest,omitempty"`
	// nodes are the target nodes' copies, at most MaxStatusNodes of them: those that cannot
	// pull the image first, then those pulling, then those that hold it. Every node's own
	// state is its pod of the cache's DaemonSet.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	Nodes []NodeImageStatus `json:"nodes,omitempty"`
	// conditions say what is true of the cache and why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=iic,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Cached",type=integer,JSONPath=`.status.cachedNodes`
// +kubebuilder:printcolumn:name="Target",type=integer,JSONPath=`.status.targetNodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// InferenceImageCache is an inference image, pulled and pinned on every target node. It lives in
// the operator namespace and is shared by every parent that uses the image on those nodes.
type InferenceImageCache struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired cache.
	// +required
	Spec InferenceImageCacheSpec `json:"spec"`
	// status is the observed cache.
	// +optional
	Status InferenceImageCacheStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// InferenceImageCacheList is a list of InferenceImageCache.
type InferenceImageCacheList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceImageCache `json:"items"`
}

// CompareImageAttention orders node entries as status.nodes lists them: those that cannot pull
// the image first, then those pulling, then those that hold it; by name within each.
func CompareImageAttention(a, b NodeImageStatus) int {
	rank := func(n NodeImageStatus) int {
		switch n.Phase {
		case ImageFailed:
			return 0
		case ImageComplete:
			return 2
		}
		return 1
	}
	return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a.Name, b.Name))
}
