package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// applyAPIPriority creates the agents' FlowSchema and PriorityLevelConfiguration as the chart
// does with apiPriority.enabled (config/agent/flowcontrol.yaml, which the chart's tests hold
// equal to it).
func (f *fleet) applyAPIPriority() error {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "agent", "flowcontrol.yaml"))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return err
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := f.c.Create(f.ctx, u); err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// probe is another client of the API server, as a cluster has many: a service account of its
// own (in workload-low, where service accounts go) that reads and writes one ConfigMap every
// probeEvery, and records how long each request takes.
type probe struct {
	c         client.Client
	mu        sync.Mutex
	latencies []time.Duration
	failed    int
}

const probeEvery = 100 * time.Millisecond

func (f *fleet) startProbe(ctx context.Context) (*probe, error) {
	cfg, err := f.asServiceAccount(f.cluster.Config, "other-workload")
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: f.c.Scheme()})
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{}
	cm.Namespace, cm.Name = inferencev1.DefaultOperatorNamespace, "bench-probe"
	if err := f.c.Create(ctx, cm); err != nil {
		return nil, err
	}
	p := &probe{c: c}
	go func() {
		t := time.NewTicker(probeEvery)
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			got := &corev1.ConfigMap{}
			start := time.Now()
			err := c.Get(ctx, client.ObjectKeyFromObject(cm), got)
			p.record(time.Since(start), err)
			if err != nil {
				continue
			}
			got.Data = map[string]string{"n": fmt.Sprint(n)}
			start = time.Now()
			err = c.Update(ctx, got)
			p.record(time.Since(start), err)
		}
	}()
	return p, nil
}

func (p *probe) record(d time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.failed++
		return
	}
	p.latencies = append(p.latencies, d)
}

// probeFigures are the other client's requests over a span.
type probeFigures struct {
	requests, failed int
	p50, p99, max    time.Duration
}

// mark is where a span starts; since returns the figures from mark on.
func (p *probe) mark() (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.latencies), p.failed
}

func (p *probe) since(n, failed int) probeFigures {
	p.mu.Lock()
	d := slices.Clone(p.latencies[n:])
	out := probeFigures{requests: len(d), failed: p.failed - failed}
	p.mu.Unlock()
	if len(d) == 0 {
		return out
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	out.p50, out.p99, out.max = at(0.5), at(0.99), d[len(d)-1]
	return out
}

const (
	apfBeginMarker = "<!-- bench-scale-apf:begin (make bench-apf writes this section) -->"
	apfEndMarker   = "<!-- bench-scale-apf:end -->"
)

// apfMarkdown is the section of --api-priority both: each fleet without and with the agents'
// own priority level, and what another client of the API server saw meanwhile.
func (r report) apfMarkdown() string {
	var b strings.Builder
	r.header(&b, apfBeginMarker, "Scale: the agents' own API priority level, against another client", "bench-apf", "--steady 0s --api-priority both")
	b.WriteString("\nThe same fleet and caches as the scale section, twice on a fresh cluster each: without the chart's FlowSchema " +
		"(the agents' requests in `workload-low` with every service account) and with it (`apiPriority.enabled`, the agents in `prewarm-agents`). " +
		"Another client, a service account of its own, reads and writes one ConfigMap every 100 ms throughout the rollout: its latency is what a " +
		"cluster's other workloads see. Waits in queue are API Priority and Fairness's own (`apiserver_flowcontrol_request_wait_duration_seconds`).\n\n")
	b.WriteString("| nodes | caches | agents' level | kwok: schedulable | converged | converged ÷ schedulable | other client p50 | p99 | max | failed | agents' mean wait in queue | workload-low mean wait in queue | rejected |\n")
	b.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.fleets {
		level := "workload-low"
		if f.apiPriority {
			level = "prewarm-agents"
		}
		for _, c := range f.runs {
			rejected := 0.0
			for _, v := range c.waits.rejected {
				rejected += v
			}
			agents := "–"
			if q, ok := c.waits.queued["prewarm-agents"]; ok {
				agents = ms(q.mean())
			}
			fmt.Fprintf(&b, "| %d | %d | %s | %.1f s | %.1f s | %.2f× | %s | %s | %s | %d | %s | %s | %.0f |\n", f.nodes, c.caches, level,
				f.schedulable.Seconds(), c.converge.Seconds(), c.converge.Seconds()/f.schedulable.Seconds(),
				ms(c.probe.p50), ms(c.probe.p99), ms(c.probe.max), c.probe.failed, agents, ms(c.waits.queued["workload-low"].mean()), rejected)
		}
	}
	fmt.Fprintf(&b, "\n%s\n", apfEndMarker)
	return b.String()
}
