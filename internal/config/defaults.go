package config

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/version"
	"github.com/prewarm/prewarm/pkg/engine"
)

// The defaults of the configuration's fields: what a file that leaves a field out gets, what
// the flags that override a field print in their help, and what docs/operations.md's tables
// state (test/docs holds the tables to them). Sizes are Kubernetes quantities.

// DefaultOperatorNamespace is operatorNamespace's default (the chart sets the release's).
const DefaultOperatorNamespace = inferencev1.DefaultOperatorNamespace

// DefaultCacheRoot is the node directory caches are kept under unless the admin says otherwise:
// the local NVMe of SageMaker HyperPod and AWS deep learning AMIs, and weightsCache.hostPath's
// default.
const DefaultCacheRoot = "/opt/dlami/nvme"

// Default watermarks of a cache root, in percent of its filesystem's capacity.
const (
	DefaultHighWatermarkPercent = 90
	DefaultLowWatermarkPercent  = 80
)

// DefaultExtendedResourceTolerations is placement.extendedResourceTolerations' default.
const DefaultExtendedResourceTolerations = ExtendedResourceTolerationsAuto

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

// DefaultCachesPerNode is a namespace's share of a node's cache slots when its quota sets none:
// at least four namespaces' full shares fit on any node, so that one namespace's caches never
// take every slot.
const DefaultCachesPerNode = 64

// DefaultImageCachesPerNamespace is ImageCaches.MaxPerNamespace unless the configuration says
// otherwise.
const DefaultImageCachesPerNamespace = 8

// Defaults of the controller's settings (Controller).
const (
	DefaultGateTimeout          = 30 * time.Minute
	DefaultDeletionTimeout      = 10 * time.Minute
	DefaultRetention            = 24 * time.Hour
	DefaultClientQPS            = 200
	DefaultClientBurst          = 400
	DefaultConcurrentReconciles = 4
	DefaultCapacityShortfall    = CapacityShortfallWarn
	// DefaultPrefetchSizeLimit holds a model of some 30 billion 16-bit parameters.
	DefaultPrefetchSizeLimit = "64Gi"
)

// DefaultAgentImage is the agent's image unless the configuration names another: the one this
// release publishes.
const DefaultAgentImage = version.Registry + "/agent:" + version.Tag

// DefaultImageCachePriorityClass is the image cache pods' PriorityClass unless the configuration
// names another (the chart and config/ install it).
const DefaultImageCachePriorityClass = "prewarm-image-cache"

// Defaults of the agents' settings (Agent). Concurrency and PartSize are the engine's measured
// defaults.
const (
	DefaultReserve          = "2Gi"
	DefaultMaxParallel      = 2
	DefaultConcurrency      = engine.DefaultConcurrency
	DefaultPartSize         = engine.DefaultPartSize
	DefaultVerifyInterval   = 24 * time.Hour
	DefaultVerifyRate       = "200Mi"
	DefaultProgressInterval = 10 * time.Second
	DefaultStatusInterval   = 2 * time.Second
	DefaultLeaseDuration    = 3 * time.Minute
	DefaultRecheckInterval  = 5 * time.Minute
	DefaultRetryInterval    = 10 * time.Second
	// DefaultMountWait is below the kubelet's 2 minutes for a mount.
	DefaultMountWait       = 90 * time.Second
	DefaultMaxScratchBytes = "100Gi"
)

// DefaultKubeletMarginPercent is Kubelet.MarginPercent's default.
const DefaultKubeletMarginPercent = 5

// Defaults of the sharing of parts between agents (Peers).
const (
	DefaultPeerPort      = 9444
	DefaultPeerGroupSize = 16
	DefaultMaxPeers      = 4
	DefaultPeerWait      = 30 * time.Second
	DefaultPeerStall     = 3 * time.Second
	DefaultPeerStreams   = 8
	DefaultPeerAudience  = "prewarm-peer"
	DefaultPeerTrust     = TrustSourceDigests
	// DefaultWitnessPort and DefaultWitnessAudience are Peers.Witness's defaults.
	DefaultWitnessPort     = 8444
	DefaultWitnessAudience = "prewarm-witness"
)

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
		o.OperatorNamespace = DefaultOperatorNamespace
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
		o.Placement.ExtendedResourceTolerations = DefaultExtendedResourceTolerations
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
	duration(&c.GateTimeout, DefaultGateTimeout)
	duration(&c.DeletionTimeout, DefaultDeletionTimeout)
	duration(&c.Retention, DefaultRetention)
	text(&c.AgentImage, DefaultAgentImage)
	text(&c.ImageCachePriorityClass, DefaultImageCachePriorityClass)
	if c.ClientQPS == 0 {
		c.ClientQPS = DefaultClientQPS
	}
	number(&c.ClientBurst, DefaultClientBurst)
	number(&c.ConcurrentReconciles, DefaultConcurrentReconciles)
	number(&o.ImageCaches.MaxPerNamespace, DefaultImageCachesPerNamespace)
	text(&c.CapacityShortfall, DefaultCapacityShortfall)
	quantity(&c.PrefetchSizeLimit, DefaultPrefetchSizeLimit)
	quantity(&a.Reserve, DefaultReserve)
	number(&a.MaxParallel, DefaultMaxParallel)
	number(&a.Concurrency, DefaultConcurrency)
	if a.PartSize == nil {
		a.PartSize = resource.NewQuantity(DefaultPartSize, resource.BinarySI)
	}
	duration(&a.VerifyInterval, DefaultVerifyInterval)
	duration(&a.ProgressInterval, DefaultProgressInterval)
	duration(&a.StatusInterval, DefaultStatusInterval)
	duration(&a.LeaseDuration, DefaultLeaseDuration)
	duration(&a.RecheckInterval, DefaultRecheckInterval)
	duration(&a.RetryInterval, DefaultRetryInterval)
	duration(&a.MountWait, DefaultMountWait)
	quantity(&a.VerifyRate, DefaultVerifyRate)
	quantity(&a.MaxScratchBytes, DefaultMaxScratchBytes)
	a.Kubelet.defaults()
	o.Peers.defaults()
}

func (p *Peers) defaults() {
	for _, n := range []struct {
		v *int
		d int
	}{{&p.Port, DefaultPeerPort}, {&p.GroupSize, DefaultPeerGroupSize}, {&p.MaxPeers, DefaultMaxPeers}, {&p.Streams, DefaultPeerStreams}} {
		if *n.v == 0 {
			*n.v = n.d
		}
	}
	for _, d := range []struct {
		v *metav1.Duration
		d time.Duration
	}{{&p.Wait, DefaultPeerWait}, {&p.Stall, DefaultPeerStall}} {
		if d.v.Duration == 0 {
			d.v.Duration = d.d
		}
	}
	if p.Audience == "" {
		p.Audience = DefaultPeerAudience
	}
	if p.Trust == "" {
		p.Trust = DefaultPeerTrust
	}
	if p.Witness.Port == 0 {
		p.Witness.Port = DefaultWitnessPort
	}
	if p.Witness.Audience == "" {
		p.Witness.Audience = DefaultWitnessAudience
	}
}

func (k *Kubelet) defaults() {
	if k.MarginPercent == nil {
		m := int32(DefaultKubeletMarginPercent)
		k.MarginPercent = &m
	}
}
