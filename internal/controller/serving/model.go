package serving

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
)

// model is what prewarm needs of a parent to cache and serve it: an InferenceEndpointConfig's
// fields, or a JumpStartModel's once resolved through the catalog.
type model struct {
	owner       client.Object
	kind        string
	source      inferencev1.ModelSourceConfig
	weights     *inferencev1.WeightsCacheConfig
	imageCache  bool
	placement   inferencev1.Placement
	preferred   []corev1.PreferredSchedulingTerm
	replicas    int32
	worker      inferencev1.Worker
	unsupported []string
}

func fromEndpoint(iec *inferencev1.InferenceEndpointConfig) *model {
	s := &iec.Spec
	m := &model{
		owner:     iec,
		kind:      "InferenceEndpointConfig",
		source:    s.ModelSourceConfig,
		placement: placement.FromParent(s.InstanceType, s.InstanceTypes, s.NodeAffinity, s.Tolerations),
		replicas:  ptr.Deref(s.Replicas, 1),
		worker:    s.Worker,
	}
	if s.NodeAffinity != nil {
		m.preferred = s.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	}
	if s.ModelCacheConfig != nil && s.ModelCacheConfig.WeightsCache != nil && s.ModelCacheConfig.WeightsCache.Enabled {
		w := *s.ModelCacheConfig.WeightsCache
		if w.HostPath == "" {
			w.HostPath = inferencev1.DefaultWeightsCacheHostPath
		}
		m.weights = &w
	}
	if s.ModelCacheConfig != nil && s.ModelCacheConfig.ImageCache != nil {
		m.imageCache = s.ModelCacheConfig.ImageCache.Enabled
	}
	for name, set := range map[string]bool{
		"tlsConfig": s.TLSConfig != nil, "autoScalingSpec": s.AutoScalingSpec != nil, "metrics": s.Metrics != nil,
		"loadBalancer": s.LoadBalancer != nil, "intelligentRoutingSpec": s.IntelligentRoutingSpec != nil,
		"kvCacheSpec": s.KVCacheSpec != nil, "endpointName": s.EndpointName != "", "tags": len(s.Tags) > 0,
		"modelSourceConfig.prefetchEnabled": s.ModelSourceConfig.PrefetchEnabled != nil,
	} {
		if set {
			m.unsupported = append(m.unsupported, name)
		}
	}
	slices.Sort(m.unsupported)
	return m
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

// sortedJoin joins names for a message.
func sortedJoin(names []string) string { return strings.Join(names, ", ") }
