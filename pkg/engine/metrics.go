package engine

import (
	"errors"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	bytes        prometheus.Counter
	retries      prometheus.Counter
	peerBytes    prometheus.Counter
	peerFailures prometheus.Counter
	peerWait     prometheus.Counter
	directBytes  prometheus.Counter
	// partWait and partStall are observed once per part, by where it came from (peer, source).
	partWait  *prometheus.HistogramVec
	partStall *prometheus.HistogramVec
}

// partBuckets are the part waits' and stalls' histogram buckets, in seconds: fine below the
// peers' stall (3 s by default), with 5 s (the fan-out goal's bound) one of them.
var partBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120}

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
		partWait: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prewarm_engine_part_wait_seconds",
			Help:    "Per part, from a worker asking for it (of a peer, or of the source) to its first byte, by where it came from (peer, source); retries and other peers asked count in.",
			Buckets: partBuckets,
		}, []string{"from"})),
		partStall: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prewarm_engine_part_stall_seconds",
			Help:    "Per part, the longest time it went without a byte arriving, from a worker asking for it until its last byte, by where it came from (peer, source).",
			Buckets: partBuckets,
		}, []string{"from"})),
	}
}

// partClock times one part's arrival: when it was asked for, its first byte, and the longest
// time between bytes (the wait for the first counts). It spans every try of the part.
type partClock struct {
	asked, first, last time.Time
	longest            time.Duration
	now                func() time.Time
}

func newPartClock() *partClock {
	now := time.Now()
	return &partClock{asked: now, last: now, now: time.Now}
}

// moved records that bytes arrived.
func (c *partClock) moved() {
	now := c.now()
	if c.first.IsZero() {
		c.first = now
	}
	c.longest = max(c.longest, now.Sub(c.last))
	c.last = now
}

// observe records the part, which came from from (peer or source), once it has all arrived.
func (c *partClock) observe(m *metrics, from string) {
	if c.first.IsZero() { // no byte came (an empty part): its wait ends now
		c.moved()
	}
	m.partWait.WithLabelValues(from).Observe(c.first.Sub(c.asked).Seconds())
	m.partStall.WithLabelValues(from).Observe(c.longest.Seconds())
}

// reader is r, telling c of every read that brings bytes (nil c: r itself).
func (c *partClock) reader(r io.Reader) io.Reader {
	if c == nil {
		return r
	}
	return &clockedReader{r: r, c: c}
}

type clockedReader struct {
	r io.Reader
	c *partClock
}

func (cr *clockedReader) Read(b []byte) (int, error) {
	n, err := cr.r.Read(b)
	if n > 0 {
		cr.c.moved()
	}
	return n, err
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err) // a different metric under the engine's name: a programming error
	}
	return c
}
