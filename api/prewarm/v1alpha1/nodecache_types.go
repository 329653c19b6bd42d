package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/prewarm/prewarm/api/v1"
)

// CacheRequest asks one node to hold one weights cache.
type CacheRequest struct {
	// uid is the ModelDataCacheConfig's UID; the cache lives in <root>/prewarm/<uid>.
	// +required
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:Pattern=`^[0-9a-f-]{36}$`
	UID string `json:"uid"`
	// namespace is the ModelDataCacheConfig's namespace.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// name is the ModelDataCacheConfig's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// root is the node directory (an allowed root) under which the cache is kept.
	// +required
	// +kubebuilder:validation:MaxLength=255
	Root string `json:"root"`
	// source is where the model comes from.
	// +required
	Source CacheSource `json:"source"`
	// credentials are the credentials the node reads the source with (a Hugging Face token, or
	// the parent namespace's S3 credentials), sealed to this node's agent key: no other agent
	// can open them, and the agents read no Secret.
	// +optional
	Credentials *SealedCredentials `json:"credentials,omitempty"`
	// retainedSince, when set, says the node stopped being a target of the cache at this time
	// (RFC 3339) for a reason of scheduling state only (cordoned, tainted, unreachable): the
	// node keeps what it holds but downloads nothing new, and the controller withdraws the
	// request once its retention has passed.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	RetainedSince string `json:"retainedSince,omitempty"`
	// peers are other nodes of the cache's swarm, whose agents this node's agent takes parts
	// from (and offers its own to) instead of reading every byte from the source.
	// +optional
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=64
	Peers []CachePeer `json:"peers,omitempty"`
	// priority orders the caches a node evicts to make room: a cache of lower priority goes
	// first, and a download never evicts a cache of higher priority than its own.
	// +optional
	Priority int32 `json:"priority,omitempty"`
	// pinned caches are never evicted to make room for others.
	// +optional
	Pinned bool `json:"pinned,omitempty"`
	// refused, when set, says why the node must keep no copy of the cache (its namespace's
	// quota in the cluster is used up): the agent writes nothing under the root and reports
	// the reason, and a pod of the cache on the node reads the model from the source into a
	// copy that goes with it.
	// +optional
	Refused *CacheRefusal `json:"refused,omitempty"`
}

// CacheRefusal is why a node keeps no copy of a cache it is asked about.
type CacheRefusal struct {
	// reason is a CamelCase word (BudgetExceeded).
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// message says why, for people.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// CachePeer is another node whose agent shares a cache's parts with this node's.
type CachePeer struct {
	// node is the peer's node name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// address is where the peer's agent serves parts (its NodeCache's status.peerAddress).
	// +required
	// +kubebuilder:validation:MaxLength=261
	Address string `json:"address"`
	// upstream marks a peer this node's group takes its parts from (a node that holds the
	// cache, or a group that started before); the others are this node's group, which reads
	// each part from the source (or the upstream) once, on one of its nodes.
	// +optional
	Upstream bool `json:"upstream,omitempty"`
}

// CacheSource is a model's address, typed: an S3 key prefix or a path is bytes, never URI
// syntax.
// +kubebuilder:validation:XValidation:rule="self.type != 's3' || (has(self.bucket) && !has(self.repoID) && !has(self.fileSystemID))",message="an s3 source has a bucket and no repoID or fileSystemID"
// +kubebuilder:validation:XValidation:rule="self.type != 'huggingface' || (has(self.repoID) && !has(self.bucket) && !has(self.fileSystemID))",message="a huggingface source has a repoID and no bucket or fileSystemID"
// +kubebuilder:validation:XValidation:rule="self.type != 'fsx' || (has(self.fileSystemID) && !has(self.bucket) && !has(self.repoID))",message="an fsx source has a fileSystemID and no bucket or repoID"
type CacheSource struct {
	// type is s3, huggingface or fsx.
	// +required
	// +kubebuilder:validation:Enum=s3;huggingface;fsx
	Type v1.ModelSourceType `json:"type"`
	// bucket is the S3 bucket.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket,omitempty"`
	// prefix is the S3 key prefix under which every object is a file of the model.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Prefix string `json:"prefix,omitempty"`
	// region is the S3 bucket's region.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Region string `json:"region,omitempty"`
	// repoID is the Hugging Face repository, org/name.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	RepoID string `json:"repoID,omitempty"`
	// revision is the Hugging Face commit the cache holds; for S3 and FSx, the content revision
	// the controller pins once a node holds the cache (a digest of every file's path, size and
	// ETag/version): every node, and every cold pod, then reads exactly that.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Revision string `json:"revision,omitempty"`
	// fileSystemID is the FSx for Lustre file system; the operator configuration says where
	// each is mounted on the nodes.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	FileSystemID string `json:"fileSystemID,omitempty"`
	// path is the model's directory inside the file system, relative to its root.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Path string `json:"path,omitempty"`
}

// String is the address for people and logs.
func (s CacheSource) String() string {
	switch s.Type {
	case v1.ModelSourceS3:
		return "s3://" + s.Bucket + "/" + s.Prefix
	case v1.ModelSourceHuggingFace:
		if s.Revision != "" {
			return "hf://" + s.RepoID + "@" + s.Revision
		}
		return "hf://" + s.RepoID
	case v1.ModelSourceFSx:
		return "fsx://" + s.FileSystemID + "/" + s.Path
	}
	return string(s.Type)
}

// SealedCredentials are credentials encrypted to one agent's key with HPKE (RFC 9180:
// DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305), bound to the node and the cache.
type SealedCredentials struct {
	// keyID identifies the agent key they are sealed to (status.credentialsKey).
	// +required
	// +kubebuilder:validation:MaxLength=64
	KeyID string `json:"keyID"`
	// digest identifies what is sealed, so that the controller seals again only when the
	// credentials or the key change.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Digest string `json:"digest"`
	// sealed is the encapsulated key and the ciphertext, base64.
	// +required
	// +kubebuilder:validation:MaxLength=8192
	Sealed string `json:"sealed"`
}

// Retained reports whether the request only keeps what the node holds.
func (r CacheRequest) Retained() bool { return r.RetainedSince != "" }

// MaxCachesPerNode is the most caches one NodeCache can ask its node for (spec.caches' maxItems).
const MaxCachesPerNode = 256

// NodeCacheSpec is what the controller wants one node to hold.
type NodeCacheSpec struct {
	// caches are the weights caches this node should hold.
	// +optional
	// +listType=map
	// +listMapKey=uid
	// +kubebuilder:validation:MaxItems=256
	Caches []CacheRequest `json:"caches,omitempty"`
}

// RootStatus is the filesystem under one allowed root.
type RootStatus struct {
	// path is the root, as parents name it (weightsCache.hostPath).
	// +required
	// +kubebuilder:validation:MaxLength=255
	Path string `json:"path"`
	// nodePath is where the root is on the node, when not at path.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	NodePath string `json:"nodePath,omitempty"`
	// reason, when set, says why the node keeps no cache under the root (NoLocalDisk).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// message says, for people, why the node keeps no cache under the root.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// capacityBytes is the filesystem's size.
	// +optional
	CapacityBytes int64 `json:"capacityBytes,omitempty"`
	// freeBytes is what caches may still take under the root without evicting: the filesystem's
	// free space after the agent's reserve, and no more than brings it to its high watermark.
	// +optional
	FreeBytes int64 `json:"freeBytes,omitempty"`
	// reservedBytes is what the agent keeps free for others and never fills.
	// +optional
	ReservedBytes int64 `json:"reservedBytes,omitempty"`
	// usedBytes is what the filesystem has in use, by anyone, as it reports it.
	// +optional
	UsedBytes int64 `json:"usedBytes,omitempty"`
	// cachedBytes is what prewarm's own files take under the root, measured on disk (allocated
	// blocks): every cache's copy, partial download and copies set aside while pods mount them.
	// +optional
	CachedBytes int64 `json:"cachedBytes,omitempty"`
	// highWatermarkPercent is the most of the filesystem caches may bring it to: a download
	// that would go past it first evicts caches no pod uses.
	// +optional
	HighWatermarkPercent int32 `json:"highWatermarkPercent,omitempty"`
	// lowWatermarkPercent is where eviction stops.
	// +optional
	LowWatermarkPercent int32 `json:"lowWatermarkPercent,omitempty"`
	// sharedWith names what else uses the root's filesystem (the kubelet's directory, the
	// container runtime's, the node's root filesystem), when something does: usedBytes is then
	// counted as the kubelet counts it, and the watermarks stay below the kubelet's thresholds.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	SharedWith string `json:"sharedWith,omitempty"`
	// kubeletThresholds says, for people, the kubelet's eviction and image garbage collection
	// thresholds the watermarks of a shared root derive from, and where each was read.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	KubeletThresholds string `json:"kubeletThresholds,omitempty"`
}

// MaxSharedWith and MaxKubeletThresholds are the longest RootStatus.SharedWith and
// KubeletThresholds.
const (
	MaxSharedWith        = 128
	MaxKubeletThresholds = 512
)

// CacheStatus is one cache's state on this node.
type CacheStatus struct {
	// uid is the ModelDataCacheConfig's UID.
	// +required
	// +kubebuilder:validation:MaxLength=36
	UID string `json:"uid"`
	// The copy's state and progress: what the cache's status and kubectl prewarm show of it.
	v1.CopyStatus `json:",inline"`
	// originBytes is how many bytes the node read from the source for this copy.
	// +optional
	OriginBytes int64 `json:"originBytes,omitempty"`
	// peerBytes is how many bytes of this copy the node took from peers, checked.
	// +optional
	PeerBytes int64 `json:"peerBytes,omitempty"`
	// files is the number of the model's files.
	// +optional
	Files int32 `json:"files,omitempty"`
	// revision is the source revision held: a Hugging Face commit, or the content revision of an
	// S3 or FSx source.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Revision string `json:"revision,omitempty"`
	// lastTransitionTime is when state last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// lastVerifiedTime is when the agent last read the whole cache back and found every file
	// matching its checksum.
	// +optional
	LastVerifiedTime *metav1.Time `json:"lastVerifiedTime,omitempty"`
}

// CacheDemand says that pods on the node, of one namespace, ask for a cache through prewarm's
// CSI volume.
type CacheDemand struct {
	// uid is the cache the pods' model volume names.
	// +required
	// +kubebuilder:validation:MaxLength=36
	UID string `json:"uid"`
	// namespace is the pods' namespace. The controller makes the node a target of the cache
	// only when it is the cache's own.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// pods is how many of the node's pods of that namespace ask for it.
	// +optional
	Pods int32 `json:"pods,omitempty"`
}

// MaxDemands is the most demands one NodeCache status reports.
const MaxDemands = 64

// NodeCacheStatus is what the node's agent reports.
type NodeCacheStatus struct {
	// credentialsKey is the agent's public key (HPKE DHKEM(X25519), base64), made when the agent
	// starts and held only in its memory: the controller seals each cache's credentials to it.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	CredentialsKey string `json:"credentialsKey,omitempty"`
	// agentVersion is the reporting agent's version.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	AgentVersion string `json:"agentVersion,omitempty"`
	// peerAddress is host:port where the agent serves the parts it holds to other prewarm
	// agents (empty: it does not).
	// +optional
	// +kubebuilder:validation:MaxLength=261
	PeerAddress string `json:"peerAddress,omitempty"`
	// heartbeatTime is when the agent last wrote this status. It writes on a change only; that
	// it is alive, its Lease says (AgentLeaseLabel).
	// +optional
	HeartbeatTime *metav1.Time `json:"heartbeatTime,omitempty"`
	// roots are the allowed roots' filesystems.
	// +optional
	// +listType=map
	// +listMapKey=path
	// +kubebuilder:validation:MaxItems=16
	Roots []RootStatus `json:"roots,omitempty"`
	// caches are the caches the node holds or is working on, including ones being removed.
	// +optional
	// +listType=map
	// +listMapKey=uid
	// +kubebuilder:validation:MaxItems=512
	Caches []CacheStatus `json:"caches,omitempty"`
	// demands are the caches that pods on the node ask for through prewarm's CSI volume: the
	// controller makes the node a target of each (fill on a miss), for pods of the cache's
	// own namespace.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Demands []CacheDemand `json:"demands,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.heartbeatTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// NodeCache is one node's weights caches: the controller writes which caches the node should
// hold (spec), the node's agent writes what it holds (status). It is named after its node.
type NodeCache struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the caches the node should hold.
	// +optional
	Spec NodeCacheSpec `json:"spec,omitempty"`
	// status is what the node's agent reports.
	// +optional
	Status NodeCacheStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// NodeCacheList is a list of NodeCache.
type NodeCacheList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeCache `json:"items"`
}

// Reasons an agent gives for a cache's state on its node (CamelCase, stable: scripts may match
// on them).
const (
	ReasonQueued               = "Queued"
	ReasonDownloading          = "Downloading"
	ReasonVerified             = "Verified"
	ReasonCacheLost            = "CacheLost"
	ReasonInsufficientCapacity = "InsufficientCapacity"
	ReasonHostPathNotAllowed   = "HostPathNotAllowed"
	ReasonSourceNotAllowed     = "SourceNotAllowed"
	ReasonSourceNotFound       = "SourceNotFound"
	ReasonAccessDenied         = "AccessDenied"
	ReasonVerificationFailed   = "VerificationFailed"
	ReasonSourceUnreachable    = "SourceUnreachable"
	ReasonDownloadFailed       = "DownloadFailed"
	ReasonRemoving             = "Removing"
	// ReasonNotTarget: the node is not a current target (see CacheRequest.RetainedSince) and
	// does not hold the cache, so it does not download it.
	ReasonNotTarget = "NotTarget"
	// ReasonInUse: the cache is no longer wanted on the node, but a pod there still uses it; its
	// files are removed once no pod does.
	ReasonInUse = "InUse"
	// ReasonCacheDamaged: files of a Ready cache no longer match their checksums or sizes; the
	// agent fetches those files again.
	ReasonCacheDamaged = "CacheDamaged"
	// ReasonInvalidSource: the source answers, but what it holds cannot be cached as listed
	// (a reserved or escaping file name, more files than one model may have, a request the
	// source refuses for good).
	ReasonInvalidSource = "InvalidSource"
	// ReasonSourceChanged: the source now holds other content than the revision the cache is
	// pinned to (objects rewritten under the same location); the node does not serve it.
	ReasonSourceChanged = "SourceChanged"
	// ReasonWaitingForCredentials: the cache's credentials are sealed to an earlier key of the
	// agent (it restarted); the controller seals them to the current key.
	ReasonWaitingForCredentials = "WaitingForCredentials"
	// ReasonNodeCacheFull says the node's request list has no room for the cache: it is already
	// asked for MaxCachesPerNode other caches, or for its namespace's share of them, or the
	// list would take more bytes than a NodeCache holds.
	ReasonNodeCacheFull = "NodeCacheFull"
	// ReasonRequestInvalid: the node's request for the cache is one the API server refuses (a
	// value past the NodeCache schema's limits, or an admission policy): the node is not asked,
	// and the node's other caches are written without it.
	ReasonRequestInvalid = "RequestInvalid"
	// ReasonNoLocalDisk: the cache's root is no data disk on this node (it does not exist, it is
	// in memory, or it is a directory of the node's root filesystem and the operator
	// configuration does not allow that: cacheRoots[].allowRootFilesystem). The node
	// keeps no cache; its pods read the model from the source into a copy that goes with them.
	ReasonNoLocalDisk = "NoLocalDisk"
	// ReasonEvicted: the node removed the cache to make room for another (or to bring its disk
	// back under its high watermark). It is fetched again when there is room without evicting
	// anything, or at once when a pod on the node asks for it.
	ReasonEvicted = "Evicted"
	// ReasonBudgetExceeded: the cache would take its namespace past what its quota lets it hold
	// on the node (namespaceQuotas[].maxBytesPerNode), or, in the controller's report, in the
	// cluster (maxBytes). The node keeps no copy. Past the per-node limit it makes none for its
	// pods there either (they wait, their mount refused with the figures); past the cluster's,
	// its pods read the model from the source into a copy that goes with them, which counts in
	// the per-node limit.
	ReasonBudgetExceeded = "BudgetExceeded"
)

// Terminal reports whether a failure reason is one that waiting will not fix: a node whose
// cache failed for such a reason counts as settled for the Deployment gate.
func Terminal(reason string) bool {
	switch reason {
	case ReasonInsufficientCapacity, ReasonHostPathNotAllowed, ReasonSourceNotAllowed, ReasonSourceNotFound, ReasonAccessDenied,
		ReasonInvalidSource, ReasonNodeCacheFull, ReasonRequestInvalid, ReasonSourceChanged, ReasonNoLocalDisk, ReasonBudgetExceeded:
		return true
	}
	return false
}

// AgentLeaseLabel marks the Leases (coordination.k8s.io) the agents renew: one per node, named
// after it, in the operator namespace. A node's agent is alive while its Lease is: renewed
// within its leaseDurationSeconds.
const AgentLeaseLabel = "prewarm.io/agent-lease"

// Reasons for a cache the node's agent does not report on (yet).
const (
	// ReasonAgentNotReporting: no agent has written the NodeCache's status, or the agent's Lease
	// has expired (it stopped renewing it): what it last reported is not counted.
	ReasonAgentNotReporting = "AgentNotReporting"
	// ReasonRequested: the agent reports, but not on this cache yet.
	ReasonRequested = "Requested"
)

// Report is what the node's agent reports on cache uid, and whether it reports on it at all;
// when it does not, a Pending report says why (nc may be nil: no NodeCache).
func (nc *NodeCache) Report(uid string) (CacheStatus, bool) {
	if nc != nil {
		for _, c := range nc.Status.Caches {
			if c.UID == uid {
				return c, true
			}
		}
	}
	if nc == nil || nc.Status.HeartbeatTime == nil {
		return CacheStatus{UID: uid, CopyStatus: v1.CopyStatus{State: v1.CachePending, Reason: ReasonAgentNotReporting,
			Message: "no prewarm agent reports on this node; is the agent DaemonSet running here?"}}, false
	}
	return CacheStatus{UID: uid, CopyStatus: v1.CopyStatus{State: v1.CachePending, Reason: ReasonRequested,
		Message: "the node's agent has not picked the cache up yet"}}, false
}
