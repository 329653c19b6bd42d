package engine

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A part's clock counts the wait for its first byte and, after it, the longest gap between
// bytes; a wait longer than every gap is the part's longest time without progress.
func TestPartClockTimesTheFirstByteAndTheLongestGap(t *testing.T) {
	for _, tc := range []struct {
		name              string
		gaps              []time.Duration // before each read that brings bytes; the first is the wait
		wantWait, wantMax time.Duration
	}{
		{"steady", []time.Duration{100 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond}, 100 * time.Millisecond, 100 * time.Millisecond},
		{"stalled midway", []time.Duration{20 * time.Millisecond, 4 * time.Second, 10 * time.Millisecond}, 20 * time.Millisecond, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			c := &partClock{asked: now, last: now, now: func() time.Time { return now }}
			var data []byte
			for range tc.gaps {
				data = append(data, 'x')
			}
			r := c.reader(&oneByteAt{r: bytes.NewReader(data), before: func(k int) { now = now.Add(tc.gaps[k]) }})
			if _, err := io.ReadAll(r); err != nil {
				t.Fatal(err)
			}
			m := newMetrics(nil)
			c.observe(m, "peer")
			if got := sumOf(t, m.partWait); got != tc.wantWait.Seconds() {
				t.Errorf("wait %.3f s; want %.3f s", got, tc.wantWait.Seconds())
			}
			if got := sumOf(t, m.partStall); got != tc.wantMax.Seconds() {
				t.Errorf("longest without a byte %.3f s; want %.3f s", got, tc.wantMax.Seconds())
			}
		})
	}
}

// oneByteAt reads one byte at a time, calling before(k) ahead of the k-th.
type oneByteAt struct {
	r      io.Reader
	k      int
	before func(k int)
}

func (o *oneByteAt) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, err := o.r.Read(b[:1])
	if n > 0 {
		o.before(o.k)
		o.k++
	}
	return n, err
}

func sumOf(t *testing.T, h *prometheus.HistogramVec) float64 {
	t.Helper()
	var m dto.Metric
	if err := h.WithLabelValues("peer").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleSum()
}
