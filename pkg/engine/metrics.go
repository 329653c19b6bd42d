package engine

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	bytes   prometheus.Counter
	retries prometheus.Counter
}

// newMetrics registers the engine's metrics with reg, or keeps them unregistered when reg is
// nil (they still count, for nobody).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_downloaded_bytes_total", Help: "Bytes read from model sources.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_part_retries_total", Help: "Ranged reads tried again after a transient failure.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.bytes, m.retries)
	}
	return m
}
