// Package config is the operator configuration that prewarm's controller and agents share: the
// node directories caches may be kept under, how S3 and the Hugging Face Hub are reached, and
// where each FSx for Lustre file system is mounted on the nodes. Both binaries read the same
// file (the prewarm-config ConfigMap); a binary's flags of the same names override some of its
// values for that binary alone (docs/operations.md lists which).
package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/version"
	"github.com/prewarm/prewarm/pkg/engine"
)

// File is where the binaries read the configuration in their pods.
const File = "/etc/prewarm/config.yaml"

// Kind and APIVersion identify the file's format.
const (
	Kind       = "OperatorConfiguration"
	APIVersion = "prewarm.io/v1alpha1"
)

// DefaultCacheRoot is the node directory caches are kept under unless the admin says otherwise:
// the local NVMe of SageMaker HyperPod and AWS deep learning AMIs, and weightsCache.hostPath's
// default.
const DefaultCacheRoot = "/opt/dlami/nvme"

// CacheRoot is one node directory weights caches may be kept under.
type CacheRoot struct {
	// Path is the root as parents name it (weightsCache.hostPath; HyperPod's default is
	// /opt/dlami/nvme).
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
	// that may be used once a cache is written (90): a download that would go past it first
	// evicts caches no pod uses, by policy, and a disk found above it (other files grew) has
	// caches evicted until it is at LowWatermarkPercent. On a filesystem the kubelet or the
	// container runtime also use, the agent lowers both below the kubelet's thresholds
	// (Agent.Kubelet) when they are not already.
	HighWatermarkPercent int32 `json:"highWatermarkPercent,omitempty"`
	// LowWatermarkPercent is where eviction stops (80): a download that must evict frees
	// enough that, with it written, the disk is at most this full, so that the next one does
	// not evict again at once.
	LowWatermarkPercent int32 `json:"lowWatermarkPercent,omitempty"`
}

// Default watermarks of a cache root, in percent of its filesystem's capacity.
const (
	DefaultHighWatermarkPercent = 90
	DefaultLowWatermarkPercent  = 80
)

// OnNode is where the root is on the nodes.
func (r CacheRoot) OnNode() string {
	if r.NodePath != "" {
		return r.NodePath
	}
	return r.Path
}

// UnmarshalJSON takes a root as an object, or as a path alone.
func (r *CacheRoot) UnmarshalJSON(b []byte) error {
	var p string
	if err := json.Unmarshal(b, &p); err == nil {
		*r = CacheRoot{Path: p}
		return nil
	}
	type plain CacheRoot
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var v plain
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("a cache root is a path, or {path, nodePath, allowRootFilesystem, highWatermarkPercent, lowWatermarkPercent}: %w", err)
	}
	*r = CacheRoot(v)
	return nil
}

// Roots returns the cache roots' paths, as parents name them.
func (o OperatorConfiguration) Roots() []string {
	out := make([]string, len(o.CacheRoots))
	for i, r := range o.CacheRoots {
		out[i] = r.Path
	}
	return out
}

// Root returns the cache root parents name path.
func (o OperatorConfiguration) Root(path string) (CacheRoot, bool) {
	for _, r := range o.CacheRoots {
		if r.Path == path {
			return r, true
		}
	}
	return CacheRoot{}, false
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
	// the JumpStart catalog, the agents (hyperpod-inference-system; the chart sets the release's).
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

// DefaultStandaloneCacheNodes is standaloneCacheNodes unless the configuration says otherwise:
// every namespace's standalone caches may be kept on every node but the control plane's, with
// the tolerations every standalone cache may use (placement.tolerations, and those of the
// extended resources' taints).
func DefaultStandaloneCacheNodes() []NodeGrant {
	return []NodeGrant{{
		Namespaces:       []string{"*"},
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: ControlPlaneLabel, Operator: corev1.NodeSelectorOpDoesNotExist}},
	}}
}

// StandaloneNodes returns namespace ns's grant of nodes for its standalone caches (the first
// entry of standaloneCacheNodes naming it, or "*") and the field that holds it; ok is false
// when no entry names it.
func (o OperatorConfiguration) StandaloneNodes(ns string) (g NodeGrant, at string, ok bool) {
	for i, g := range o.StandaloneCacheNodes {
		if slices.Contains(g.Namespaces, ns) || slices.Contains(g.Namespaces, "*") {
			return g, fmt.Sprintf("standaloneCacheNodes[%d]", i), true
		}
	}
	return NodeGrant{}, "standaloneCacheNodes", false
}

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

// DefaultCachesPerNode is a namespace's share of a node's cache slots when its quota sets none:
// at least four namespaces' full shares fit on any node, so that one namespace's caches never
// take every slot.
const DefaultCachesPerNode = 64

// CacheSlots is how many caches of namespace ns one node may be asked for, and the setting that
// says so.
func (o OperatorConfiguration) CacheSlots(ns string) (int, string) {
	if n := o.QuotaFor(ns).MaxCachesPerNode; n != nil {
		return int(*n), o.quotaPath(ns) + ".maxCachesPerNode"
	}
	return DefaultCachesPerNode, o.quotaPath(ns) + ".maxCachesPerNode, unset: " + strconv.Itoa(DefaultCachesPerNode)
}

// QuotaFor returns the quota of namespace ns: the first that names it (or "*"), else the zero
// quota (no byte limits, priority at most 0, no pins).
func (o OperatorConfiguration) QuotaFor(ns string) NamespaceQuota {
	for _, q := range o.NamespaceQuotas {
		if slices.Contains(q.Namespaces, ns) || slices.Contains(q.Namespaces, "*") {
			return q
		}
	}
	return NamespaceQuota{}
}

// quotaPath names the quota of namespace ns in messages.
func (o OperatorConfiguration) quotaPath(ns string) string {
	for i, q := range o.NamespaceQuotas {
		if slices.Contains(q.Namespaces, ns) || slices.Contains(q.Namespaces, "*") {
			return fmt.Sprintf("namespaceQuotas[%d]", i)
		}
	}
	return "namespaceQuotas"
}

// Limit is one of a quota's byte limits, for messages: the value and the field that sets it.
type Limit struct {
	Bytes int64
	Field string
}

// PerNodeLimit is namespace ns's per-node byte limit (ok false: none).
func (o OperatorConfiguration) PerNodeLimit(ns string) (Limit, bool) {
	q := o.QuotaFor(ns).MaxBytesPerNode
	if q == nil {
		return Limit{}, false
	}
	return Limit{Bytes: q.Value(), Field: o.quotaPath(ns) + ".maxBytesPerNode"}, true
}

// ClusterLimit is namespace ns's cluster-wide byte limit (ok false: none).
func (o OperatorConfiguration) ClusterLimit(ns string) (Limit, bool) {
	q := o.QuotaFor(ns).MaxBytes
	if q == nil {
		return Limit{}, false
	}
	return Limit{Bytes: q.Value(), Field: o.quotaPath(ns) + ".maxBytes"}, true
}

// CachePolicy is the priority and pin of a cache of namespace ns whose object carries
// annotations, within ns's quota, and what of the annotations the quota did not allow (or that
// does not parse), for people ("": nothing).
func (o OperatorConfiguration) CachePolicy(ns string, annotations map[string]string) (priority int32, pinned bool, problem string) {
	g := o.QuotaFor(ns)
	priority, pinned = g.DefaultPriority, g.DefaultPinned && g.AllowPin
	var problems []string
	if v, ok := annotations[PriorityAnnotation]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s=%q is not a whole number; priority %d is used", PriorityAnnotation, v, priority))
		case int32(n) > g.MaxPriority:
			priority = g.MaxPriority
			problems = append(problems, fmt.Sprintf("%s=%d is above the %d the operator configuration grants namespace %s (%s.maxPriority); %d is used", PriorityAnnotation, n, g.MaxPriority, ns, o.quotaPath(ns), priority))
		default:
			priority = int32(n)
		}
	}
	if v, ok := annotations[PinnedAnnotation]; ok {
		want, err := strconv.ParseBool(strings.TrimSpace(v))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s=%q is not true or false; the cache is %s", PinnedAnnotation, v, map[bool]string{true: "pinned", false: "not pinned"}[pinned]))
		case want && !g.AllowPin:
			problems = append(problems, fmt.Sprintf("%s=true, but the operator configuration does not let namespace %s pin caches (%s.allowPin); the cache is not pinned", PinnedAnnotation, ns, o.quotaPath(ns)))
		default:
			pinned = want
		}
	}
	return priority, pinned, strings.Join(problems, "; ")
}

// Peers configure the sharing of parts between agents (docs/peers.md).
type Peers struct {
	// Disabled turns sharing off: every node reads the whole model from its source.
	Disabled bool `json:"disabled,omitempty"`
	// Port is where each agent serves its parts, on the node's network (9444).
	Port int `json:"port,omitempty"`
	// GroupSize is how many nodes share one reading of the source (16, 2 to 32); a group
	// takes its parts from one group before it, so the source is read about once in all.
	GroupSize int `json:"groupSize,omitempty"`
	// MaxPeers is how many peers one agent sends parts to at once (4).
	MaxPeers int `json:"maxPeers,omitempty"`
	// UploadRate caps the bytes per second one agent sends to its peers (0: no cap).
	UploadRate *resource.Quantity `json:"uploadRate,omitempty"`
	// Wait is how long a part waits for a peer to hold it before the agent reads it from the
	// source (30s); it waits on while the part's owner gained a part within the last Wait (or,
	// while it reads from the source, within 2 minutes or Wait, whichever is longer).
	Wait metav1.Duration `json:"wait,omitempty"`
	// Audience is the audience of the service account tokens agents present to each other
	// (prewarm-peer).
	Audience string `json:"audience,omitempty"`
	// Trust says which files a node takes from its peers. SourceDigests (the default): only
	// files the source vouches for with a cryptographic digest (a Hugging Face SHA-256 or git
	// blob id, an S3 SHA-256 or SHA-1 checksum, a single-part MD5 ETag), each verified by that
	// digest before it is served; every node reads the other files from the source. AllNodes:
	// every file, trusting every node not to lie about those with only a CRC or a size
	// (docs/security.md).
	Trust string `json:"trust,omitempty"`
}

// Peer trust levels (Peers.Trust).
const (
	TrustSourceDigests = "SourceDigests"
	TrustAllNodes      = "AllNodes"
)

// TrustsAllNodes says whether parts without a source digest may come from peers.
func (p Peers) TrustsAllNodes() bool { return p.Trust == TrustAllNodes }

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
	// GateTimeout is the longest a Deployment waits for its weights cache to settle (30m).
	GateTimeout metav1.Duration `json:"gateTimeout,omitempty"`
	// DeletionTimeout is the longest a deleted cache waits for the nodes that report it to say
	// they removed its files (10m); past it the cache goes, with a Warning naming them. An
	// agent removes the files of a cache no request names whether or not the cache still exists,
	// so this bounds only how long deletion is shown.
	DeletionTimeout metav1.Duration `json:"deletionTimeout,omitempty"`
	// Retention is how long a cordoned, tainted or unreachable node that a cache's placement
	// still selects keeps its copy (24h).
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
	// ClientQPS and ClientBurst pace the controller's requests to the API server (200, 400):
	// a cache costs about two writes per target node (its request, its label), so a fleet of
	// 5,000 nodes takes some 25 s per cache at the default. API Priority and Fairness still
	// shares the server with everything else.
	ClientQPS   float32 `json:"clientQPS,omitempty"`
	ClientBurst int     `json:"clientBurst,omitempty"`
	// ConcurrentReconciles is how many objects of one kind are reconciled at once (4): a small
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
	// memory limit when that is lower (64Gi: a model of some 30 billion 16-bit parameters). A
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
	// Reserve is the free space under each cache root that caches never take (2Gi).
	Reserve *resource.Quantity `json:"reserve,omitempty"`
	// MaxParallel is how many caches a node downloads at once (2).
	MaxParallel int `json:"maxParallel,omitempty"`
	// Concurrency is how many ranged reads one download keeps in flight (64).
	Concurrency int `json:"concurrency,omitempty"`
	// PartSize is the size of each ranged read (16Mi).
	PartSize *resource.Quantity `json:"partSize,omitempty"`
	// VerifyInterval is how often a Ready cache's content is read back (24h).
	VerifyInterval metav1.Duration `json:"verifyInterval,omitempty"`
	// VerifyRate caps the bytes per second re-verification reads (200Mi; 0: no cap).
	VerifyRate *resource.Quantity `json:"verifyRate,omitempty"`
	// ProgressInterval is the least time between two NodeCache status writes of an agent that
	// change only the progress of its downloads (10s); a change of state is written at once.
	// It bounds the API writes of a fleet downloading at once: nodes / progressInterval.
	ProgressInterval metav1.Duration `json:"progressInterval,omitempty"`
	// StatusInterval is the least time between two NodeCache status writes of an agent (2s): a
	// change of state waits at most this long.
	StatusInterval metav1.Duration `json:"statusInterval,omitempty"`
	// LeaseDuration is how long an agent counts as alive after it last renewed its Lease (3m);
	// it renews it every third of that. A node whose agent's Lease has expired counts no cache
	// Ready and loses the caches' ready labels until the agent renews it. The Lease is the
	// agents' only periodic write: NodeCache status is written on a change only.
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	// RecheckInterval is how often a Ready cache is re-checked cheaply: its manifest, and every
	// file there with its size (5m).
	RecheckInterval metav1.Duration `json:"recheckInterval,omitempty"`
	// RetryInterval is the first wait before a failed download is tried again (10s); it doubles
	// up to 5 minutes.
	RetryInterval metav1.Duration `json:"retryInterval,omitempty"`
	// MountWait is how long the node plugin waits for a cache before telling the kubelet to
	// call again (1m30s; below the kubelet's 2 minutes).
	MountWait metav1.Duration `json:"mountWait,omitempty"`
	// MaxScratchBytes is the most that the copies a node makes for its pods when it cannot hold
	// their cache (NoLocalDisk, InsufficientCapacity, BudgetExceeded) may take together on the
	// kubelet's filesystem, where they are kept (100Gi; 0: no copies, such pods wait). Each copy
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

// Default is the configuration when no file is given.
func Default() OperatorConfiguration {
	o := OperatorConfiguration{}
	o.defaults()
	return o
}

// SetDefaults fills the fields of o that are not set with their defaults, as a configuration
// file that leaves them out gets them.
func (o *OperatorConfiguration) SetDefaults() { o.defaults() }

func (o *OperatorConfiguration) defaults() {
	o.Kind, o.APIVersion = Kind, APIVersion
	if o.OperatorNamespace == "" {
		o.OperatorNamespace = inferencev1.DefaultOperatorNamespace
	}
	if len(o.CacheRoots) == 0 {
		o.CacheRoots = []CacheRoot{{Path: DefaultCacheRoot}}
	}
	for i := range o.CacheRoots {
		r := &o.CacheRoots[i]
		if r.HighWatermarkPercent == 0 {
			r.HighWatermarkPercent = DefaultHighWatermarkPercent
		}
		if r.LowWatermarkPercent == 0 {
			r.LowWatermarkPercent = min(DefaultLowWatermarkPercent, r.HighWatermarkPercent)
		}
	}
	if o.Placement.ExtendedResourceTolerations == "" {
		o.Placement.ExtendedResourceTolerations = ExtendedResourceTolerationsAuto
	}
	if len(o.StandaloneCacheNodes) == 0 {
		o.StandaloneCacheNodes = DefaultStandaloneCacheNodes()
	}
	c, a := &o.Controller, &o.Agent
	text := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	number := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	duration := func(d *metav1.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	quantity := func(q **resource.Quantity, v string) {
		if *q == nil {
			d := resource.MustParse(v)
			*q = &d
		}
	}
	duration(&c.GateTimeout, 30*time.Minute)
	duration(&c.DeletionTimeout, 10*time.Minute)
	duration(&c.Retention, 24*time.Hour)
	text(&c.AgentImage, DefaultAgentImage)
	text(&c.ImageCachePriorityClass, DefaultImageCachePriorityClass)
	if c.ClientQPS == 0 {
		c.ClientQPS = 200
	}
	number(&c.ClientBurst, 400)
	number(&c.ConcurrentReconciles, 4)
	number(&o.ImageCaches.MaxPerNamespace, DefaultImageCachesPerNamespace)
	text(&c.CapacityShortfall, CapacityShortfallWarn)
	quantity(&c.PrefetchSizeLimit, "64Gi")
	quantity(&a.Reserve, "2Gi")
	number(&a.MaxParallel, 2)
	number(&a.Concurrency, engine.DefaultConcurrency) // the engine's measured defaults
	if a.PartSize == nil {
		a.PartSize = resource.NewQuantity(engine.DefaultPartSize, resource.BinarySI)
	}
	duration(&a.VerifyInterval, 24*time.Hour)
	duration(&a.ProgressInterval, 10*time.Second)
	duration(&a.StatusInterval, 2*time.Second)
	duration(&a.LeaseDuration, 3*time.Minute)
	duration(&a.RecheckInterval, 5*time.Minute)
	duration(&a.RetryInterval, 10*time.Second)
	duration(&a.MountWait, 90*time.Second)
	quantity(&a.VerifyRate, "200Mi")
	quantity(&a.MaxScratchBytes, "100Gi")
	a.Kubelet.defaults()
	p := &o.Peers
	number(&p.Port, 9444)
	number(&p.GroupSize, 16)
	number(&p.MaxPeers, 4)
	duration(&p.Wait, 30*time.Second)
	text(&p.Audience, "prewarm-peer")
	text(&p.Trust, TrustSourceDigests)
}

// DefaultAgentImage is the agent's image unless the configuration names another: the one this
// release publishes.
const DefaultAgentImage = version.Registry + "/agent:" + version.Tag

// DefaultImageCachePriorityClass is the image cache pods' PriorityClass unless the configuration
// names another (the chart and config/ install it).
const DefaultImageCachePriorityClass = "prewarm-image-cache"

// Load reads the configuration at path; an empty path is the default configuration. Unknown
// fields are refused, so a misspelt key is an error and not a silent default.
func Load(path string) (OperatorConfiguration, error) {
	if path == "" {
		return Default(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return OperatorConfiguration{}, fmt.Errorf("reading the operator configuration: %w", err)
	}
	return Parse(b)
}

// Parse reads a configuration file's content: strictly (an unknown field is an error), with the
// defaults filled in, and validated.
func Parse(b []byte) (OperatorConfiguration, error) {
	var o OperatorConfiguration
	if err := yaml.UnmarshalStrict(b, &o); err != nil {
		if fe := badValue(b); fe != nil {
			return OperatorConfiguration{}, fmt.Errorf("operator configuration: %w", fe)
		}
		return OperatorConfiguration{}, fmt.Errorf("operator configuration: %w", err)
	}
	if (o.Kind != "" && o.Kind != Kind) || (o.APIVersion != "" && o.APIVersion != APIVersion) {
		return OperatorConfiguration{}, fmt.Errorf("operator configuration: want kind %s, apiVersion %s; got %s, %s", Kind, APIVersion, o.Kind, o.APIVersion)
	}
	o.defaults()
	if err := o.Validate(); err != nil {
		return OperatorConfiguration{}, fmt.Errorf("operator configuration: %w", err)
	}
	return o, nil
}

var (
	durationType = reflect.TypeFor[metav1.Duration]()
	quantityType = reflect.TypeFor[resource.Quantity]()
)

// badValue finds, in a file that did not decode, a duration or size that does not parse, and
// names its field: the decoder's own error does not say where it is.
func badValue(b []byte) *field.Error {
	var raw map[string]any
	if yaml.Unmarshal(b, &raw) != nil {
		return nil
	}
	return badValueIn(reflect.TypeFor[OperatorConfiguration](), raw, nil)
}

func badValueIn(t reflect.Type, v any, path *field.Path) *field.Error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		if s, ok := v.(string); !ok || !validDuration(s) {
			return field.Invalid(path, v, "want a duration such as 30s, 30m or 24h")
		}
	case t == quantityType:
		if _, err := resource.ParseQuantity(fmt.Sprint(v)); err != nil {
			return field.Invalid(path, v, "want a size such as 16Mi or 20Gi")
		}
	case t.Kind() == reflect.Slice:
		list, _ := v.([]any)
		for i, e := range list {
			if fe := badValueIn(t.Elem(), e, path.Index(i)); fe != nil {
				return fe
			}
		}
	case t.Kind() == reflect.Struct:
		m, _ := v.(map[string]any)
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if e, ok := m[name]; ok && name != "" {
				child := field.NewPath(name)
				if path != nil {
					child = path.Child(name)
				}
				if fe := badValueIn(f.Type, e, child); fe != nil {
					return fe
				}
			}
		}
	}
	return nil
}

func validDuration(s string) bool {
	_, err := time.ParseDuration(s)
	return err == nil
}

// validateSharing checks the peers and the origin budgets.
func (o OperatorConfiguration) validateSharing() field.ErrorList {
	var errs field.ErrorList
	p := o.Peers
	peers := field.NewPath("peers")
	errs = append(errs, positive(peers.Child("wait"), p.Wait)...)
	errs = append(errs, atLeast(peers.Child("uploadRate"), p.UploadRate, 0)...)
	errs = append(errs, atLeast(field.NewPath("s3", "budget", "maxRate"), o.S3.Budget.MaxRate, 0)...)
	errs = append(errs, atLeast(field.NewPath("huggingFace", "budget", "maxRate"), o.HuggingFace.Budget.MaxRate, 0)...)
	errs = append(errs, notNegative(field.NewPath("s3", "budget", "maxConcurrency"), o.S3.Budget.MaxConcurrency)...)
	errs = append(errs, notNegative(field.NewPath("huggingFace", "budget", "maxConcurrency"), o.HuggingFace.Budget.MaxConcurrency)...)
	errs = append(errs, notNegative(peers.Child("maxPeers"), p.MaxPeers)...)
	if p.Port < 1 || p.Port > 65535 {
		errs = append(errs, field.Invalid(peers.Child("port"), p.Port, "want a TCP port"))
	}
	if p.Trust != TrustSourceDigests && p.Trust != TrustAllNodes {
		errs = append(errs, field.NotSupported(peers.Child("trust"), p.Trust, []string{TrustSourceDigests, TrustAllNodes}))
	}
	if g := p.GroupSize; g < 2 || g > 32 {
		errs = append(errs, field.Invalid(peers.Child("groupSize"), g, "want 2 to 32 (a node lists its group and its upstream group, at most 64 peers)"))
	}
	return errs
}

func positive(path *field.Path, d metav1.Duration) field.ErrorList {
	if d.Duration <= 0 {
		return field.ErrorList{field.Invalid(path, d.Duration.String(), "want a positive duration such as 30s, 30m or 24h")}
	}
	return nil
}

func atLeast(path *field.Path, q *resource.Quantity, least int64) field.ErrorList {
	if q != nil && q.Value() < least {
		return field.ErrorList{field.Invalid(path, q.String(), fmt.Sprintf("want a size such as 16Mi or 20Gi, at least %d bytes", least))}
	}
	return nil
}

func notNegative(path *field.Path, n int) field.ErrorList {
	if n < 0 {
		return field.ErrorList{field.Invalid(path, n, "must not be negative")}
	}
	return nil
}

// regionPattern is an AWS region's name.
var regionPattern = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]$`)

// Validate says everything that is wrong with o, each problem with the field it is in.
func (o OperatorConfiguration) Validate() error {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(o.OperatorNamespace) {
		errs = append(errs, field.Invalid(field.NewPath("operatorNamespace"), o.OperatorNamespace, msg))
	}
	errs = append(errs, o.validateRoots()...)
	errs = append(errs, o.Placement.validate()...)
	errs = append(errs, o.validateFSx()...)
	errs = append(errs, o.validateQuotas()...)
	errs = append(errs, o.ImageCaches.validate()...)
	errs = append(errs, o.validateStandaloneNodes()...)
	errs = append(errs, o.Autoscaling.validate()...)
	if js := o.JumpStart; js.Region != "" && !regionPattern.MatchString(js.Region) {
		errs = append(errs, field.Invalid(field.NewPath("jumpStart", "region"), js.Region, "want an AWS region such as us-west-2"))
	}
	if o.JumpStart.Refresh.Duration < 0 {
		errs = append(errs, positive(field.NewPath("jumpStart", "refresh"), o.JumpStart.Refresh)...)
	}
	c, a := o.Controller, o.Agent
	ctl, agent := field.NewPath("controller"), field.NewPath("agent")
	errs = append(errs, positive(ctl.Child("gateTimeout"), c.GateTimeout)...)
	errs = append(errs, positive(ctl.Child("deletionTimeout"), c.DeletionTimeout)...)
	errs = append(errs, positive(ctl.Child("retention"), c.Retention)...)
	errs = append(errs, positive(agent.Child("verifyInterval"), a.VerifyInterval)...)
	errs = append(errs, positive(agent.Child("progressInterval"), a.ProgressInterval)...)
	errs = append(errs, positive(agent.Child("statusInterval"), a.StatusInterval)...)
	if a.LeaseDuration.Duration < 15*time.Second {
		errs = append(errs, field.Invalid(agent.Child("leaseDuration"), a.LeaseDuration.Duration.String(), "must be at least 15s: the agents renew their Lease every third of it"))
	}
	errs = append(errs, positive(agent.Child("recheckInterval"), a.RecheckInterval)...)
	errs = append(errs, positive(agent.Child("retryInterval"), a.RetryInterval)...)
	errs = append(errs, positive(agent.Child("mountWait"), a.MountWait)...)
	errs = append(errs, atLeast(ctl.Child("prefetchSizeLimit"), c.PrefetchSizeLimit, 16<<20)...)
	errs = append(errs, atLeast(agent.Child("reserve"), a.Reserve, 0)...)
	errs = append(errs, atLeast(agent.Child("partSize"), a.PartSize, 1<<20)...)
	errs = append(errs, atLeast(agent.Child("verifyRate"), a.VerifyRate, 0)...)
	errs = append(errs, atLeast(agent.Child("maxScratchBytes"), a.MaxScratchBytes, 0)...)
	errs = append(errs, a.Kubelet.validate(agent.Child("kubelet"))...)
	errs = append(errs, notNegative(ctl.Child("clientBurst"), c.ClientBurst)...)
	errs = append(errs, notNegative(ctl.Child("concurrentReconciles"), c.ConcurrentReconciles)...)
	errs = append(errs, notNegative(agent.Child("maxParallel"), a.MaxParallel)...)
	errs = append(errs, notNegative(agent.Child("concurrency"), a.Concurrency)...)
	errs = append(errs, o.validateSharing()...)
	if c.ClientQPS < 0 {
		errs = append(errs, field.Invalid(ctl.Child("clientQPS"), c.ClientQPS, "must not be negative"))
	}
	if c.CapacityShortfall != "" && c.CapacityShortfall != CapacityShortfallWarn && c.CapacityShortfall != CapacityShortfallRefuse {
		errs = append(errs, field.NotSupported(ctl.Child("capacityShortfall"), c.CapacityShortfall, []string{CapacityShortfallWarn, CapacityShortfallRefuse}))
	}
	errs = append(errs, o.validateSourceAccess()...)
	return errs.ToAggregate()
}

// validateQuotas checks the namespace quotas.
func (o OperatorConfiguration) validateQuotas() field.ErrorList {
	var errs field.ErrorList
	for i, q := range o.NamespaceQuotas {
		at := field.NewPath("namespaceQuotas").Index(i)
		if len(q.Namespaces) == 0 {
			errs = append(errs, field.Required(at.Child("namespaces"), "name the namespaces the quota is for, or \"*\""))
		}
		if q.DefaultPriority > q.MaxPriority {
			errs = append(errs, field.Invalid(at.Child("defaultPriority"), q.DefaultPriority, fmt.Sprintf("above maxPriority (%d)", q.MaxPriority)))
		}
		if q.DefaultPinned && !q.AllowPin {
			errs = append(errs, field.Invalid(at.Child("defaultPinned"), true, "needs allowPin"))
		}
		if q.AllowPin && q.MaxBytesPerNode == nil {
			// A pinned cache is never evicted: without a per-node limit, pins could take every
			// node's disk for good.
			errs = append(errs, field.Required(at.Child("maxBytesPerNode"), "allowPin needs a per-node limit: a pinned cache is never evicted, so maxBytesPerNode bounds what the namespace's pins keep on each node"))
		}
		if n := q.MaxCachesPerNode; n != nil && (*n < 1 || *n > prewarmv1alpha1.MaxCachesPerNode) {
			errs = append(errs, field.Invalid(at.Child("maxCachesPerNode"), *n, fmt.Sprintf("must be 1 to %d, the caches one node is asked for in all", prewarmv1alpha1.MaxCachesPerNode)))
		}
		errs = append(errs, atLeast(at.Child("maxBytesPerNode"), q.MaxBytesPerNode, 0)...)
		errs = append(errs, atLeast(at.Child("maxBytes"), q.MaxBytes, 0)...)
	}
	return errs
}

// validateFSx checks the FSx mounts: file system ids listed once, mount paths clean and apart
// from the cache roots.
func (o OperatorConfiguration) validateFSx() field.ErrorList {
	var errs field.ErrorList
	ids := map[string]bool{}
	for i, m := range o.FSx {
		at := field.NewPath("fsx").Index(i)
		if !strings.HasPrefix(m.FileSystemID, "fs-") || strings.ContainsAny(m.FileSystemID, "/ ") {
			errs = append(errs, field.Invalid(at.Child("fileSystemId"), m.FileSystemID, "want an FSx file system id, fs-…"))
		}
		if ids[m.FileSystemID] {
			errs = append(errs, field.Duplicate(at.Child("fileSystemId"), m.FileSystemID))
		}
		ids[m.FileSystemID] = true
		if err := nodePath(m.MountPath); err != nil {
			errs = append(errs, field.Invalid(at.Child("mountPath"), m.MountPath, err.Error()))
		}
		for _, r := range o.CacheRoots {
			if within(m.MountPath, r.OnNode()) || within(r.OnNode(), m.MountPath) {
				errs = append(errs, field.Invalid(at.Child("mountPath"), m.MountPath, "overlaps the cache root "+r.OnNode()))
			}
		}
	}
	return errs
}

// validateSourceAccess checks the rules of sources prewarm reads with its own identity.
func (o OperatorConfiguration) validateSourceAccess() field.ErrorList {
	var errs field.ErrorList
	for i, r := range o.SourceAccess {
		at := field.NewPath("sourceAccess").Index(i)
		switch {
		case len(r.Namespaces) == 0:
			errs = append(errs, field.Required(at.Child("namespaces"), `list the namespaces ("*" is every namespace)`))
		case (r.S3 == nil) == (r.FSx == nil):
			errs = append(errs, field.Invalid(at, "", "want exactly one of s3 and fsx"))
		case r.S3 != nil && (r.S3.Bucket == "" || strings.Contains(r.S3.Bucket, "/")):
			errs = append(errs, field.Invalid(at.Child("s3", "bucket"), r.S3.Bucket, "want a bucket name or pattern"))
		case r.S3 != nil:
			if _, err := path.Match(r.S3.Bucket, ""); err != nil {
				errs = append(errs, field.Invalid(at.Child("s3", "bucket"), r.S3.Bucket, err.Error()))
			}
		case r.FSx != nil && !slices.ContainsFunc(o.FSx, func(m FSxMount) bool { return m.FileSystemID == r.FSx.FileSystemID }):
			errs = append(errs, field.Invalid(at.Child("fsx", "fileSystemId"), r.FSx.FileSystemID, "not under fsx"))
		case r.FSx != nil && slices.Contains(strings.Split(r.FSx.Path, "/"), ".."):
			errs = append(errs, field.Invalid(at.Child("fsx", "path"), r.FSx.Path,
				`want a directory of the file system, relative to its mount, without ".." segments (team-a/models)`))
		}
	}
	return errs
}

// validateRoots checks the cache roots: clean absolute paths, none named twice, no two on one
// node directory or inside each other.
func (o OperatorConfiguration) validateRoots() field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	for i, r := range o.CacheRoots {
		at := field.NewPath("cacheRoots").Index(i)
		if err := nodePath(r.Path); err != nil {
			errs = append(errs, field.Invalid(at.Child("path"), r.Path, err.Error()))
		}
		if r.NodePath != "" {
			if err := nodePath(r.NodePath); err != nil {
				errs = append(errs, field.Invalid(at.Child("nodePath"), r.NodePath, err.Error()))
			}
		}
		if r.HighWatermarkPercent < 1 || r.HighWatermarkPercent > 100 {
			errs = append(errs, field.Invalid(at.Child("highWatermarkPercent"), r.HighWatermarkPercent, "want a percent of the disk, 1 to 100"))
		}
		if r.LowWatermarkPercent < 1 || r.LowWatermarkPercent > r.HighWatermarkPercent {
			errs = append(errs, field.Invalid(at.Child("lowWatermarkPercent"), r.LowWatermarkPercent,
				fmt.Sprintf("want a percent of the disk from 1 to highWatermarkPercent (%d)", r.HighWatermarkPercent)))
		}
		if names[r.Path] {
			errs = append(errs, field.Duplicate(at.Child("path"), r.Path))
		}
		names[r.Path] = true
		for j, q := range o.CacheRoots[:i] {
			if within(r.OnNode(), q.OnNode()) || within(q.OnNode(), r.OnNode()) {
				errs = append(errs, field.Invalid(at, r.OnNode(), fmt.Sprintf("on the nodes, overlaps cacheRoots[%d] (%s)", j, q.OnNode())))
			}
		}
	}
	return errs
}

// validate checks the placement settings.
func (p Placement) validate() field.ErrorList {
	var errs field.ErrorList
	at := field.NewPath("placement")
	switch p.ExtendedResourceTolerations {
	case "", ExtendedResourceTolerationsAuto, ExtendedResourceTolerationsOn, ExtendedResourceTolerationsOff:
	default:
		errs = append(errs, field.NotSupported(at.Child("extendedResourceTolerations"), p.ExtendedResourceTolerations,
			[]string{ExtendedResourceTolerationsAuto, ExtendedResourceTolerationsOn, ExtendedResourceTolerationsOff}))
	}
	seen := map[string]bool{}
	for i, t := range p.InstanceTypes {
		it := at.Child("instanceTypes").Index(i)
		switch {
		case t.InstanceType == "":
			errs = append(errs, field.Required(it.Child("instanceType"), "the instance type parents name"))
		case seen[t.InstanceType]:
			errs = append(errs, field.Duplicate(it.Child("instanceType"), t.InstanceType))
		case len(t.NodeSelector) == 0 && len(t.MatchExpressions) == 0:
			errs = append(errs, field.Required(it, fmt.Sprintf("%s: want nodeSelector or matchExpressions, the labels its nodes carry", t.InstanceType)))
		}
		seen[t.InstanceType] = true
		errs = append(errs, validateSelection(it, t.NodeSelector, t.MatchExpressions)...)
	}
	errs = append(errs, validateTolerations(at.Child("tolerations"), p.Tolerations)...)
	return errs
}

// validateStandaloneNodes checks the grants of nodes to standalone caches.
func (o OperatorConfiguration) validateStandaloneNodes() field.ErrorList {
	var errs field.ErrorList
	for i, g := range o.StandaloneCacheNodes {
		at := field.NewPath("standaloneCacheNodes").Index(i)
		if len(g.Namespaces) == 0 {
			errs = append(errs, field.Required(at.Child("namespaces"), `list the namespaces the grant is for ("*" is every namespace)`))
		}
		errs = append(errs, validateSelection(at, g.NodeSelector, g.MatchExpressions)...)
		errs = append(errs, validateTolerations(at.Child("tolerations"), g.Tolerations)...)
	}
	return errs
}

// validateSelection checks a nodeSelector and matchExpressions under at.
func validateSelection(at *field.Path, selector map[string]string, exprs []corev1.NodeSelectorRequirement) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(selector)) {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(at.Child("nodeSelector"), k, "key: "+msg))
		}
		for _, msg := range validation.IsValidLabelValue(selector[k]) {
			errs = append(errs, field.Invalid(at.Child("nodeSelector").Key(k), selector[k], msg))
		}
	}
	for j, e := range exprs {
		if _, err := nodeSelectorRequirement(e); err != nil {
			errs = append(errs, field.Invalid(at.Child("matchExpressions").Index(j), e.Key, err.Error()))
		}
	}
	return errs
}

// validateTolerations checks a list of tolerations at path at.
func validateTolerations(at *field.Path, list []corev1.Toleration) field.ErrorList {
	var errs field.ErrorList
	for i, t := range list {
		tl := at.Index(i)
		switch {
		case t.Operator != "" && t.Operator != corev1.TolerationOpExists && t.Operator != corev1.TolerationOpEqual:
			errs = append(errs, field.NotSupported(tl.Child("operator"), t.Operator, []corev1.TolerationOperator{corev1.TolerationOpExists, corev1.TolerationOpEqual}))
		case t.Operator == corev1.TolerationOpExists && t.Value != "":
			errs = append(errs, field.Invalid(tl.Child("value"), t.Value, "operator Exists takes no value"))
		case t.Key == "" && t.Operator != corev1.TolerationOpExists:
			errs = append(errs, field.Invalid(tl.Child("key"), t.Key, "an empty key needs operator Exists"))
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(tl.Child("effect"), t.Effect,
				[]corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}))
		}
	}
	return errs
}

// nodeSelectorRequirement checks one requirement as the scheduler reads it.
func nodeSelectorRequirement(e corev1.NodeSelectorRequirement) (labels.Requirement, error) {
	op := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
		corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
	}[e.Operator]
	if op == "" {
		return labels.Requirement{}, fmt.Errorf("operator %q: want In, NotIn, Exists, DoesNotExist, Gt or Lt", e.Operator)
	}
	r, err := labels.NewRequirement(e.Key, op, e.Values)
	if err != nil {
		return labels.Requirement{}, err
	}
	return *r, nil
}

// SourceAllowed says whether prewarm may read src with its own identity on behalf of namespace
// ns, and if not, why. A Hugging Face source is read with the parent's token or anonymously,
// never with prewarm's identity: it is always allowed.
func (o OperatorConfiguration) SourceAllowed(ns string, src prewarmv1alpha1.CacheSource) (bool, string) {
	if src.Type == inferencev1.ModelSourceHuggingFace {
		return true, ""
	}
	for _, r := range o.SourceAccess {
		if !slices.Contains(r.Namespaces, ns) && !slices.Contains(r.Namespaces, "*") {
			continue
		}
		switch {
		case src.Type == inferencev1.ModelSourceS3 && r.S3 != nil:
			if ok, _ := path.Match(r.S3.Bucket, src.Bucket); ok && under(src.Prefix, r.S3.Prefix) {
				return true, ""
			}
		case src.Type == inferencev1.ModelSourceFSx && r.FSx != nil:
			if r.FSx.FileSystemID == src.FileSystemID && under(src.Path, r.FSx.Path) {
				return true, ""
			}
		}
	}
	return false, fmt.Sprintf("%s is not among the sources prewarm reads with its own identity for namespace %s: the cluster admin allows it with config.sourceAccess in the chart's values (%s)", src, ns, ruleFor(ns, src))
}

// FSxAllowedDir is the directory of FSx source src's file system that the broadest
// sourceAccess rule allowing it for namespace ns opens ("" for the whole file system): the
// agents read src inside it, so that no link under an allowed path leads out of what the
// rule allows (a rule is matched on the path as written). ok is false when no rule allows src.
func (o OperatorConfiguration) FSxAllowedDir(ns string, src prewarmv1alpha1.CacheSource) (dir string, ok bool) {
	for _, r := range o.SourceAccess {
		if r.FSx == nil || r.FSx.FileSystemID != src.FileSystemID || !under(src.Path, r.FSx.Path) ||
			!slices.Contains(r.Namespaces, ns) && !slices.Contains(r.Namespaces, "*") {
			continue
		}
		if d := strings.Trim(r.FSx.Path, "/"); !ok || len(d) < len(dir) {
			dir, ok = d, true
		}
	}
	return dir, ok
}

// ruleFor is the sourceAccess rule that would allow src for namespace ns, as chart values.
func ruleFor(ns string, src prewarmv1alpha1.CacheSource) string {
	switch src.Type {
	case inferencev1.ModelSourceFSx:
		return fmt.Sprintf("- {namespaces: [%s], fsx: {fileSystemId: %s}}", ns, src.FileSystemID)
	default:
		return fmt.Sprintf("- {namespaces: [%s], s3: {bucket: %s}}", ns, src.Bucket)
	}
}

// under reports whether key prefix p lies under rule prefix r, on path boundaries.
func under(p, r string) bool {
	r = strings.Trim(r, "/")
	p = strings.Trim(p, "/")
	return r == "" || p == r || strings.HasPrefix(p, r+"/")
}

// CacheRootAllowed says whether hostPath is one of the cache roots, and if not, why.
func (o OperatorConfiguration) CacheRootAllowed(hostPath string) (bool, string) {
	if _, ok := o.Root(hostPath); ok {
		return true, ""
	}
	return false, fmt.Sprintf("hostPath %s is not an allowed cache root; the cluster admin allows %s (config.cacheRoots in the chart's values)",
		hostPath, strings.Join(o.Roots(), ", "))
}

// FSxMountPath returns where the file system id is mounted on the nodes.
func (o OperatorConfiguration) FSxMountPath(id string) (string, error) {
	for _, m := range o.FSx {
		if m.FileSystemID == id {
			return m.MountPath, nil
		}
	}
	if len(o.FSx) == 0 {
		return "", fmt.Errorf("FSx file system %s is not in prewarm's configuration (none is): the cluster admin lists it, with where it is mounted on the nodes, under fsx in the prewarm-config ConfigMap", id)
	}
	known := make([]string, len(o.FSx))
	for i, m := range o.FSx {
		known[i] = m.FileSystemID
	}
	return "", fmt.Errorf("FSx file system %s is not in prewarm's configuration (it lists %s): the cluster admin adds it, with where it is mounted on the nodes, under fsx in the prewarm-config ConfigMap", id, strings.Join(known, ", "))
}

func nodePath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("%q: want a clean absolute path other than /", p)
	}
	return nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// Write writes o as a configuration file at path.
func (o OperatorConfiguration) Write(path string) error {
	o.defaults()
	b, err := yaml.Marshal(o)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
