package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeploymentState is a parent's overall state.
// +kubebuilder:validation:Enum=DeploymentPending;DeploymentInProgress;DeploymentComplete;DeploymentFailed;DeletionPending;DeletionInProgress;DeletionFailed;DeletionComplete
type DeploymentState string

const (
	DeploymentPending    DeploymentState = "DeploymentPending"
	DeploymentInProgress DeploymentState = "DeploymentInProgress"
	DeploymentComplete   DeploymentState = "DeploymentComplete"
	DeploymentFailed     DeploymentState = "DeploymentFailed"
	DeletionPending      DeploymentState = "DeletionPending"
	DeletionInProgress   DeploymentState = "DeletionInProgress"
	DeletionFailed       DeploymentState = "DeletionFailed"
	DeletionComplete     DeploymentState = "DeletionComplete"
)

// Condition types on parents and caches.
const (
	// ConditionReady: the object is fully in its desired state.
	ConditionReady = "Ready"
	// ConditionWeightsCacheReady: every target node holds the weights, verified.
	ConditionWeightsCacheReady = "WeightsCacheReady"
	// ConditionImageCacheReady: every target node holds the image.
	ConditionImageCacheReady = "ImageCacheReady"
	// ConditionGated: the Deployment is held back until the weights cache settles.
	ConditionGated = "Gated"
	// ConditionUnsupported: the spec sets fields that are accepted but have no effect here.
	ConditionUnsupported = "Unsupported"
)

// Condition reasons (CamelCase, stable: scripts may match on them).
const (
	ReasonAllNodesReady        = "AllNodesReady"
	ReasonDownloading          = "Downloading"
	ReasonNoTargetNodes        = "NoTargetNodes"
	ReasonInsufficientCapacity = "InsufficientCapacity"
	ReasonHostPathNotAllowed   = "HostPathNotAllowed"
	ReasonSourceUnreachable    = "SourceUnreachable"
	ReasonSourceNotAllowed     = "SourceNotAllowed"
	ReasonGateOpen             = "GateOpen"
	ReasonGateTimeout          = "GateTimeout"
	ReasonWaitingForCache      = "WaitingForCache"
	ReasonFieldsWithoutEffect  = "FieldsWithoutEffect"
	ReasonPulling              = "Pulling"
	ReasonPullFailed           = "PullFailed"
	ReasonEULANotAccepted      = "EULANotAccepted"
	ReasonModelNotInCatalog    = "ModelNotInCatalog"
	ReasonTokenSecretProblem   = "TokenSecretProblem"
	ReasonDeploymentCreated    = "DeploymentCreated"
	ReasonCacheDisabled        = "CacheDisabled"
	// ReasonInvalidSpec: an object prewarm derives from the parent would be refused by the API
	// server (a name that is no valid Service name, a volume name prewarm uses, an invalid
	// operator); nothing is created until the spec changes.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonNameConflict: an object prewarm would create already exists and is not this parent's;
	// prewarm never overwrites it.
	ReasonNameConflict = "NameConflict"
	// ReasonPodSecurity: the namespace enforces a Pod Security level that refuses the pods'
	// hostPath volumes.
	ReasonPodSecurity = "PodSecurity"
	// ReasonReplicaFailure: the Deployment cannot create pods; the message is the API server's.
	ReasonReplicaFailure = "ReplicaFailure"
	// ReasonImageCacheMismatch: the image cache of the name this parent's image and placement
	// give holds something else; the parent does not use it.
	ReasonImageCacheMismatch = "ImageCacheMismatch"
	// ReasonParentNotFound: a cache's parent reference does not resolve to the parent that made
	// it; the cache is asked of no node.
	ReasonParentNotFound = "ParentNotFound"
)

// WeightsCacheRollup is a parent's view of its weights cache.
type WeightsCacheRollup struct {
	// name is the ModelDataCacheConfig's name.
	// +optional
	Name string `json:"name,omitempty"`
	// state is the cache's state.
	// +optional
	State CacheState `json:"state,omitempty"`
	// targetNodes is the number of nodes that should hold the cache.
	// +optional
	TargetNodes int32 `json:"targetNodes,omitempty"`
	// readyNodes is the number of nodes that hold it, verified.
	// +optional
	ReadyNodes int32 `json:"readyNodes,omitempty"`
}

// ImageCacheRollup is a parent's view of its image cache.
type ImageCacheRollup struct {
	// name is the InferenceImageCache's name.
	// +optional
	Name string `json:"name,omitempty"`
	// namespace is the InferenceImageCache's namespace.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// phase is the cache's phase.
	// +optional
	Phase ImageCachePhase `json:"phase,omitempty"`
	// targetNodes is the number of nodes that should hold the image.
	// +optional
	TargetNodes int32 `json:"targetNodes,omitempty"`
	// cachedNodes is the number of nodes that hold it.
	// +optional
	CachedNodes int32 `json:"cachedNodes,omitempty"`
}

// DeploymentRef names the Deployment that serves a model.
type DeploymentRef struct {
	// name is the Deployment's name.
	// +optional
	Name string `json:"name,omitempty"`
	// readyReplicas is the Deployment's number of ready pods.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
}

// ParentStatus is what prewarm observed of a parent's deployment: an InferenceEndpointConfig's
// or a JumpStartModel's.
type ParentStatus struct {
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// state is the deployment's overall state.
	// +optional
	State DeploymentState `json:"state,omitempty"`

	// replicas is the number of inference pods (the scale subresource reads it).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// selector is the label selector of the inference pods, as a string (the scale subresource
	// reads it).
	// +optional
	Selector string `json:"selector,omitempty"`

	// weightsCacheStatus rolls up the weights cache.
	// +optional
	WeightsCacheStatus *WeightsCacheRollup `json:"weightsCacheStatus,omitempty"`

	// imageCacheStatus rolls up the image cache.
	// +optional
	ImageCacheStatus *ImageCacheRollup `json:"imageCacheStatus,omitempty"`

	// deploymentStatus names the Deployment that serves the model.
	// +optional
	DeploymentStatus *DeploymentRef `json:"deploymentStatus,omitempty"`

	// conditions say what is true of the deployment and why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
