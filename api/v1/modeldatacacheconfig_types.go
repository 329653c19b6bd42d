package v1

import (
	"cmp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelDataCacheConfigSpec is one model's weights, to be held on the local disk of every target
// node. prewarm writes it for a parent with weightsCache.enabled.
type ModelDataCacheConfigSpec struct {
	// parentReference is the InferenceEndpointConfig or JumpStartModel this cache serves.
	// +required
	ParentReference ParentReference `json:"parentReference"`

	// modelSourceConfig is where the weights come from, resolved (a JumpStart model id is
	// already turned into its concrete source).
	// +required
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 's3' || has(self.s3Storage)",message="modelSourceType s3 needs s3Storage with bucketName"
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'fsx' || has(self.fsxStorage)",message="modelSourceType fsx needs fsxStorage with fileSystemId"
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'huggingface' || has(self.huggingFaceModel)",message="modelSourceType huggingface needs huggingFaceModel with modelId"
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'fsx' || !has(self.modelLocation) || !self.modelLocation.matches('(^|/)[.][.](/|$)')",message="modelLocation of an fsx source must not contain '..': it would leave the file system"
	ModelSourceConfig ModelSourceConfig `json:"modelSourceConfig"`

	// hostPath is the node directory that holds the cache.
	// +required
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') && self != '/'",message="hostPath must be an absolute path other than /"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="hostPath must not contain '..'"
	HostPath string `json:"hostPath"`

	// placement is the set of target nodes.
	// +required
	Placement Placement `json:"placement"`
}

// CopyStatus is the state and progress of one node's copy of a weights cache, as the node's
// agent reports it (prewarmv1alpha1.CacheStatus), the cache's status lists it (NodeCacheStatus)
// and kubectl prewarm shows it. It is the one place to add a per-node field: both API types
// embed it inline, the controller copies it whole, the agent's write check compares it whole,
// and TestCopyStatusReachesKubectl (internal/cli/kubectl) fails until kubectl's report carries
// a new field too.
type CopyStatus struct {
	// state is the node's copy's state.
	// +required
	State CacheState `json:"state"`
	// bytesDone is how many bytes the node holds, verified or downloaded.
	// +optional
	BytesDone int64 `json:"bytesDone,omitempty"`
	// bytesTotal is the model's size.
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`
	// bytesPerSecond is the current download rate.
	// +optional
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`
	// diskBytes is what the cache takes on the node's disk now, measured (allocated blocks): its
	// copy, its partial download, and copies set aside while pods mount them.
	// +optional
	DiskBytes int64 `json:"diskBytes,omitempty"`
	// reason is a CamelCase word for why the node's copy is in this state.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// message says, for people, why the node's copy is in this state.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// NodeCacheStatus is one node's copy of a weights cache.
type NodeCacheStatus struct {
	// name is the node's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// The node's copy, as its agent reported it, or the controller's verdict on it.
	CopyStatus `json:",inline"`
	// lastTransitionTime is when state last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// retained is true for a node that is not a current target only because of its scheduling
	// state (cordoned, tainted, unreachable): it keeps its copy, downloads nothing new, and is
	// not counted in targetNodes; the message says until when it keeps it.
	// +optional
	Retained bool `json:"retained,omitempty"`
}

// ModelDataCacheConfigStatus is what prewarm observed of a weights cache.
type ModelDataCacheConfigStatus struct {
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// state is the cache's overall state.
	// +optional
	State CacheState `json:"state,omitempty"`
	// targetNodes is the number of nodes that should hold the cache.
	// +optional
	TargetNodes int32 `json:"targetNodes"`
	// readyNodes is the number of nodes that hold it, verified.
	// +optional
	ReadyNodes int32 `json:"readyNodes"`
	// downloadingNodes is the number of target nodes downloading it.
	// +optional
	DownloadingNodes int32 `json:"downloadingNodes,omitempty"`
	// failedNodes is the number of target nodes whose copy failed.
	// +optional
	FailedNodes int32 `json:"failedNodes,omitempty"`
	// settledNodes is the number of target nodes that hold the cache or failed for a reason
	// waiting will not fix: the Deployment gate opens when it reaches targetNodes.
	// +optional
	SettledNodes int32 `json:"settledNodes,omitempty"`
	// resolvedRevision pins the source: the commit of a Hugging Face repository, or the content
	// revision (a digest of every file's path, size and ETag/version) the first node holds of an
	// S3 or FSx source. Every node and every cold pod then reads exactly that.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	ResolvedRevision string `json:"resolvedRevision,omitempty"`
	// totalBytes is the size of the model.
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`
	// originBytes is how many bytes the nodes read from the model's source for their copies,
	// all together: with peers sharing parts, about totalBytes however many nodes there are.
	// +optional
	OriginBytes int64 `json:"originBytes,omitempty"`
	// peerBytes is how many bytes the nodes took from each other instead.
	// +optional
	PeerBytes int64 `json:"peerBytes,omitempty"`
	// nodes are the target nodes' copies, at most MaxStatusNodes of them: those that need
	// attention first (failed, then the slowest downloads, then waiting), then retained ones,
	// then Ready ones. Every node's own report is its NodeCache's status (kubectl prewarm
	// status lists them all).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	Nodes []NodeCacheStatus `json:"nodes,omitempty"`
	// capacity is what the controller found of the target nodes' room for the model, from its
	// size and what their agents report of their disks, before they download it.
	// +optional
	Capacity *CapacityStatus `json:"capacity,omitempty"`
	// conditions say what is true of the cache and why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CapacityStatus counts a cache's target nodes by whether they can hold the model.
type CapacityStatus struct {
	// modelBytes is the model's size, as listed from the source (by the controller, or by the
	// first node to list it).
	// +optional
	ModelBytes int64 `json:"modelBytes,omitempty"`
	// fitNodes are the target nodes that hold the model or have room for it (some by evicting
	// caches no pod uses).
	// +optional
	FitNodes int32 `json:"fitNodes"`
	// shortNodes are the target nodes that cannot hold it, even after evicting what the policy
	// lets go.
	// +optional
	ShortNodes int32 `json:"shortNodes"`
	// overBudgetNodes are the target nodes the namespace's quota keeps it off.
	// +optional
	OverBudgetNodes int32 `json:"overBudgetNodes"`
	// unknownNodes are the target nodes whose agents have not reported their disks.
	// +optional
	UnknownNodes int32 `json:"unknownNodes"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=mdcc,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Target",type=integer,JSONPath=`.status.targetNodes`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ModelDataCacheConfig is a model's weights cache: the model's files on the local disk of every
// target node. It lives in its parent's namespace.
type ModelDataCacheConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired cache.
	// +required
	Spec ModelDataCacheConfigSpec `json:"spec"`
	// status is the observed cache.
	// +optional
	Status ModelDataCacheConfigStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ModelDataCacheConfigList is a list of ModelDataCacheConfig.
type ModelDataCacheConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelDataCacheConfig `json:"items"`
}

// MaxStatusNodes is the most nodes a cache's status lists (status.nodes' maxItems), so that the
// object stays small (well under 256 KiB) on any fleet. Beyond it the status lists the nodes that
// need attention first, and the counts and the Ready condition cover every node.
const MaxStatusNodes = 100

// CompareAttention orders node entries as status.nodes lists them, those that need attention
// first: failed, then downloading (the least done first), then waiting, then retained, then
// Ready; by name within each.
func CompareAttention(a, b NodeCacheStatus) int {
	return cmp.Or(cmp.Compare(attentionRank(a), attentionRank(b)), cmp.Compare(permille(a), permille(b)), strings.Compare(a.Name, b.Name))
}

func attentionRank(n NodeCacheStatus) int {
	switch {
	case n.Retained:
		return 3
	case n.State == CacheFailed:
		return 0
	case n.State == CacheDownloading:
		return 1
	case n.State == CacheReady:
		return 4
	}
	return 2
}

func permille(n NodeCacheStatus) int64 {
	if n.BytesTotal <= 0 {
		return 0
	}
	return n.BytesDone * 1000 / n.BytesTotal
}
