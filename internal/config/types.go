package config

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CacheRoot is one node directory weights caches may be kept under.
type CacheRoot struct {
	// Path is the root as parents name it (weightsCache.hostPath; HyperPod's default is
	// [DefaultCacheRoot]).
	Path string `json:"path"`
	// NodePath is where the root is on the nodes, when not at Path: the instance-store array
	// that EKS's nodeadm or Karpenter mount at /mnt/k8s-disks/0, say, still serves parents that
	// keep HyperPod's default hostPath.
	NodePath string `json:"nodePath,omitempty"`
	// AllowRootFilesystem lets the agents keep caches under the root even when it is a
	// directory of the node's root filesystem (the OS disk, mounted at /). Without it, such a
	// node reports NoLocalDisk and keeps no cache: a model of 100 GB or more would fill the
	// small disk the system, the kubelet and the container runtime need. A data disk the
	// kubelet and the container runtime also use needs no such setting. On either, caches stay
	// below the kubelet's thresholds (Agent.Kubelet).
	AllowRootFilesystem bool `json:"allowRootFilesystem,omitempty"`
	// HighWatermarkPercent is the most of the root's filesystem, in percent of its capacity,
	// that may be used once a cache is written ([DefaultHighWatermarkPercent]): a download that would go past it first
	// evicts caches no pod uses, by policy, and a disk found above it (other files grew) has
	// caches evicted until it is at LowWatermarkPercent. On a filesystem the kubelet or the
	// container runtime also use, the agent lowers both below the kubelet's thresholds
	// (Agent.Kubelet) when they are not already.
	HighWatermarkPercent int32 `json:"highWatermarkPercent,omitempty"`
	// LowWatermarkPercent is where eviction stops ([DefaultLowWatermarkPercent]): a download that must evict frees
	// enough that, with it written, the disk is at most this full, so that the next one does
	// not evict again at once.
	LowWatermarkPercent int32 `json:"lowWatermarkPercent,omitempty"`
}

// OnNode is where the root is on the nodes.
func (r CacheRoot) OnNode() string {
	if r.NodePath != "" {
		return r.NodePath
	}
	return r.Path
}

// Placement says how parents' placement fields find nodes, and what the pods prewarm creates
// tolerate.
type Placement struct {
	// InstanceTypes maps instance types that parents name (instanceType, instanceTypes, a
	// JumpStartModel's server.instanceType) to the nodes of this cluster that are of them, where
	// those nodes do not carry the type in node.kubernetes.io/instance-type (GKE, AKS,
	// on-premises). An instance type not listed selects the nodes labelled with it, or with it
	// less its "ml." prefix (ml.g5.24xlarge: HyperPod's nodes and EKS's g5.24xlarge nodes).
	InstanceTypes []InstanceTypeNodes `json:"instanceTypes,omitempty"`
	// Tolerations are added to every pod prewarm creates (the inference pods and the image
	// cache's), and nodes are judged with them.
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// ExtendedResourceTolerations says whether the pods tolerate, for each extended resource
	// they request (nvidia.com/gpu), the NoSchedule taint of that name, as the
	// ExtendedResourceToleration admission plugin (on in EKS and GKE) makes them: auto (the
	// default) asks the API server whether it runs that plugin, and if it does, the pods carry
	// those tolerations; on always; off never.
	ExtendedResourceTolerations string `json:"extendedResourceTolerations,omitempty"`
}

// Modes of Placement.ExtendedResourceTolerations.
const (
	ExtendedResourceTolerationsAuto = "auto"
	ExtendedResourceTolerationsOn   = "on"
	ExtendedResourceTolerationsOff  = "off"
)

// InstanceTypeNodes are the nodes of one instance type on this cluster: those that carry every
// label of NodeSelector and match every expression.
type InstanceTypeNodes struct {
	// InstanceType is the type as parents name it (ml.g5.24xlarge).
	InstanceType string `json:"instanceType"`
	// NodeSelector are labels the nodes carry (cloud.google.com/gke-accelerator: nvidia-l4).
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// MatchExpressions are node selector requirements, for what labels alone cannot say.
	MatchExpressions []corev1.NodeSelectorRequirement `json:"matchExpressions,omitempty"`
}

// OperatorConfiguration is the shared configuration.
type OperatorConfiguration struct {
	Kind       string `json:"kind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	// OperatorNamespace is where prewarm runs and keeps its shared objects: the image caches,
	// the JumpStart catalog, the agents ([DefaultOperatorNamespace]; the chart sets the release's).
	OperatorNamespace string `json:"operatorNamespace,omitempty"`
	// CacheRoots are the node directories weights caches may be kept under. A cache's hostPath
	// must name one of them, and they are the only host paths the agents write.
	CacheRoots []CacheRoot `json:"cacheRoots,omitempty"`
	// Placement says how the parents' placement fields find this cluster's nodes, and which
	// tolerations the pods prewarm creates carry.
	Placement Placement `json:"placement,omitempty"`
	// S3 says how S3 is reached.
	S3 S3 `json:"s3,omitempty"`
	// HuggingFace says how the Hugging Face Hub is reached.
	HuggingFace HuggingFace `json:"huggingFace,omitempty"`
	// FSx maps each FSx for Lustre file system a cache may read to where it is mounted on the
	// nodes. A file system not listed is refused.
	FSx []FSxMount `json:"fsx,omitempty"`
	// SourceAccess lists the sources prewarm may read with its own identity (the agents' AWS
	// identity, the agents' and pods' access to FSx mounts) on behalf of a namespace. Any other
	// S3 source is read only with credentials the parent's namespace provides
	// (s3.credentialsSecret); any other FSx source is refused.
	SourceAccess []SourceRule `json:"sourceAccess,omitempty"`
	// Controller tunes the controller.
	Controller Controller `json:"controller,omitempty"`
	// Agent tunes the agents.
	Agent Agent `json:"agent,omitempty"`
	// Peers says how the agents share the parts of the caches they download with each other.
	Peers Peers `json:"peers,omitempty"`
	// NamespaceQuotas say how many bytes of caches namespaces may hold, per node and in the
	// cluster, and which may raise their caches' eviction priority or pin them.
	NamespaceQuotas []NamespaceQuota `json:"namespaceQuotas,omitempty"`
	// JumpStart says where JumpStart model ids the catalog ConfigMap does not list are
	// resolved: JumpStart's public model manifest and spec files of a region.
	JumpStart JumpStart `json:"jumpStart,omitempty"`
	// ImageCaches says which registries image caches may pull from, and how many one
	// namespace may use.
	ImageCaches ImageCaches `json:"imageCaches,omitempty"`
	// Autoscaling is how parents' autoScalingSpec reaches KEDA.
	Autoscaling Autoscaling `json:"autoscaling,omitempty"`
	// StandaloneCacheNodes says which nodes the standalone caches of each namespace may be kept
	// on, and which of their tolerations are honoured: the first entry naming a namespace (or
	// "*") is its own; a namespace no entry names has its standalone caches on no node. Unset:
	// DefaultStandaloneCacheNodes.
	StandaloneCacheNodes []NodeGrant `json:"standaloneCacheNodes,omitempty"`
}

// NodeGrant grants the standalone caches of some namespaces (the ModelWeightsCacheConfigs and
// ModelImageCaches they write, with no endpoint) some nodes. Such a cache has no pods of its
// namespace to follow: prewarm's agents and image pullers hold it, with prewarm's rights and
// outside the namespace's admission, so its own nodeSelector, nodeAffinity and tolerations
// alone would let a tenant reach any node, other tenants' dedicated pools and the control plane
// among them. A node is a target of such a cache only when the grant's NodeSelector and
// MatchExpressions select it too, and a toleration of the cache is honoured only as far as the
// tolerations the grant allows cover it.
type NodeGrant struct {
	// Namespaces the grant is for; "*" is every namespace.
	Namespaces []string `json:"namespaces"`
	// NodeSelector are labels the nodes must carry.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// MatchExpressions are node selector requirements the nodes must meet, for what labels
	// alone cannot say (node-role.kubernetes.io/control-plane DoesNotExist).
	MatchExpressions []corev1.NodeSelectorRequirement `json:"matchExpressions,omitempty"`
	// Tolerations are the tolerations the namespaces' standalone caches may use, besides
	// placement.tolerations and, for each extended resource (nvidia.com/gpu), the toleration
	// of the NoSchedule taint of that name, which they may always use. A cache's toleration is
	// honoured as far as one of these covers it ({operator: Exists} as each of them).
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// ControlPlaneLabel marks the nodes of the cluster's control plane.
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// JumpStart says where JumpStart's own metadata is read. With no region, JumpStart model ids
// resolve through the catalog ConfigMap only (an air-gapped cluster).
type JumpStart struct {
	// Region is the AWS region whose JumpStart content the models come from (us-west-2).
	Region string `json:"region,omitempty"`
	// Bucket is the region's content bucket (default jumpstart-cache-prod-<region>), or a
	// mirror of it; GatedBucket the gated models' (default jumpstart-private-cache-prod-<region>).
	Bucket      string `json:"bucket,omitempty"`
	GatedBucket string `json:"gatedBucket,omitempty"`
	// Endpoint is an S3-compatible endpoint holding them (default: s3.endpoint, else AWS S3).
	Endpoint string `json:"endpoint,omitempty"`
	// Images maps a spec's framework and version ("djl-lmi:0.29.0", from its
	// hosting_ecr_specs) to the image to run, for a model whose spec names no image for the
	// region.
	Images map[string]string `json:"images,omitempty"`
	// Refresh is how long the manifest is used before it is revalidated (default 5m).
	Refresh metav1.Duration `json:"refresh,omitempty"`
}

// Annotations on a ModelDataCacheConfig (or the parent it is made for, which passes them on)
// with which a namespace's owner asks for its cache's eviction priority, and for it to be
// pinned, within what the namespace's quota grants.
const (
	PriorityAnnotation = "prewarm.io/cache-priority"
	PinnedAnnotation   = "prewarm.io/cache-pinned"
)

// NamespaceQuota is what the operator grants some namespaces' weights caches: how many bytes of
// caches they may hold on each node and in the whole cluster, and what they may ask of eviction.
// A node short of room evicts the caches of lowest priority first (then the least recently
// used), never one of higher priority than the download that needs the room, and never a
// pinned one.
type NamespaceQuota struct {
	// Namespaces the quota is for; "*" is every namespace.
	Namespaces []string `json:"namespaces"`
	// MaxBytesPerNode is the most the caches of each of these namespaces may hold together on
	// one node (the sum of their models' sizes; unset: no limit), with the copies the node makes
	// for their pods when it cannot hold a cache (Agent.MaxScratchBytes). A node's agent refuses
	// a cache past it (BudgetExceeded), and a pod's copy past it (the pod waits).
	MaxBytesPerNode *resource.Quantity `json:"maxBytesPerNode,omitempty"`
	// MaxBytes is the most the caches of each of these namespaces may hold in the cluster: the
	// sum, over its caches, of the model's size times the nodes asked to hold it (unset: no
	// limit).
	// A cache is asked of as many of its target nodes as fit (BudgetExceeded).
	MaxBytes *resource.Quantity `json:"maxBytes,omitempty"`
	// DefaultPriority is the eviction priority of the namespaces' caches that ask for none (0).
	DefaultPriority int32 `json:"defaultPriority,omitempty"`
	// MaxPriority is the highest priority the namespaces' caches may ask for (0).
	MaxPriority int32 `json:"maxPriority,omitempty"`
	// AllowPin lets the namespaces pin their caches (prewarm.io/cache-pinned: "true"): a pinned
	// cache is never evicted, so each pin takes its size out of every target node's disk for
	// good.
	AllowPin bool `json:"allowPin,omitempty"`
	// DefaultPinned pins the namespaces' caches that do not ask otherwise; it needs AllowPin.
	DefaultPinned bool `json:"defaultPinned,omitempty"`
	// MaxCachesPerNode is the most caches each of these namespaces may have asked of one node,
	// of the MaxCachesPerNode (256) a node is asked for in all: its share of the node's cache
	// slots (unset: DefaultCachesPerNode). A cache past it is not asked of the node
	// (NodeCacheFull).
	MaxCachesPerNode *int32 `json:"maxCachesPerNode,omitempty"`
}

// Peers configure the sharing of parts between agents (docs/peers.md).
type Peers struct {
	// Disabled turns sharing off: every node reads the whole model from its source.
	Disabled bool `json:"disabled,omitempty"`
	// Port is where each agent serves its parts, on the node's network ([DefaultPeerPort]).
	Port int `json:"port,omitempty"`
	// GroupSize is how many nodes share one reading of the source ([DefaultPeerGroupSize], 2 to
	// 32); a group
	// takes its parts from one group before it, so the source is read about once in all.
	GroupSize int `json:"groupSize,omitempty"`
	// MaxPeers is how many peers one agent sends parts to at once ([DefaultMaxPeers]).
	MaxPeers int `json:"maxPeers,omitempty"`
	// UploadRate caps the bytes per second one agent sends to its peers (0: no cap).
	UploadRate *resource.Quantity `json:"uploadRate,omitempty"`
	// Stall is how long a part may go without progress before another node takes it
	// ([DefaultPeerStall]): a part its reader has not moved for Stall is read by the next node of
	// the group (the one after at twice Stall, and so on), a node whose reads all stalled owns
	// nothing until they move, and a peer that sends nothing of a part for twice Stall is asked
	// no more until it answers again.
	Stall metav1.Duration `json:"stall,omitempty"`
	// Wait is the last resort ([DefaultPeerWait]): when a group takes its parts from another, a
	// part no peer holds or reads for Wait is read from the source.
	Wait metav1.Duration `json:"wait,omitempty"`
	// Streams is how many parts one agent takes from its peers at once, per download
	// ([DefaultPeerStreams]).
	Streams int `json:"streams,omitempty"`
	// Audience is the audience of the service account tokens agents present to each other
	// ([DefaultPeerAudience]).
	Audience string `json:"audience,omitempty"`
	// Trust says which files a node takes from its peers. SourceDigests (the default): only
	// files the source vouches for with a cryptographic digest (a Hugging Face SHA-256 or git
	// blob id, an S3 SHA-256 or SHA-1 checksum, a single-part MD5 ETag), each verified by that
	// digest before it is served; every node reads the other files from the source. AllNodes:
	// every file, trusting every node not to lie about those with only a CRC or a size
	// (docs/security.md).
	Trust string `json:"trust,omitempty"`
	// Witness is the controller's witness: with Trust SourceDigests, the agents read the parts
	// of S3 files that have no SHA-256 of their own (uploaded in parts, with only a CRC)
	// through it, so that such files are shared too, checked against the digests it computed
	// (docs/security.md).
	Witness Witness `json:"witness,omitempty"`
}

// Witness configures the controller's witness (Peers.Witness).
type Witness struct {
	// Disabled turns it off: every node reads the S3 files without a SHA-256 from the source.
	Disabled bool `json:"disabled,omitempty"`
	// Port is where the controller serves it, behind the prewarm-witness Service
	// ([DefaultWitnessPort]): the chart passes it to the controller (--witness-bind-address)
	// and the agents (--witness-url).
	Port int `json:"port,omitempty"`
	// Audience is the audience of the service account tokens agents present to it
	// ([DefaultWitnessAudience]).
	Audience string `json:"audience,omitempty"`
}

// WitnessService names the Service, in the operator namespace, the agents reach the controller's
// witness by.
const WitnessService = "prewarm-witness"

// Peer trust levels (Peers.Trust).
const (
	TrustSourceDigests = "SourceDigests"
	TrustAllNodes      = "AllNodes"
)

// TrustsAllNodes says whether parts without a source digest may come from peers.
func (p Peers) TrustsAllNodes() bool { return p.Trust == TrustAllNodes }

// Witnessed says whether the agents read the S3 files without a digest through the controller's
// witness.
func (p Peers) Witnessed() bool { return !p.Disabled && !p.Witness.Disabled && !p.TrustsAllNodes() }

// Budget is what one node may ask of an origin.
type Budget struct {
	// MaxConcurrency is how many ranged reads one node keeps in flight to the origin, all its
	// downloads together (0: each download's agent.concurrency).
	MaxConcurrency int `json:"maxConcurrency,omitempty"`
	// MaxRate caps the bytes per second one node reads from the origin (0: no cap).
	MaxRate *resource.Quantity `json:"maxRate,omitempty"`
}

// MaxRateBytes is the rate cap in bytes per second (0: none).
func (b Budget) MaxRateBytes() int64 { return bytesOf(b.MaxRate) }

// UploadRateBytes is the upload cap in bytes per second (0: none).
func (p Peers) UploadRateBytes() int64 { return bytesOf(p.UploadRate) }

// Controller tunes the controller. Durations are Go durations (30m, 24h).
type Controller struct {
	// GateTimeout is the longest a Deployment waits for its weights cache to settle ([DefaultGateTimeout]).
	GateTimeout metav1.Duration `json:"gateTimeout,omitempty"`
	// DeletionTimeout is the longest a deleted cache waits for the nodes that report it to say
	// they removed its files ([DefaultDeletionTimeout]); past it the cache goes, with a Warning naming them. An
	// agent removes the files of a cache no request names whether or not the cache still exists,
	// so this bounds only how long deletion is shown.
	DeletionTimeout metav1.Duration `json:"deletionTimeout,omitempty"`
	// Retention is how long a cordoned, tainted or unreachable node that a cache's placement
	// still selects keeps its copy ([DefaultRetention]).
	Retention metav1.Duration `json:"retention,omitempty"`
	// AgentImage is the agent's image: the init container of inference pods without a weights
	// cache, and the image cache's pods' installer.
	AgentImage string `json:"agentImage,omitempty"`
	// ImagePullSecrets name Secrets the pods prewarm creates pull the agent image with (the
	// image cache's pods, in the operator namespace; inference pods without a weights cache, in
	// their own namespace, where a Secret of that name must exist for it to be used).
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// ImageCachePriorityClass is the PriorityClass of the image cache's pods (the chart's
	// prewarm-image-cache: below every workload, never preempting one).
	ImageCachePriorityClass string `json:"imageCachePriorityClass,omitempty"`
	// ClientQPS and ClientBurst pace the controller's requests to the API server
	// ([DefaultClientQPS], [DefaultClientBurst]):
	// a cache costs about two writes per target node (its request, its label), so a fleet of
	// 5,000 nodes takes some 25 s per cache at the default. API Priority and Fairness still
	// shares the server with everything else.
	ClientQPS   float32 `json:"clientQPS,omitempty"`
	ClientBurst int     `json:"clientBurst,omitempty"`
	// ConcurrentReconciles is how many objects of one kind are reconciled at once
	// ([DefaultConcurrentReconciles]): a small
	// cache does not wait behind a large one. The nodes' labels and NodeCache requests of every
	// cache go through one writer each, 32 writes in flight.
	ConcurrentReconciles int `json:"concurrentReconciles,omitempty"`
	// CapacityShortfall is what becomes of a parent none of whose target nodes may hold its
	// model, as their agents report their disks and its namespace's quota allows: Warn (the
	// default) reports it (CapacityAvailable, WithinBudget) and deploys, the pods reading the
	// model from the source; Refuse reports it and deploys nothing until a node has room.
	CapacityShortfall string `json:"capacityShortfall,omitempty"`
	// PrefetchSizeLimit bounds the memory-backed volume a parent with prefetchEnabled copies its
	// model into when the model's size is not known as its pods are made (no weights cache, or
	// one that has not reported the size yet): the volume's sizeLimit is this, or the worker's
	// memory limit when that is lower ([DefaultPrefetchSizeLimit]). A
	// model the controller knows sizes its volume itself. The copy counts against the node's
	// memory; a larger model fails the pods' prefetch init container, naming this setting.
	PrefetchSizeLimit *resource.Quantity `json:"prefetchSizeLimit,omitempty"`
}

// PrefetchSizeLimitBytes is the prefetch size limit in bytes.
func (c Controller) PrefetchSizeLimitBytes() int64 { return bytesOf(c.PrefetchSizeLimit) }

// Values of Controller.CapacityShortfall.
const (
	CapacityShortfallWarn   = "Warn"
	CapacityShortfallRefuse = "Refuse"
)

// Agent tunes the agents. Sizes are Kubernetes quantities (20Gi, 16Mi).
type Agent struct {
	// Reserve is the free space under each cache root that caches never take ([DefaultReserve]).
	Reserve *resource.Quantity `json:"reserve,omitempty"`
	// MaxParallel is how many caches a node downloads at once ([DefaultMaxParallel]).
	MaxParallel int `json:"maxParallel,omitempty"`
	// Concurrency is how many ranged reads one download keeps in flight ([DefaultConcurrency]).
	Concurrency int `json:"concurrency,omitempty"`
	// PartSize is the size of each ranged read ([DefaultPartSize] bytes).
	PartSize *resource.Quantity `json:"partSize,omitempty"`
	// VerifyInterval is how often a Ready cache's content is read back ([DefaultVerifyInterval]).
	VerifyInterval metav1.Duration `json:"verifyInterval,omitempty"`
	// VerifyRate caps the bytes per second re-verification reads ([DefaultVerifyRate]; 0: no
	// cap).
	VerifyRate *resource.Quantity `json:"verifyRate,omitempty"`
	// ProgressInterval is the least time between two NodeCache status writes of an agent that
	// change only the progress of its downloads
	// ([DefaultProgressInterval]); a change of state is written at once.
	// It bounds the API writes of a fleet downloading at once: nodes / progressInterval.
	ProgressInterval metav1.Duration `json:"progressInterval,omitempty"`
	// StatusInterval is the least time between two NodeCache status writes of an agent
	// ([DefaultStatusInterval]): a
	// change of state waits at most this long.
	StatusInterval metav1.Duration `json:"statusInterval,omitempty"`
	// LeaseDuration is how long an agent counts as alive after it last renewed its Lease
	// ([DefaultLeaseDuration]);
	// it renews it every third of that. A node whose agent's Lease has expired counts no cache
	// Ready and loses the caches' ready labels until the agent renews it. The Lease is the
	// agents' only periodic write: NodeCache status is written on a change only.
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	// RecheckInterval is how often a Ready cache is re-checked cheaply: its manifest, and every
	// file there with its size ([DefaultRecheckInterval]).
	RecheckInterval metav1.Duration `json:"recheckInterval,omitempty"`
	// RetryInterval is the first wait before a failed download is tried again
	// ([DefaultRetryInterval]); it doubles
	// up to 5 minutes.
	RetryInterval metav1.Duration `json:"retryInterval,omitempty"`
	// MountWait is how long the node plugin waits for a cache before telling the kubelet to
	// call again ([DefaultMountWait]).
	MountWait metav1.Duration `json:"mountWait,omitempty"`
	// MaxScratchBytes is the most that the copies a node makes for its pods when it cannot hold
	// their cache (NoLocalDisk, InsufficientCapacity, BudgetExceeded) may take together on the
	// kubelet's filesystem, where they are kept ([DefaultMaxScratchBytes]; 0: no copies, such pods wait). Each copy
	// also keeps that filesystem clear of the kubelet's thresholds (Kubelet) and Reserve free, and
	// counts in its namespace's maxBytesPerNode. A pod whose copy does not fit waits, its
	// mount refused with the figures.
	MaxScratchBytes *resource.Quantity `json:"maxScratchBytes,omitempty"`
	// Kubelet is where the nodes' kubelets evict pods and remove images: caches on a disk the
	// kubelet or the container runtime also use, and the copies on the kubelet's filesystem,
	// stay clear of it.
	Kubelet Kubelet `json:"kubelet,omitempty"`
	// MetricsPerCache labels the agents' per-cache metrics by cache UID (false: sums over a
	// node's caches). The metrics port is not authenticated: with it, any pod that can reach
	// an agent learns which caches its node holds.
	MetricsPerCache bool `json:"metricsPerCache,omitempty"`
}

// ReserveBytes is the reserve in bytes.
func (a Agent) ReserveBytes() int64 { return bytesOf(a.Reserve) }

// MaxScratchBytesValue is the bound on a node's copies in bytes.
func (a Agent) MaxScratchBytesValue() int64 { return bytesOf(a.MaxScratchBytes) }

// PartSizeBytes is the part size in bytes.
func (a Agent) PartSizeBytes() int64 { return bytesOf(a.PartSize) }

// VerifyRateBytes is the re-verification rate in bytes per second (0: no cap).
func (a Agent) VerifyRateBytes() int64 { return bytesOf(a.VerifyRate) }

// bytesOf is q in bytes; 0 when it is not set.
func bytesOf(q *resource.Quantity) int64 {
	if q == nil {
		return 0
	}
	return q.Value()
}

// SourceRule lets namespaces name sources that prewarm reads with its own identity: an S3 bucket
// (and key prefix), or an FSx file system (and path).
type SourceRule struct {
	// Namespaces may name the source; "*" is every namespace.
	Namespaces []string `json:"namespaces"`
	// S3 is a bucket (a name, or a pattern with *) and, optionally, a key prefix.
	S3 *S3Rule `json:"s3,omitempty"`
	// FSx is a file system and, optionally, a directory in it.
	FSx *FSxRule `json:"fsx,omitempty"`
}

// S3Rule matches S3 sources.
type S3Rule struct {
	// Bucket is a bucket name, or a pattern in which * matches any run of characters
	// (jumpstart-cache-prod-*).
	Bucket string `json:"bucket"`
	// Prefix, when set, limits the rule to keys under it: models matches models and models/…,
	// never models-v2.
	Prefix string `json:"prefix,omitempty"`
}

// FSxRule matches FSx sources.
type FSxRule struct {
	// FileSystemID is the file system.
	FileSystemID string `json:"fileSystemId"`
	// Path, when set, limits the rule to that directory of the file system and below, relative
	// to the file system's mount. The agents open it, and the models under it, through real
	// directories only: a symbolic link on the way is refused.
	Path string `json:"path,omitempty"`
}

// S3 says how S3 is reached.
type S3 struct {
	// Endpoint is an S3-compatible store's endpoint (empty: AWS S3).
	Endpoint string `json:"endpoint,omitempty"`
	// PathStyle addresses buckets in the path (most S3-compatible stores want it).
	PathStyle bool `json:"pathStyle,omitempty"`
	// CredentialsSecret names a Secret, in a parent's namespace, whose AWS_ACCESS_KEY_ID,
	// AWS_SECRET_ACCESS_KEY and (optional) AWS_SESSION_TOKEN are that namespace's S3
	// credentials: the agents read a source sourceAccess does not allow with them (sealed to
	// each node), and the init container of a cold pod reads with them.
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
	// Budget caps what each node asks of S3; throttling (503 SlowDown) pauses its reads.
	Budget Budget `json:"budget,omitempty"`
}

// HuggingFace says how the Hugging Face Hub is reached.
type HuggingFace struct {
	// Endpoint is a Hub mirror (empty: https://huggingface.co).
	Endpoint string `json:"endpoint,omitempty"`
	// Budget caps what each node asks of the Hub; its rate limit (429) pauses its reads.
	Budget Budget `json:"budget,omitempty"`
}

// FSxMount is one FSx for Lustre file system and its mount point on the nodes.
type FSxMount struct {
	// FileSystemID is the file system, as in fsxStorage.fileSystemId (fs-0123456789abcdef0).
	FileSystemID string `json:"fileSystemId"`
	// MountPath is where the file system is mounted on every node that may read it.
	MountPath string `json:"mountPath"`
}
