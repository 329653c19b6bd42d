package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Two nodes' histograms, sampled before and after a run, give the run's quantiles to a bucket.
func TestHistogramQuantilesOverARun(t *testing.T) {
	sample := func(values ...float64) hist {
		reg := prometheus.NewRegistry()
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "w", Buckets: []float64{0.5, 1, 5}}, []string{"from"})
		reg.MustRegister(h)
		for k, v := range values {
			h.WithLabelValues([]string{"peer", "source"}[k%2]).Observe(v)
		}
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out hist
		for _, f := range fams {
			out.add(f)
		}
		return out
	}
	before := sample(0.1, 7)                  // before the run: left out
	after := sample(0.1, 7, 0.2, 0.3, 0.4, 2) // the run added 0.2, 0.3, 0.4 and 2
	run := after.minus(before).plus(sample(0.45))
	if got := run.total(); got != 5 {
		t.Fatalf("%v observations; want 5", got)
	}
	for _, tc := range []struct {
		q    float64
		want string
	}{{0.5, "≤ 0.5 s"}, {0.8, "≤ 0.5 s"}, {0.99, "≤ 5 s"}, {1, "≤ 5 s"}} {
		if got := run.quantile(tc.q); got != tc.want {
			t.Errorf("quantile %v: %s; want %s", tc.q, got, tc.want)
		}
	}
	if got := after.quantile(1); got != "> 5 s" {
		t.Errorf("with 7 s observed, the maximum is %s; want > 5 s", got)
	}
	if got := (hist{}).quantile(0.5); got != "–" {
		t.Errorf("no observations: %s", got)
	}
}
