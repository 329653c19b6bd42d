package serving

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
)

// model is what prewarm needs of a parent to cache and serve it: an InferenceEndpointConfig's
// fields, or a JumpStartModel's once resolved through the catalog.
type model struct {
	owner      client.Object
	kind       string
	source     inferencev1.ModelSourceConfig
	weights    *inferencev1.WeightsCacheConfig
	imageCache bool
	placement  inferencev1.Placement
	preferred  []corev1.PreferredSchedulingTerm
	replicas   int32
	worker     inferencev1.Worker
	// kubernetes is what the pods take from spec.kubernetes (init containers, volumes, service
	// account, scheduler); empty for a JumpStartModel.
	kubernetes inferencev1.KubernetesSpec
	// maxDeployTime is how long a rollout may take before the parent reports it failed.
	maxDeployTime time.Duration
	unsupported   []string
	// restricted is true when the parent's namespace enforces the restricted Pod Security level.
	restricted bool
	// prefetch is HyperPod's prefetchEnabled: the worker reads the model from memory.
	prefetch bool
	// autoscaling is HyperPod's autoScalingSpec (nil: none), which KEDA scales by.
	autoscaling *inferencev1.AutoScalingSpec
}

func fromEndpoint(iec *inferencev1.InferenceEndpointConfig) *model {
	s := &iec.Spec
	m := &model{
		owner:         iec,
		kind:          "InferenceEndpointConfig",
		source:        s.ModelSourceConfig,
		placement:     placement.FromParent(s.InstanceType, s.InstanceTypes, s.NodeAffinity, s.Tolerations),
		replicas:      ptr.Deref(s.Replicas, 1),
		worker:        s.Worker,
		maxDeployTime: deployTime(s.MaxDeployTimeInSeconds),
		prefetch:      ptr.Deref(s.ModelSourceConfig.PrefetchEnabled, false),
		autoscaling:   s.AutoScalingSpec,
	}
	if s.Kubernetes != nil {
		m.kubernetes = *s.Kubernetes
	}
	if s.NodeAffinity != nil {
		m.preferred = s.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	}
	// A volume source is mounted as it is: a weights cache asked for it is not made (and is
	// named as unsupported below).
	volume := s.ModelSourceConfig.ModelSourceType == inferencev1.ModelSourceKubernetesVolume
	m.weights, m.imageCache = caches(s.ModelCacheConfig)
	cacheAsked := m.weights != nil
	if volume {
		m.weights = nil
	}
	m.unsupported = unsupportedFields(map[string]bool{
		"endpointName": s.EndpointName != "",
		"tags":         len(s.Tags) > 0,
		// Deprecated by HyperPod: spec.replicas is the first count, autoScalingSpec the range.
		"InitialReplicaCount":  s.InitialReplicaCount != nil,
		"worker.requestLimits": s.Worker.RequestLimits != nil,
		"pdSpec":               s.PDSpec != nil,
		"modelCacheConfig.weightsCache (modelSourceType kubernetesVolume is mounted as it is)": cacheAsked && volume,
	}, &s.HyperPodFeatures)
	return m
}

// caches is the weights cache a parent asks for (nil: none; its hostPath defaulted), and whether
// it asks for an image cache.
func caches(c *inferencev1.ModelCacheConfig) (*inferencev1.WeightsCacheConfig, bool) {
	if c == nil {
		return nil, false
	}
	var weights *inferencev1.WeightsCacheConfig
	if c.WeightsCache != nil && c.WeightsCache.Enabled {
		w := *c.WeightsCache
		if w.HostPath == "" {
			w.HostPath = inferencev1.DefaultWeightsCacheHostPath
		}
		weights = &w
	}
	return weights, c.ImageCache != nil && c.ImageCache.Enabled
}

// unsupportedFields names, sorted, the fields set that prewarm cannot honour: those in own, and
// the shared blocks that ask for something (a block that only turns its feature off does not).
func unsupportedFields(own map[string]bool, b *inferencev1.HyperPodFeatures) []string {
	shared := map[string]bool{
		"tlsConfig":              b.TLSConfig != nil,
		"metrics":                b.Metrics != nil && ptr.Deref(b.Metrics.Enabled, true),
		"loadBalancer":           b.LoadBalancer != nil,
		"intelligentRoutingSpec": b.IntelligentRoutingSpec != nil && ptr.Deref(b.IntelligentRoutingSpec.Enabled, false),
		"kvCacheSpec":            b.KVCacheSpec != nil,
		"dataCapture":            b.DataCapture != nil,
		"dnsConfig":              b.DNSConfig != nil,
	}
	var out []string
	for _, set := range []map[string]bool{own, shared} {
		for name, on := range set {
			if on {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// scalingAsked reports whether an autoScalingSpec asks for autoscaling: a trigger that names what
// to scale on (a CloudWatch metric, a Prometheus query), of the list when it has any, else the
// single trigger (planScaling's rule). HyperPod's CLI and SDK write a cloudWatchTrigger without
// a metricName into every endpoint they make, and a block with no trigger gives KEDA nothing to
// scale on: neither asks for anything.
func scalingAsked(s *inferencev1.AutoScalingSpec) bool {
	if s == nil {
		return false
	}
	cloudWatch, _ := triggerList(s.CloudWatchTriggerList, s.CloudWatchTrigger, nil, "", "")
	prometheus, _ := triggerList(s.PrometheusTriggerList, s.PrometheusTrigger, nil, "", "")
	return slices.ContainsFunc(cloudWatch, func(t inferencev1.CloudWatchTrigger) bool { return ptr.Deref(t.MetricName, "") != "" }) ||
		slices.ContainsFunc(prometheus, func(t inferencev1.PrometheusTrigger) bool { return ptr.Deref(t.Query, "") != "" })
}

// deployTime is maxDeployTimeInSeconds as a duration; unset (an object stored before the field
// had its default) is HyperPod's default, an hour.
func deployTime(seconds *int32) time.Duration {
	if seconds == nil || *seconds <= 0 {
		return time.Hour
	}
	return time.Duration(*seconds) * time.Second
}

func (m *model) mountPath() string {
	if p := m.worker.ModelVolumeMount.MountPath; p != "" {
		return p
	}
	return inferencev1.DefaultModelMountPath
}

func (m *model) portName() string {
	if n := m.worker.ModelInvocationPort.Name; n != "" {
		return n
	}
	return "http"
}

func (m *model) uid() string { return string(m.owner.GetUID()) }

// withSource is a copy of m that reads src. A phase that settles the source (a JumpStart model's
// entry, a pinned commit) gives the state this copy: no phase writes the model it was given.
func (m *model) withSource(src inferencev1.ModelSourceConfig) *model {
	c := *m
	c.source = src
	return &c
}

// joinNames joins names for a message, in their order.
func joinNames(names []string) string { return strings.Join(names, ", ") }
