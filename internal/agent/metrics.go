package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine"
)

// metrics are the agent's Prometheus metrics (besides the engine's
// prewarm_engine_downloaded_bytes_total and prewarm_engine_part_retries_total).
type metrics struct {
	// perCache labels the per-cache gauges by cache UID; without it they are sums over the
	// node's caches (the metrics port is not authenticated: any pod that reaches it would learn
	// which caches the node holds).
	perCache bool
	state    *prometheus.GaugeVec
	rate     *prometheus.GaugeVec
	done     *prometheus.GaugeVec
	failures *prometheus.CounterVec
	disk     *prometheus.GaugeVec
	free     *prometheus.GaugeVec
	capacity *prometheus.GaugeVec
	used     *prometheus.GaugeVec
	cached   *prometheus.GaugeVec
	// verified counts bytes read back to re-verify caches; damaged counts files found damaged.
	verified prometheus.Counter
	damaged  prometheus.Counter
	repaired prometheus.Counter
	// evictions counts caches evicted, by why.
	evictions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, perCache bool) *metrics {
	var cache []string
	if perCache {
		cache = []string{"cache"}
	}
	m := &metrics{
		perCache: perCache,
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_cache_state", Help: "Caches of this node in a state (per cache with agent.metricsPerCache: 1 for its state).",
		}, append(cache, "state")),
		rate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_download_bytes_per_second", Help: "Current download rate of this node's caches (of one with agent.metricsPerCache).",
		}, cache),
		done: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_cache_bytes", Help: "Bytes of caches this node holds, downloaded or verified (of one with agent.metricsPerCache).",
		}, cache),
		disk: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_cache_disk_bytes", Help: "Bytes this node's caches take on disk, measured: copies, partial downloads, copies set aside (of one with agent.metricsPerCache).",
		}, cache),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prewarm_agent_download_failures_total", Help: "Downloads that failed, by reason.",
		}, []string{"reason"}),
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_root_free_bytes", Help: "Bytes caches may still take under an allowed root without evicting: free after the reserve, up to the high watermark.",
		}, []string{"root"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_root_capacity_bytes", Help: "Size of the filesystem under an allowed root.",
		}, []string{"root"}),
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_root_used_bytes", Help: "Bytes in use on the filesystem under an allowed root, by anyone.",
		}, []string{"root"}),
		cached: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_root_cached_bytes", Help: "Bytes prewarm's files take under an allowed root, measured.",
		}, []string{"root"}),
		verified: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_agent_verified_bytes_total", Help: "Bytes of ready caches read back and checked against their checksums.",
		}),
		damaged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_agent_damaged_files_total", Help: "Files of ready caches found missing, resized or not matching their checksums.",
		}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_agent_repaired_files_total", Help: "Damaged files fetched again and put back in place.",
		}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prewarm_agent_evictions_total", Help: "Caches evicted from this node, by reason: MakeRoom (for a download), HighWatermark (the disk was above it).",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.state, m.rate, m.done, m.disk, m.failures, m.free, m.capacity, m.used, m.cached, m.verified, m.damaged, m.repaired, m.evictions)
	}
	return m
}

// registerBudgets exposes the node's origin budgets: how often each origin refused the node
// (429, 503) and how long its reads waited for the budget, by source type.
func registerBudgets(reg prometheus.Registerer, budgets map[inferencev1.ModelSourceType]*engine.Budget) {
	if reg == nil {
		return
	}
	for t, b := range budgets {
		labels := prometheus.Labels{"source": string(t)}
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "prewarm_agent_origin_throttled_total", ConstLabels: labels,
				Help: "Reads of a source with a budget (config.s3.budget, config.huggingFace.budget) that the origin refused with 429 or 503; each pauses the node's reads of it.",
			}, func() float64 { return float64(b.Throttled()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "prewarm_agent_origin_budget_wait_seconds_total", ConstLabels: labels,
				Help: "Seconds the node's reads of a source waited for its budget (a slot, the end of a pause, bytes of the rate cap), summed over readers.",
			}, func() float64 { return b.Waited().Seconds() }),
		)
	}
}

// observe records a status the agent is about to write.
func (m *metrics) observe(st prewarmv1alpha1.NodeCacheStatus) {
	m.state.Reset()
	m.rate.Reset()
	m.done.Reset()
	m.disk.Reset()
	for _, c := range st.Caches {
		var cache []string
		if m.perCache {
			cache = []string{c.UID}
		}
		m.state.WithLabelValues(append(cache, string(c.State))...).Add(1)
		m.rate.WithLabelValues(cache...).Add(float64(c.BytesPerSecond))
		m.done.WithLabelValues(cache...).Add(float64(c.BytesDone))
		m.disk.WithLabelValues(cache...).Add(float64(c.DiskBytes))
	}
	for _, r := range st.Roots {
		m.free.WithLabelValues(r.Path).Set(float64(r.FreeBytes))
		m.capacity.WithLabelValues(r.Path).Set(float64(r.CapacityBytes))
		m.used.WithLabelValues(r.Path).Set(float64(r.UsedBytes))
		m.cached.WithLabelValues(r.Path).Set(float64(r.CachedBytes))
	}
}
