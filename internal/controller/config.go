// Package controller holds what prewarm's reconcilers share: the operator's configuration and
// the keys of the objects they write.
package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// Config is the cluster admin's configuration of prewarm.
type Config struct {
	// AllowedRoots are the node directories weights caches may be kept under.
	AllowedRoots []string
	// GateTimeout is the longest a Deployment waits for its weights cache to settle.
	GateTimeout time.Duration
	// AgentImage is the image of the agent, used as the inference pods' init container.
	AgentImage string
	// S3Endpoint and S3PathStyle reach an S3-compatible store instead of AWS S3.
	S3Endpoint  string
	S3PathStyle bool
	// S3CredentialsSecret names a Secret, in each parent's namespace, whose AWS_ACCESS_KEY_ID,
	// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN keys the init container uses (optional).
	S3CredentialsSecret string
	// HFEndpoint is a Hugging Face Hub mirror.
	HFEndpoint string
	// FSxRoot is where FSx for Lustre file systems are mounted on the nodes.
	FSxRoot string
	// OperatorNamespace is where shared objects live.
	OperatorNamespace string
	// Retention is how long a node that a cache's placement still selects, but whose scheduling
	// state keeps its pods off (cordoned, tainted, unreachable), keeps its copy of the cache.
	Retention time.Duration
}

// Defaults fills the zero fields of c.
func (c *Config) Defaults() {
	if len(c.AllowedRoots) == 0 {
		c.AllowedRoots = []string{inferencev1.DefaultWeightsCacheHostPath}
	}
	if c.GateTimeout <= 0 {
		c.GateTimeout = 30 * time.Minute
	}
	if c.AgentImage == "" {
		c.AgentImage = "ghcr.io/prewarm/agent:latest"
	}
	if c.FSxRoot == "" {
		c.FSxRoot = "/fsx"
	}
	if c.OperatorNamespace == "" {
		c.OperatorNamespace = inferencev1.DefaultOperatorNamespace
	}
	if c.Retention <= 0 {
		c.Retention = 24 * time.Hour
	}
}

// Validate checks what the admin set.
func (c *Config) Validate() error {
	for _, r := range append(slices.Clone(c.AllowedRoots), c.FSxRoot) {
		if !filepath.IsAbs(r) || filepath.Clean(r) != r || r == "/" {
			return fmt.Errorf("root %q: want a clean absolute path other than /", r)
		}
	}
	return nil
}

// HostPathAllowed says whether hostPath is one of the allowed roots, and if not, why.
func (c *Config) HostPathAllowed(hostPath string) (bool, string) {
	if slices.Contains(c.AllowedRoots, filepath.Clean(hostPath)) && filepath.Clean(hostPath) == hostPath {
		return true, ""
	}
	return false, fmt.Sprintf("hostPath %s is not an allowed cache root; the cluster admin allows %s",
		hostPath, strings.Join(c.AllowedRoots, ", "))
}

// SourceURI returns the address of a model source as the engine names it, and its region.
func (c *Config) SourceURI(s inferencev1.ModelSourceConfig) (uri, region string, err error) {
	loc := strings.Trim(s.ModelLocation, "/")
	switch s.ModelSourceType {
	case inferencev1.ModelSourceS3:
		if s.S3Storage == nil {
			return "", "", fmt.Errorf("modelSourceType s3 needs s3Storage")
		}
		return "s3://" + s.S3Storage.BucketName + "/" + loc, s.S3Storage.Region, nil
	case inferencev1.ModelSourceHuggingFace:
		if s.HuggingFaceModel == nil {
			return "", "", fmt.Errorf("modelSourceType huggingface needs huggingFaceModel")
		}
		uri := "hf://" + s.HuggingFaceModel.ModelID
		if s.HuggingFaceModel.CommitSHA != "" {
			uri += "@" + s.HuggingFaceModel.CommitSHA
		}
		return uri, "", nil
	case inferencev1.ModelSourceFSx:
		return filepath.Join(c.FSxRoot, loc), "", nil
	}
	return "", "", fmt.Errorf("modelSourceType %s cannot be cached on node-local disk", s.ModelSourceType)
}

// Labels and annotations prewarm sets on the objects it writes.
const (
	// ParentUIDLabel, on a ModelDataCacheConfig, is the UID of the parent it serves.
	ParentUIDLabel = "prewarm.io/parent-uid"
	// CacheKeyLabel, on a ModelDataCacheConfig, identifies its content (source, location,
	// hostPath): a parent whose key changes gets a new cache.
	CacheKeyLabel = "prewarm.io/cache-key"
	// EndpointLabel, on inference pods, is the UID of their parent; the Deployment selects on it.
	EndpointLabel = "prewarm.io/endpoint-uid"
	// WeightsCacheAnnotation, on the inference pod template, names the ModelDataCacheConfig the
	// pods read from.
	WeightsCacheAnnotation = "prewarm.io/weights-cache"
	// TemplateHashAnnotation, on a Deployment, is the hash of the pod template prewarm wrote.
	TemplateHashAnnotation = "prewarm.io/template-hash"
	// ManagedByLabel marks objects prewarm created.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedBy is ManagedByLabel's value.
	ManagedBy = "prewarm"
	// ImageCacheLabel, on an image cache's DaemonSet and pods, is the InferenceImageCache's name.
	ImageCacheLabel = "prewarm.io/image-cache"
	// ImageCachePriorityClass is the low, non-preempting priority of image cache pods.
	ImageCachePriorityClass = "prewarm-image-cache"
	// FieldManager is the controller's server-side apply field manager.
	FieldManager = "prewarm-controller"
)

// The controller's own needs beyond its reconcilers: leader election and events.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// SetNodeLabel puts (value "true") or removes a cache-ready label on a node, when it differs.
func SetNodeLabel(ctx context.Context, c client.Client, n *corev1.Node, key string, want bool) error {
	_, has := n.Labels[key]
	if has == want {
		return nil
	}
	value := "null"
	if want {
		value = fmt.Sprintf("%q", inferencev1.LabelTrue)
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%s}}}`, key, value)
	return client.IgnoreNotFound(c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)))
}
