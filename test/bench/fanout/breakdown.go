package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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
