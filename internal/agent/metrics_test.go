package agent

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
)

// By default the agent's metrics are sums over its node's caches and name none of them (the
// port is not authenticated); agent.metricsPerCache labels them by cache UID.
func TestMetricsNameCachesOnlyWhenAsked(t *testing.T) {
	st := prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{
		{UID: "uid-a", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: 100, DiskBytes: 4096}},
		{UID: "uid-b", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: 20, DiskBytes: 4096}},
		{UID: "uid-c", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, BytesDone: 5, BytesPerSecond: 7, DiskBytes: 8192}},
	}}
	for _, tc := range []struct {
		perCache bool
		want     string
	}{
		{false, `
prewarm_agent_cache_bytes 125
prewarm_agent_cache_disk_bytes 16384
prewarm_agent_cache_state{state="Downloading"} 1
prewarm_agent_cache_state{state="Ready"} 2
prewarm_agent_download_bytes_per_second 7
`},
		{true, `
prewarm_agent_cache_bytes{cache="uid-a"} 100
prewarm_agent_cache_bytes{cache="uid-b"} 20
prewarm_agent_cache_bytes{cache="uid-c"} 5
prewarm_agent_cache_disk_bytes{cache="uid-a"} 4096
prewarm_agent_cache_disk_bytes{cache="uid-b"} 4096
prewarm_agent_cache_disk_bytes{cache="uid-c"} 8192
prewarm_agent_cache_state{cache="uid-a",state="Ready"} 1
prewarm_agent_cache_state{cache="uid-b",state="Ready"} 1
prewarm_agent_cache_state{cache="uid-c",state="Downloading"} 1
prewarm_agent_download_bytes_per_second{cache="uid-a"} 0
prewarm_agent_download_bytes_per_second{cache="uid-b"} 0
prewarm_agent_download_bytes_per_second{cache="uid-c"} 7
`},
	} {
		reg := prometheus.NewPedanticRegistry()
		m := newMetrics(reg, tc.perCache)
		m.observe(st)
		m.observe(st) // a second report replaces the first, it does not add to it
		got := gather(t, reg, "prewarm_agent_cache_bytes", "prewarm_agent_cache_disk_bytes", "prewarm_agent_cache_state", "prewarm_agent_download_bytes_per_second")
		if got != strings.TrimSpace(tc.want) {
			t.Errorf("perCache=%v:\n%s\nwant\n%s", tc.perCache, got, strings.TrimSpace(tc.want))
		}
	}
}

// gather renders the named metrics of reg as "series value" lines, sorted as Gather sorts them.
func gather(t *testing.T, reg *prometheus.Registry, names ...string) string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, f := range families {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+f.GetName()+" ") {
			continue
		}
		for _, mt := range f.GetMetric() {
			var labels []string
			for _, l := range mt.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			series := f.GetName()
			if len(labels) > 0 {
				series += "{" + strings.Join(labels, ",") + "}"
			}
			lines = append(lines, series+" "+strconv.FormatFloat(mt.GetGauge().GetValue(), 'f', -1, 64))
		}
	}
	return strings.Join(lines, "\n")
}

// A node's origin budgets are exposed by source type: a source with a budget has its refusals
// and its waits counted, a source without one has neither series.
func TestOriginBudgetMetrics(t *testing.T) {
	o := &Options{}
	o.Config.S3.Budget = config.Budget{MaxConcurrency: 4}
	budgets := newBudgets(o)
	reg := prometheus.NewRegistry()
	registerBudgets(reg, budgets)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got = append(got, fmt.Sprintf("%s %s{%s} %g", f.GetType(), f.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue()))
		}
	}
	want := []string{
		"COUNTER prewarm_agent_origin_budget_wait_seconds_total{source=s3} 0",
		"COUNTER prewarm_agent_origin_throttled_total{source=s3} 0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("the budgets' series:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if budgets[inferencev1.ModelSourceHuggingFace] != nil {
		t.Error("the Hub has a budget the configuration did not give it")
	}
}
