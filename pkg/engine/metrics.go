package engine

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	bytes        prometheus.Counter
	retries      prometheus.Counter
	peerBytes    prometheus.Counter
	peerFailures prometheus.Counter
	peerWait     prometheus.Counter
	directBytes  prometheus.Counter
}

// newMetrics registers the engine's metrics with reg, or keeps them unregistered when reg is
// nil (they still count, for nobody). Engines sharing a registry share the counters.
func newMetrics(reg prometheus.Registerer) *metrics {
	return &metrics{
		bytes: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_downloaded_bytes_total", Help: "Bytes read from model sources.",
		})),
		retries: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_part_retries_total", Help: "Ranged reads tried again after a transient failure.",
		})),
		peerBytes: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_peer_bytes_total", Help: "Bytes taken from peers instead of model sources, checked.",
		})),
		peerFailures: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_peer_failures_total", Help: "Parts from peers that did not arrive whole or did not match their checksum.",
		})),
		peerWait: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_peer_wait_seconds_total", Help: "Seconds workers waited for a peer to hold and start sending a part (summed over workers; a worker with no part a peer holds waits here too).",
		})),
		directBytes: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prewarm_engine_direct_written_bytes_total", Help: "Bytes written with direct I/O (O_DIRECT), past the page cache.",
		})),
	}
}

func register(reg prometheus.Registerer, c prometheus.Counter) prometheus.Counter {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(prometheus.Counter); ok {
				return existing
			}
		}
		panic(err) // a different metric under the engine's name: a programming error
	}
	return c
}
