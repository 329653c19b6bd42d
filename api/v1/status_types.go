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
	// ConditionCapacityAvailable: the weights cache's target nodes have room for the model, as
	// their agents report their disks, before any of them downloads it (Unknown while the
	// model's size is not known).
	ConditionCapacityAvailable = "CapacityAvailable"
	// ConditionWithinBudget: the weights cache keeps its namespace within the bytes its quota
	// lets it hold, per node and in the cluster (namespaceQuotas); absent when the namespace has
	// no byte limits.
	ConditionWithinBudget = "WithinBudget"
	// ConditionRegistered: a SageMakerEndpointRegistration is registered with SageMaker (never,
	// off SageMaker).
	ConditionRegistered = "Registered"
	// ConditionAutoscaling: the parent's autoScalingSpec scales its Deployment through a KEDA
	// ScaledObject, which KEDA reports Ready (absent when the parent asks for no autoscaling).
	ConditionAutoscaling = "Autoscaling"
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
	// ReasonDeploymentTimeout: the Deployment did not roll out within maxDeployTimeInSeconds.
	ReasonDeploymentTimeout = "DeploymentTimeout"
	ReasonCacheDisabled     = "CacheDisabled"
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
	// ReasonRegistryNotAllowed: the image is from a registry the operator configuration does
	// not let image caches pull from; the parent has no image cache.
	ReasonRegistryNotAllowed = "RegistryNotAllowed"
	// ReasonImageCacheQuotaExceeded: the parent's namespace already uses as many image caches
	// as the operator configuration allows one namespace; the parent has no image cache.
	ReasonImageCacheQuotaExceeded = "ImageCacheQuotaExceeded"
	// ReasonParentNotFound: a cache's parent reference does not resolve to the parent that made
	// it; the cache is asked of no node.
	ReasonParentNotFound = "ParentNotFound"
	// ReasonFits: every target node that reported its disk can hold the model.
	ReasonFits = "Fits"
	// ReasonCapacityShortfall: some target nodes cannot hold the model, even after evicting what
	// the policy lets go; their pods read the model from the source.
	ReasonCapacityShortfall = "CapacityShortfall"
	// ReasonSizeUnknown: the model's size is not known yet (the controller could not list the
	// source; a node will).
	ReasonSizeUnknown = "SizeUnknown"
	// ReasonDisksNotReported: no target node's agent has reported its disk yet (a new node, or
	// one whose agent is not running); the forecast waits for them.
	ReasonDisksNotReported = "DisksNotReported"
	// ReasonWithinBudget: the cache keeps its namespace within its quota's byte limits.
	ReasonWithinBudget = "WithinBudget"
	// ReasonBudgetExceeded: the cache would take its namespace past its quota's byte limits on
	// some nodes or in the cluster; those nodes keep no copy, and their pods read the model from
	// the source.
	ReasonBudgetExceeded = "BudgetExceeded"
	// ReasonNotAvailableOffSageMaker: a SageMakerEndpointRegistration asks for what only
	// SageMaker does; prewarm creates nothing for it.
	ReasonNotAvailableOffSageMaker = "NotAvailableOffSageMaker"
	// ReasonModelVersionNotFound: JumpStart's manifest has the model, but no version matching
	// modelVersion.
	ReasonModelVersionNotFound = "ModelVersionNotFound"
	// ReasonJumpStartUnavailable: JumpStart's manifest or a model's spec could not be read or
	// used (S3 unreachable, a malformed file, no image for the region); retried every minute.
	ReasonJumpStartUnavailable = "JumpStartUnavailable"
	// ReasonPrefetchDoesNotFit: prefetchEnabled would copy a model larger than the worker's
	// memory limit into the pod's memory; nothing is deployed.
	ReasonPrefetchDoesNotFit = "PrefetchDoesNotFit"
	// ReasonNodesNotGranted: the operator configuration grants the namespace's standalone
	// caches (ModelWeightsCacheConfig, ModelImageCache) no nodes; the cache is on no node.
	ReasonNodesNotGranted = "NodesNotGranted"
	// ReasonScaledObjectReady: KEDA scales the Deployment on the parent's triggers.
	ReasonScaledObjectReady = "ScaledObjectReady"
	// ReasonScaledObjectNotReady: KEDA has not reported the parent's ScaledObject ready yet, or
	// reports it failing (its message follows).
	ReasonScaledObjectNotReady = "ScaledObjectNotReady"
	// ReasonKEDANotInstalled: the parent asks for autoscaling and the cluster has no KEDA
	// (keda.sh ScaledObject is not served); spec.replicas is the count.
	ReasonKEDANotInstalled = "KEDANotInstalled"
	// ReasonInvalidAutoScaling: autoScalingSpec holds values HyperPod's schema accepts and KEDA
	// or the HPA refuses (named in the message); a ScaledObject written before keeps scaling.
	ReasonInvalidAutoScaling = "InvalidAutoScaling"
	// ReasonNoUsableTrigger: every trigger that names a metric cannot work here (a SageMaker
	// metric, no Prometheus server, no AWS region; the message says which and what to use);
	// spec.replicas is the count.
	ReasonNoUsableTrigger = "NoUsableTrigger"
	// ReasonMetricUnavailable: the ScaledObject is written (its counts hold), but a trigger reads
	// a metric this cluster never has (SageMaker's Invocations); the message says what to use.
	ReasonMetricUnavailable = "MetricUnavailable"
)

// ImageCacheState is HyperPod's summary of a parent's image cache.
// +kubebuilder:validation:Enum=Pending;Downloading;Ready;Failed;PartiallyReady
type ImageCacheState string

const (
	ImageCacheStatePending        ImageCacheState = "Pending"
	ImageCacheStateDownloading    ImageCacheState = "Downloading"
	ImageCacheStateReady          ImageCacheState = "Ready"
	ImageCacheStateFailed         ImageCacheState = "Failed"
	ImageCacheStatePartiallyReady ImageCacheState = "PartiallyReady"
)

// ImageCacheRollup is HyperPod's summary of a parent's image cache. prewarm does not set it:
// HyperPod's SDK and `hyp` CLI, whose status models do not declare it, would read no status at
// all. The parent's ImageCacheReady condition carries the same, and the InferenceImageCache the
// rest.
type ImageCacheRollup struct {
	// state is Pending, Downloading (nodes are pulling), Ready (every target node holds the
	// image), PartiallyReady (some do, others cannot pull it) or Failed (none can).
	// +optional
	State ImageCacheState `json:"state,omitempty"`
	// readyNodes is the number of nodes that hold the image.
	// +optional
	ReadyNodes int32 `json:"readyNodes,omitempty"`
	// targetNodes is the number of nodes that should hold the image.
	// +optional
	TargetNodes int32 `json:"targetNodes,omitempty"`
	// message says why the cache is in its state.
	// +optional
	Message string `json:"message,omitempty"`
}

// DeploymentStatus is the Deployment that serves a model, in HyperPod's shape.
type DeploymentStatus struct {
	// name is the Deployment's name.
	// +required
	Name string `json:"name"`
	// lastUpdated is when this was last written.
	// +required
	LastUpdated metav1.Time `json:"lastUpdated"`
	// deploymentObjectOverallState is the parent's state, as in status.state.
	// +optional
	DeploymentObjectOverallState string `json:"deploymentObjectOverallState,omitempty"`
	// reason is the Deployment's latest condition reason.
	// +optional
	Reason string `json:"reason,omitempty"`
	// message is the Deployment's latest condition message.
	// +optional
	Message string `json:"message,omitempty"`
	// status is the Deployment's own status.
	// +optional
	Status *DeploymentObjectStatus `json:"status,omitempty"`
}

// DeploymentObjectStatus is a Deployment's status, as HyperPod's schema holds it.
type DeploymentObjectStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// +optional
	AvailableReplicas int32 `json:"availableReplicas,omitempty"`
	// +optional
	UnavailableReplicas int32 `json:"unavailableReplicas,omitempty"`
	// +optional
	TerminatingReplicas *int32 `json:"terminatingReplicas,omitempty"`
	// +optional
	CollisionCount *int32 `json:"collisionCount,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []DeploymentObjectCondition `json:"conditions,omitempty"`
}

// DeploymentObjectCondition is one condition of a Deployment.
type DeploymentObjectCondition struct {
	// +required
	Type string `json:"type"`
	// +required
	Status string `json:"status"`
	// +optional
	LastUpdateTime *metav1.Time `json:"lastUpdateTime,omitempty"`
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// ParentStatus is what prewarm observed of a parent's deployment: an InferenceEndpointConfig's
// or a JumpStartModel's. It holds only what HyperPod's published status has and HyperPod's SDK
// reads (its status models refuse anything else, and then show no status at all): what prewarm
// adds is in conditions (types and reasons of its own), and in the cache objects.
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

	// imageCacheStatus is HyperPod's; prewarm does not set it (see ImageCacheRollup): the
	// ImageCacheReady condition says how the image cache stands.
	// +optional
	ImageCacheStatus *ImageCacheRollup `json:"imageCacheStatus,omitempty"`

	// deploymentStatus is the Deployment that serves the model, with its status.
	// +optional
	DeploymentStatus *DeploymentStatus `json:"deploymentStatus,omitempty"`

	// endpoints are the endpoints registered for the model; prewarm registers none (the model is
	// served by the Service of the parent's name).
	// +optional
	Endpoints *EndpointsStatus `json:"endpoints,omitempty"`

	// metricsStatus is HyperPod's; prewarm does not set it.
	// +optional
	MetricsStatus *MetricsStatus `json:"metricsStatus,omitempty"`

	// dataCaptureStatus is HyperPod's; prewarm does not set it.
	// +optional
	DataCaptureStatus *DataCaptureStatus `json:"dataCaptureStatus,omitempty"`

	// dnsStatus is HyperPod's; prewarm does not set it.
	// +optional
	DNSStatus *DNSStatus `json:"dnsStatus,omitempty"`

	// tlsCertificate is HyperPod's; prewarm does not set it.
	// +optional
	TLSCertificate *TLSCertificateStatus `json:"tlsCertificate,omitempty"`

	// conditions say what is true of the deployment and why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
