package v1

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
