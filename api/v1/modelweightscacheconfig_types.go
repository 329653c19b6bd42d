package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelWeightsCacheConfigSpec is HyperPod's weights cache: a model held on the local disk of the
// nodes it selects. A user writes one to warm nodes with no endpoint (before a launch, say);
// prewarm also writes one, as a view, beside every ModelDataCacheConfig a parent asks for.
// +kubebuilder:validation:XValidation:rule="has(self.jumpStartModel) || self.modelSourceConfig.modelSourceType != 's3' || has(self.modelSourceConfig.s3Storage)",message="modelSourceType s3 needs s3Storage with bucketName (or jumpStartModel, whose source it is)"
// +kubebuilder:validation:XValidation:rule="has(self.jumpStartModel) || self.modelSourceConfig.modelSourceType != 'fsx' || has(self.modelSourceConfig.fsxStorage)",message="modelSourceType fsx needs fsxStorage with fileSystemId"
// +kubebuilder:validation:XValidation:rule="has(self.jumpStartModel) || self.modelSourceConfig.modelSourceType != 'huggingface' || has(self.modelSourceConfig.huggingFaceModel)",message="modelSourceType huggingface needs huggingFaceModel with modelId"
// +kubebuilder:validation:XValidation:rule="self.modelSourceConfig.modelSourceType != 'kubernetesVolume'",message="modelSourceType kubernetesVolume is a pod's own volume: there is nothing to cache on the nodes"
// +kubebuilder:validation:XValidation:rule="self.modelSourceConfig.modelSourceType != 'fsx' || !has(self.modelSourceConfig.modelLocation) || !self.modelSourceConfig.modelLocation.matches('(^|/)[.][.](/|$)')",message="modelLocation of an fsx source must not contain '..': it would leave the file system"
type ModelWeightsCacheConfigSpec struct {
	// enabled turns the cache on; false removes it from every node and keeps the object.
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// hostPath is the node directory that holds the cache; default /opt/dlami/nvme. It must be
	// one of the roots the cluster admin allows.
	// +optional
	// +kubebuilder:default="/opt/dlami/nvme"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') && self != '/'",message="hostPath must be an absolute path other than /"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="hostPath must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:cntrl:]]')",message="hostPath must not contain control characters"
	HostPath string `json:"hostPath,omitempty"`

	// jumpStartModel names a JumpStart model whose weights to cache; it resolves as a
	// JumpStartModel's spec.model does, and its source replaces modelSourceConfig's storage.
	// +optional
	JumpStartModel *JumpStartModelRef `json:"jumpStartModel,omitempty"`

	// modelSourceConfig is where the weights come from. With jumpStartModel, only its
	// modelSourceType is read.
	// +required
	ModelSourceConfig ModelSourceConfig `json:"modelSourceConfig"`

	// nodeAffinity selects the nodes that hold the cache by its required terms.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`

	// nodeSelector selects the nodes that hold the cache by their labels (every pair must
	// match, on top of nodeAffinity).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations let the cache reach tainted nodes, as a pod's would: a node with a taint that
	// neither these nor the operator configuration's tolerations tolerate is not a target.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// ModelWeightsCacheConfigStatus is HyperPod's status of a weights cache, as prewarm observed it
// through the ModelDataCacheConfig that does the work.
type ModelWeightsCacheConfigStatus struct {
	// state is the cache's overall state: Pending, Downloading, Ready, Failed or Deleting.
	// +optional
	State string `json:"state,omitempty"`
	// targetNodes is the number of nodes that should hold the cache.
	// +optional
	TargetNodes int32 `json:"targetNodes,omitempty"`
	// readyNodes is the number of nodes that hold it, verified.
	// +optional
	ReadyNodes int32 `json:"readyNodes,omitempty"`
	// message says, for people, why the cache is in this state.
	// +optional
	Message string `json:"message,omitempty"`
	// conditions say what is true of the cache and why: those of its ModelDataCacheConfig.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// cacheName is the ModelDataCacheConfig, in the same namespace, that does the work: every
	// node's copy is listed there and in kubectl prewarm status.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CacheName string `json:"cacheName,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="Target",type=integer,JSONPath=`.status.targetNodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ModelWeightsCacheConfig is HyperPod's weights cache kind. One a user writes warms the nodes it
// selects with its namespace's credentials; one prewarm writes mirrors a parent's
// ModelDataCacheConfig of the same name.
type ModelWeightsCacheConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired cache.
	// +required
	Spec ModelWeightsCacheConfigSpec `json:"spec"`
	// status is the observed cache.
	// +optional
	Status ModelWeightsCacheConfigStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ModelWeightsCacheConfigList is a list of ModelWeightsCacheConfig.
type ModelWeightsCacheConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelWeightsCacheConfig `json:"items"`
}

// ImageCacheParentReference is HyperPod's reference from a ModelImageCache to an object that
// uses it.
type ImageCacheParentReference struct {
	// kind is the parent's kind.
	// +required
	Kind string `json:"kind"`
	// namespace is the parent's namespace.
	// +required
	Namespace string `json:"namespace"`
	// name is the parent's name.
	// +required
	Name string `json:"name"`
	// uid is the parent's UID.
	// +required
	UID string `json:"uid"`
}

// ModelImageCacheSpec is HyperPod's image cache: an image pulled and pinned on the nodes it
// selects.
type ModelImageCacheSpec struct {
	// image is the image to pull and pin.
	// +required
	Image string `json:"image"`

	// nodeAffinity selects the nodes that hold the image by its required terms.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`

	// nodeSelector selects the nodes that hold the image by their labels.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations let the image reach tainted nodes, as a pod's would.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// parentReferences are the objects that use the image. prewarm fills them on the views it
	// writes of its InferenceImageCaches; a user's own image cache needs none.
	// +optional
	ParentReferences []ImageCacheParentReference `json:"parentReferences,omitempty"`
}

// ModelImageCacheState is an image cache's state as HyperPod names it.
// +kubebuilder:validation:Enum=Pending;Downloading;Ready;Failed;PartiallyReady;Deleting
type ModelImageCacheState string

const (
	ModelImagePending        ModelImageCacheState = "Pending"
	ModelImageDownloading    ModelImageCacheState = "Downloading"
	ModelImageReady          ModelImageCacheState = "Ready"
	ModelImageFailed         ModelImageCacheState = "Failed"
	ModelImagePartiallyReady ModelImageCacheState = "PartiallyReady"
	ModelImageDeleting       ModelImageCacheState = "Deleting"
)

// ModelImageCacheStatus is HyperPod's status of an image cache, as prewarm observed it through
// the InferenceImageCache that does the work.
type ModelImageCacheStatus struct {
	// state is the cache's overall state.
	// +optional
	State ModelImageCacheState `json:"state,omitempty"`
	// targetNodes is the number of nodes that should hold the image.
	// +optional
	TargetNodes int32 `json:"targetNodes,omitempty"`
	// readyNodes is the number of nodes that hold it.
	// +optional
	ReadyNodes int32 `json:"readyNodes,omitempty"`
	// resolvedDigest is the digest the nodes resolved the image to.
	// +optional
	ResolvedDigest string `json:"resolvedDigest,omitempty"`
	// message says, for people, why the cache is in this state.
	// +optional
	Message string `json:"message,omitempty"`
	// lastTransitionTime is when state last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// conditions say what is true of the cache and why: those of its InferenceImageCache.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// cacheName is the InferenceImageCache, in the operator namespace, that does the work.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CacheName string `json:"cacheName,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=mic,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="Target",type=integer,JSONPath=`.status.targetNodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ModelImageCache is HyperPod's image cache kind. One a user writes pulls and pins its image on
// the nodes it selects, with its namespace's pull secrets; one prewarm writes mirrors an
// InferenceImageCache of the same name.
type ModelImageCache struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired cache.
	// +required
	Spec ModelImageCacheSpec `json:"spec"`
	// status is the observed cache.
	// +optional
	Status ModelImageCacheStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ModelImageCacheList is a list of ModelImageCache.
type ModelImageCacheList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelImageCache `json:"items"`
}
