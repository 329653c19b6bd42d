package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// Metrics are the controller's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	cacheTarget     *prometheus.GaugeVec
	cacheReady      *prometheus.GaugeVec
	cacheNodeState  *prometheus.GaugeVec
	cacheOrigin     *prometheus.GaugeVec
	cachePeer       *prometheus.GaugeVec
	imageTarget     *prometheus.GaugeVec
	imageCached     *prometheus.GaugeVec
	parentPods      *prometheus.GaugeVec
	gateWait        prometheus.Histogram
	reconcileErrors *prometheus.CounterVec
}

// NewMetrics creates the controller's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		cacheTarget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_weights_cache_target_nodes", Help: "Nodes that should hold a weights cache.",
		}, []string{"namespace", "cache"}),
		cacheReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_weights_cache_ready_nodes", Help: "Nodes that hold a weights cache, verified.",
		}, []string{"namespace", "cache"}),
		cacheOrigin: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_weights_cache_origin_bytes",
			Help: "Bytes the nodes read from a weights cache's source, all together, as their agents report them (since each started).",
		}, []string{"namespace", "cache"}),
		cachePeer: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_weights_cache_peer_bytes",
			Help: "Bytes of a weights cache the nodes took from each other instead of its source.",
		}, []string{"namespace", "cache"}),
		cacheNodeState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_weights_cache_nodes",
			Help: "Target nodes of a weights cache by the state of their copy (Pending, Downloading, Ready, Failed); each node's own state is its agent's prewarm_agent_* metrics.",
		}, []string{"namespace", "cache", "state"}),
		imageTarget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_image_cache_target_nodes", Help: "Nodes that should hold an image.",
		}, []string{"cache"}),
		imageCached: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_image_cache_cached_nodes", Help: "Nodes that hold an image.",
		}, []string{"cache"}),
		parentPods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_parent_pods",
			Help: "A parent's inference pods by where they run: on nodes that hold its weights (and image) (warm), on nodes that do not (cold), on no node yet (unscheduled).",
		}, []string{"namespace", "kind", "name", "node"}),
		gateWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prewarm_gate_wait_seconds",
			Help:    "Time from a weights cache's creation to the gate opening for its Deployment.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 s .. 2.3 h
		}),
		reconcileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prewarm_reconcile_errors_total", Help: "Reconciles that ended in an error, by controller.",
		}, []string{"controller"}),
	}
	reg.MustRegister(m.cacheTarget, m.cacheReady, m.cacheOrigin, m.cachePeer, m.cacheNodeState, m.imageTarget, m.imageCached, m.parentPods, m.gateWait, m.reconcileErrors)
	for _, c := range []string{"endpoint", "jumpstart", "weightscache", "imagecache"} {
		m.reconcileErrors.WithLabelValues(c) // present at 0, so rate() and alerts work from the start
	}
	return m
}

// WeightsCache records a weights cache's counts and per-node states; deleted removes its series.
func (m *Metrics) WeightsCache(c *inferencev1.ModelDataCacheConfig, deleted bool) {
	if m == nil {
		return
	}
	labels := prometheus.Labels{"namespace": c.Namespace, "cache": c.Name}
	m.cacheNodeState.DeletePartialMatch(labels)
	if deleted {
		m.cacheTarget.Delete(labels)
		m.cacheReady.Delete(labels)
		m.cacheOrigin.Delete(labels)
		m.cachePeer.Delete(labels)
		return
	}
	m.cacheTarget.With(labels).Set(float64(c.Status.TargetNodes))
	m.cacheReady.With(labels).Set(float64(c.Status.ReadyNodes))
	m.cacheOrigin.With(labels).Set(float64(c.Status.OriginBytes))
	m.cachePeer.With(labels).Set(float64(c.Status.PeerBytes))
	st := c.Status
	pending := st.TargetNodes - st.ReadyNodes - st.DownloadingNodes - st.FailedNodes
	for state, n := range map[inferencev1.CacheState]int32{
		inferencev1.CacheReady: st.ReadyNodes, inferencev1.CacheDownloading: st.DownloadingNodes,
		inferencev1.CacheFailed: st.FailedNodes, inferencev1.CachePending: max(pending, 0),
	} {
		m.cacheNodeState.WithLabelValues(c.Namespace, c.Name, string(state)).Set(float64(n))
	}
}

// ImageCache records an image cache's counts; deleted removes its series.
func (m *Metrics) ImageCache(c *inferencev1.InferenceImageCache, deleted bool) {
	if m == nil {
		return
	}
	if deleted {
		m.imageTarget.DeleteLabelValues(c.Name)
		m.imageCached.DeleteLabelValues(c.Name)
		return
	}
	m.imageTarget.WithLabelValues(c.Name).Set(float64(c.Status.TargetNodes))
	m.imageCached.WithLabelValues(c.Name).Set(float64(c.Status.CachedNodes))
}

// Values of prewarm_parent_pods' node label.
const (
	PodsWarm        = "warm"
	PodsCold        = "cold"
	PodsUnscheduled = "unscheduled"
)

// ParentPods records a parent's pods by where they run (PodsWarm, PodsCold, PodsUnscheduled);
// nil removes its series (the parent is gone, or no cache makes one node warmer than another).
func (m *Metrics) ParentPods(kind, namespace, name string, pods map[string]int32) {
	if m == nil {
		return
	}
	labels := prometheus.Labels{"namespace": namespace, "kind": kind, "name": name}
	if pods == nil {
		m.parentPods.DeletePartialMatch(labels)
		return
	}
	for node, n := range pods {
		m.parentPods.WithLabelValues(namespace, kind, name, node).Set(float64(n))
	}
}

// GateOpened records how long a Deployment waited for its cache.
func (m *Metrics) GateOpened(seconds float64) {
	if m != nil {
		m.gateWait.Observe(seconds)
	}
}

// ReconcileError counts a reconcile that failed.
func (m *Metrics) ReconcileError(controller string, err error) {
	if m != nil && err != nil {
		m.reconcileErrors.WithLabelValues(controller).Inc()
	}
}
