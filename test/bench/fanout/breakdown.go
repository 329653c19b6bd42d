package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// nodeSample is what one node has used so far: its agent's CPU, the time its download workers
// waited on peers (its metrics), and the bytes through its link (the host end of its veth).
type nodeSample struct {
	cpu, peerWait float64 // seconds
	peerBytes     float64
	claims, busy  float64 // parts claimed from another owner; peers refused with 429
	rx, tx        int64   // bytes the node received and sent
	// wait and stall are the agent's part histograms (prewarm_engine_part_wait_seconds and
	// prewarm_engine_part_stall_seconds), parts from peers and from the source together.
	wait, stall hist
}

// hist is a Prometheus histogram's cumulative bucket counts, by upper bound (+Inf last).
type hist struct {
	bounds []float64
	counts []float64
}

// add adds the histogram family f's series (every label value) to h.
func (h *hist) add(f *dto.MetricFamily) {
	for _, m := range f.GetMetric() {
		for k, bk := range m.GetHistogram().GetBucket() {
			if k == len(h.bounds) {
				h.bounds = append(h.bounds, bk.GetUpperBound())
				h.counts = append(h.counts, 0)
			}
			h.counts[k] += float64(bk.GetCumulativeCount())
		}
		if n := len(m.GetHistogram().GetBucket()); n == len(h.bounds) {
			h.bounds = append(h.bounds, math.Inf(1))
			h.counts = append(h.counts, 0)
		}
		h.counts[len(h.counts)-1] += float64(m.GetHistogram().GetSampleCount())
	}
}

// plus is h with o's counts added (o may be empty).
func (h hist) plus(o hist) hist {
	if len(h.bounds) == 0 {
		return hist{bounds: o.bounds, counts: slices.Clone(o.counts)}
	}
	out := hist{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for k := range o.counts {
		out.counts[k] += o.counts[k]
	}
	return out
}

// minus is h with o's counts taken away (o: a sample from before the run, or empty).
func (h hist) minus(o hist) hist {
	out := hist{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for k := range o.counts {
		out.counts[k] -= o.counts[k]
	}
	return out
}

// total is how many observations h holds.
func (h hist) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile is the upper bound of the bucket holding h's q-quantile ("≤ 0.5 s"), or "–" for an
// empty h; q = 1 is the bound under which every observation fell, the maximum to a bucket.
func (h hist) quantile(q float64) string {
	n := h.total()
	if n == 0 {
		return "–"
	}
	for k, c := range h.counts {
		if c >= q*n {
			if math.IsInf(h.bounds[k], 1) {
				return fmt.Sprintf("> %g s", h.bounds[k-1])
			}
			return fmt.Sprintf("≤ %g s", h.bounds[k])
		}
	}
	return "–"
}

// nodeUse is a node's share of one run: the difference of two samples over the run's time.
type nodeUse struct {
	name         string
	ready        time.Duration
	cpu          float64 // agent CPU seconds
	peerWait     float64 // seconds, summed over the workers
	peerBytes    float64
	claims, busy float64 // parts claimed from another owner; 429s the node's server answered
	rxUse, txUse float64 // the link's use in each direction over T(N), 0 to 1
}

// machineSample is /proc/stat's first line: the machine's CPU time by state, in ticks.
type machineSample struct{ busy, softirq, total float64 }

// machineUse is the machine's CPU over a run: the busy share and the network softirq's share.
type machineUse struct{ busy, softirq float64 }

func sampleMachine() (machineSample, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return machineSample{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return machineSample{}, fmt.Errorf("/proc/stat is empty")
	}
	// cpu user nice system idle iowait irq softirq steal ...
	fields := strings.Fields(sc.Text())
	if len(fields) < 8 || fields[0] != "cpu" {
		return machineSample{}, fmt.Errorf("/proc/stat: unexpected first line %q", sc.Text())
	}
	var s machineSample
	for i, v := range fields[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return machineSample{}, err
		}
		if i >= 8 { // guest time is counted in user already
			break
		}
		s.total += n
		if i != 3 && i != 4 { // idle, iowait
			s.busy += n
		}
		if i == 6 {
			s.softirq += n
		}
	}
	return s, nil
}

func (s machineSample) since(before machineSample) machineUse {
	t := s.total - before.total
	if t <= 0 {
		return machineUse{}
	}
	return machineUse{busy: (s.busy - before.busy) / t, softirq: (s.softirq - before.softirq) / t}
}

// sampleNode reads a node's agent metrics at metricsURL and its link's counters.
func sampleNode(ctx context.Context, metricsURL, hostLink string) (nodeSample, error) {
	var s nodeSample
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, fmt.Errorf("%s: %w", metricsURL, err)
	}
	counter := func(name string) (float64, error) {
		f, ok := fams[name]
		switch {
		case ok && len(f.GetMetric()) > 0:
			return f.GetMetric()[0].GetCounter().GetValue(), nil
		case strings.HasPrefix(name, "prewarm_engine_"), strings.HasPrefix(name, "prewarm_peer_"):
			return 0, nil // registered when the agent's first download starts, or with sharing on
		}
		return 0, fmt.Errorf("%s: no %s", metricsURL, name)
	}
	if s.cpu, err = counter("process_cpu_seconds_total"); err != nil {
		return s, err
	}
	if s.peerWait, err = counter("prewarm_engine_peer_wait_seconds_total"); err != nil {
		return s, err
	}
	if s.peerBytes, err = counter("prewarm_engine_peer_bytes_total"); err != nil {
		return s, err
	}
	if s.claims, err = counter("prewarm_peer_claims_total"); err != nil {
		return s, err
	}
	for _, m := range fams["prewarm_peer_refused_total"].GetMetric() { // absent until a first refusal
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" && l.GetValue() == "busy" {
				s.busy = m.GetCounter().GetValue()
			}
		}
	}
	if f, ok := fams["prewarm_engine_part_wait_seconds"]; ok { // from the first part on
		s.wait.add(f)
	}
	if f, ok := fams["prewarm_engine_part_stall_seconds"]; ok {
		s.stall.add(f)
	}
	// The host end's transmit is what the node receives, and the other way round.
	if s.rx, err = linkCounter(hostLink, "tx_bytes"); err != nil {
		return s, err
	}
	s.tx, err = linkCounter(hostLink, "rx_bytes")
	return s, err
}

func linkCounter(link, name string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/net", link, "statistics", name))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// use is the node's share of a run that took t, from the samples before and after it, on a link
// of rate bytes per second each way.
func (s nodeSample) use(before nodeSample, t time.Duration, rate int64) nodeUse {
	link := float64(rate) * t.Seconds()
	return nodeUse{cpu: s.cpu - before.cpu, peerWait: s.peerWait - before.peerWait, peerBytes: s.peerBytes - before.peerBytes,
		claims: s.claims - before.claims, busy: s.busy - before.busy,
		rxUse: float64(s.rx-before.rx) / link, txUse: float64(s.tx-before.tx) / link}
}
