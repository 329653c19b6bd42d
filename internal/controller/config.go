// Package controller holds what prewarm's reconcilers share: the operator configuration as they
// read it (config.go), the keys of the objects they write, the informer indexes and the fleet's
// reads and label writes (fleet.go), status and finalizer writes (objects.go), watch handlers
// and Events (watch.go), a short-lived reader of users' objects (recent.go) and the controller's
// metrics. The reconcilers are in serving, weightscache and imagecache; what the controller
// checks before they start, in preflight; the namespaces' credentials, in secrets; the Hugging
// Face Hub checks, in hub.
package controller

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/placement"
)

// Config is the cluster admin's configuration of prewarm's controller: the configuration it
// shares with the agents (which holds the controller's own settings too), and where it runs.
type Config struct {
	config.OperatorConfiguration
	// ExtendedResourceTolerations is placement.extendedResourceTolerations resolved: whether the
	// pods prewarm creates tolerate the NoSchedule taints named after the extended resources the
	// inference pods request (auto: whether the API server's admission adds them; see
	// DetectExtendedResourceTolerations).
	ExtendedResourceTolerations bool
}

// Defaults fills the zero fields of c with the operator configuration's defaults.
func (c *Config) Defaults() {
	c.SetDefaults()
	if c.Placement.ExtendedResourceTolerations == config.ExtendedResourceTolerationsOn {
		c.ExtendedResourceTolerations = true
	}
}

// Rules are the placement rules of the configuration: how instance types find nodes, and what
// the pods prewarm creates tolerate.
func (c *Config) Rules() placement.Rules {
	return placement.NewRules(c.Placement, c.ExtendedResourceTolerations)
}

// Grant is what namespace ns's standalone caches (ModelWeightsCacheConfigs and ModelImageCaches
// with no endpoint) may reach: its entry of standaloneCacheNodes.
func (c *Config) Grant(ns string) placement.Grant {
	return placement.GrantFor(c.OperatorConfiguration, ns)
}

// GateTimeout is the longest a Deployment waits for its weights cache to settle.
func (c *Config) GateTimeout() time.Duration { return c.Controller.GateTimeout.Duration }

// DeletionTimeout is the longest a deleted cache waits for its nodes to say they removed it.
func (c *Config) DeletionTimeout() time.Duration { return c.Controller.DeletionTimeout.Duration }

// Retention is how long a node that a cache's placement still selects, but whose scheduling
// state keeps its pods off (cordoned, tainted, unreachable), keeps its copy of the cache.
func (c *Config) Retention() time.Duration { return c.Controller.Retention.Duration }

// AgentImage is the image of the agent, the inference pods' init container.
func (c *Config) AgentImage() string { return c.Controller.AgentImage }

// PullSecrets are the Secrets the pods prewarm creates pull the agent image with.
func (c *Config) PullSecrets() []corev1.LocalObjectReference {
	var out []corev1.LocalObjectReference
	for _, s := range c.Controller.ImagePullSecrets {
		out = append(out, corev1.LocalObjectReference{Name: s})
	}
	return out
}

// CacheSource returns the typed address of a model source, as the agents and the init container
// read it. An FSx source must name a file system the configuration maps to a mount. A value
// longer than a node's request holds is a *SpecError naming the source's field.
func (c *Config) CacheSource(s inferencev1.ModelSourceConfig) (prewarmv1alpha1.CacheSource, error) {
	out, err := c.cacheSource(s)
	if err != nil {
		return out, err
	}
	errs := out.Validate(field.NewPath("source"))
	if len(errs) == 0 {
		return out, nil
	}
	e := errs[0]
	f := sourceFields[strings.TrimPrefix(e.Field, "source.")]
	if f == "" || e.Type != field.ErrorTypeTooLong {
		return out, &SpecError{Field: "modelSourceConfig", Message: "modelSourceConfig: " + e.Error()}
	}
	return out, &SpecError{Field: f, Message: fmt.Sprintf("modelSourceConfig.%s is too long: it %s, the most a node's cache request holds", f, e.Detail)}
}

// sourceFields name, for each field of a node's cache request's source, the model source's field
// it is copied from.
var sourceFields = map[string]string{
	"bucket": "s3Storage.bucketName", "region": "s3Storage.region", "prefix": "modelLocation",
	"repoID": "huggingFaceModel.modelId", "revision": "huggingFaceModel.commitSHA",
	"fileSystemID": "fsxStorage.fileSystemId", "path": "modelLocation",
}

// SpecError says that a value of a user's object cannot be served as written: Message names the
// field, its limit and what to write.
type SpecError struct {
	// Field is the object's field, under its spec.
	Field   string
	Message string
}

func (e *SpecError) Error() string { return e.Message }

func (c *Config) cacheSource(s inferencev1.ModelSourceConfig) (prewarmv1alpha1.CacheSource, error) {
	loc := strings.Trim(s.ModelLocation, "/")
	out := prewarmv1alpha1.CacheSource{Type: s.ModelSourceType}
	switch s.ModelSourceType {
	case inferencev1.ModelSourceS3:
		if s.S3Storage == nil {
			return out, fmt.Errorf("modelSourceType s3 needs s3Storage")
		}
		out.Bucket, out.Prefix, out.Region = s.S3Storage.BucketName, loc, s.S3Storage.Region
		return out, nil
	case inferencev1.ModelSourceHuggingFace:
		if s.HuggingFaceModel == nil {
			return out, fmt.Errorf("modelSourceType huggingface needs huggingFaceModel")
		}
		out.RepoID, out.Revision = s.HuggingFaceModel.ModelID, s.HuggingFaceModel.CommitSHA
		return out, nil
	case inferencev1.ModelSourceFSx:
		if s.FSxStorage == nil || s.FSxStorage.FileSystemID == "" {
			return out, fmt.Errorf("modelSourceType fsx needs fsxStorage.fileSystemId")
		}
		if _, err := c.FSxMountPath(s.FSxStorage.FileSystemID); err != nil {
			return out, err
		}
		out.FileSystemID, out.Path = s.FSxStorage.FileSystemID, loc
		return out, nil
	}
	return out, fmt.Errorf("modelSourceType %s cannot be cached on node-local disk", s.ModelSourceType)
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
	// RolloutStartedAnnotation, on a Deployment prewarm made, is when its current template was
	// set (RFC 3339): the start of the parent's maxDeployTimeInSeconds.
	RolloutStartedAnnotation = "prewarm.io/rollout-started"
	// ManagedByLabel marks objects prewarm created.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedBy is ManagedByLabel's value.
	ManagedBy = "prewarm"
	// ImageCacheLabel, on an image cache's DaemonSet and pods, is the InferenceImageCache's name.
	ImageCacheLabel = "prewarm.io/image-cache"
	// SourceNamespaceLabel, on a pull secret copied for an image cache, is the namespace it
	// was copied from: the copy goes when no parent of that namespace uses the cache. On an
	// image cache, it is the one namespace whose parents it serves and whose pull secrets it
	// pulls with (no label: a cache of an image pulled with no namespace's credentials, which
	// any namespace shares).
	SourceNamespaceLabel = "prewarm.io/source-namespace"
)

// LeaderElectionID names the Lease, in the operator namespace, that the controller's replicas
// elect their leader with.
const LeaderElectionID = "prewarm-controller.prewarm.io"

// The controller's own needs beyond its reconcilers: leader election and events. Leases only in
// the operator namespace (a Role): it creates, reads and renews its leader election Lease and
// no other (the agents' it only watches: Liveness), and cannot read the cluster's node or
// control-plane Leases.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=hyperpod-inference-system,resources=leases,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=hyperpod-inference-system,resources=leases,resourceNames=prewarm-controller.prewarm.io,verbs=get;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
