package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// metrics are the agent's Prometheus metrics (besides the engine's
// prewarm_engine_downloaded_bytes_total and prewarm_engine_part_retries_total).
type metrics struct {
	state    *prometheus.GaugeVec
	rate     *prometheus.GaugeVec
	done     *prometheus.GaugeVec
	failures *prometheus.CounterVec
	free     *prometheus.GaugeVec
	capacity *prometheus.GaugeVec
	// verified counts bytes read back to re-verify caches; damaged counts files found damaged.
	verified prometheus.Counter
	damaged  prometheus.Counter
	repaired prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_cache_state", Help: "1 for the state this node's copy of a cache is in.",
		}, []string{"cache", "state"}),
		rate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_download_bytes_per_second", Help: "Current download rate of a cache.",
		}, []string{"cache"}),
		done: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_cache_bytes", Help: "Bytes of a cache this node holds, downloaded or verified.",
		}, []string{"cache"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prewarm_agent_download_failures_total", Help: "Downloads that failed, by reason.",
		}, []string{"reason"}),
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_root_free_bytes", Help: "Free bytes under an allowed root, after the reserve.",
		}, []string{"root"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prewarm_agent_root_capacity_bytes", Help: "Size of the filesystem under an allowed root.",
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
	}
	if reg != nil {
		reg.MustRegister(m.state, m.rate, m.done, m.failures, m.free, m.capacity, m.verified, m.damaged, m.repaired)
	}
	return m
}

// observe records a status the agent is about to write.
func (m *metrics) observe(st prewarmv1alpha1.NodeCacheStatus) {
	m.state.Reset()
	m.rate.Reset()
	m.done.Reset()
	for _, c := range st.Caches {
		m.state.WithLabelValues(c.UID, string(c.State)).Set(1)
		m.rate.WithLabelValues(c.UID).Set(float64(c.BytesPerSecond))
		m.done.WithLabelValues(c.UID).Set(float64(c.BytesDone))
	}
	for _, r := range st.Roots {
		m.free.WithLabelValues(r.Path).Set(float64(r.FreeBytes))
		m.capacity.WithLabelValues(r.Path).Set(float64(r.CapacityBytes))
	}
}
