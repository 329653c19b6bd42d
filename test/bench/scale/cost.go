package main

import (
	"encoding/json"
	"fmt"
	"log"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/scheme"
)

const (
	costBeginMarker = "<!-- bench-scale-writecost:begin (make bench-writecost writes this section) -->"
	costEndMarker   = "<!-- bench-scale-writecost:end -->"
)

// costIdle is how long the API server's background CPU (Lease renewals, kwok) is measured before
// each kind of write; costWorkers, how many writes are in flight while one kind is probed.
const (
	costIdle    = 10 * time.Second
	costWorkers = 8
	// costBusy is the share of the machine's CPUs the API server may use before the probe for
	// a price to be reported.
	costBusy = 0.5
)

// writeCost is what one kind of write costs the API server: the CPU seconds kube-apiserver and
// etcd used while the writes were made, less what they use without them (measured just before),
// over the writes.
type writeCost struct {
	// kind is the verb and resource as the API server counts it ("PATCH nodecaches/status").
	kind, what string
	writes     int
	// cpu is API-server CPU seconds per write; wall, the probe's duration.
	cpu  float64
	wall time.Duration
	// others is the writes of every other kind the API server counted during the probe (the
	// controller's and agents' reactions, Lease renewals).
	others float64
	// idle is the CPUs kube-apiserver and etcd used without the probe's writes (just before).
	idle float64
}

// priced reports whether the price means anything: the server had CPU to spare before the
// probe (a server already busy does the probe's writes instead of other work, not beside it,
// and the difference measures nothing) and the writes cost more than the background.
func (c writeCost) priced() bool {
	return c.cpu > 0 && c.idle < costBusy*float64(runtime.NumCPU())
}

// measureWriteCosts makes n writes of each kind prewarm makes in a rollout, on the converged
// fleet's own objects, with the service account that makes them: an agent's NodeCache status
// patch, a controller's NodeCache patch (an annotation: a request's write re-validates the same
// object; its spec cannot change without agents starting work), a controller's node label patch,
// and an agent's Lease renewal (on Leases of the probe's own).
func (f *fleet) measureWriteCosts(cfg *rest.Config, n int) ([]writeCost, error) {
	agentCfg, err := f.asServiceAccount(cfg, "bench-cost-agent")
	if err != nil {
		return nil, err
	}
	ctrlCfg, err := f.asServiceAccount(cfg, "bench-cost-controller")
	if err != nil {
		return nil, err
	}
	agent, err := client.New(agentCfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	ctrl, err := client.New(ctrlCfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	ns := inferencev1.DefaultOperatorNamespace
	for i := range min(n, f.nodes) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench-cost-" + nodeName(i)}}
		if err := f.c.Create(f.ctx, l); err != nil {
			return nil, err
		}
	}
	stamp := func() string { return fmt.Sprint(time.Now().UnixNano()) } // a label value: no ':'
	kinds := []struct {
		kind, what string
		write      func(i int) error
	}{
		{"PATCH nodecaches/status", "an agent's NodeCache status patch (merge patch of one field)", func(i int) error {
			nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)}}
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{"heartbeatTime": metav1.NewTime(time.Now())}})
			return agent.Status().Patch(f.ctx, nc, client.RawPatch(types.MergePatchType, patch))
		}},
		{"PATCH nodecaches", "the controller's NodeCache patch (an annotation)", func(i int) error {
			nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)}}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{"bench.prewarm.io/probe": stamp()}}})
			return ctrl.Patch(f.ctx, nc, client.RawPatch(types.MergePatchType, patch))
		}},
		{"PATCH nodes", "the controller's node label patch", func(i int) error {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)}}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"bench.prewarm.io/probe": stamp()}}})
			return ctrl.Patch(f.ctx, node, client.RawPatch(types.MergePatchType, patch))
		}},
		{"PATCH leases", "an agent's Lease renewal (a patch of renewTime; the agent's is a PUT of the Lease it holds)", func(i int) error {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench-cost-" + nodeName(i)}}
			patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": metav1.NewMicroTime(time.Now())}})
			return agent.Patch(f.ctx, l, client.RawPatch(types.MergePatchType, patch))
		}},
	}
	var out []writeCost
	for _, k := range kinds {
		cpu0, at0 := serverCPU(childCPU()), time.Now()
		time.Sleep(costIdle) // the background's rate: nothing to wait for, a span to measure
		idleRate := (serverCPU(childCPU()) - cpu0) / time.Since(at0).Seconds()
		before, err := f.apiMetrics()
		if err != nil {
			return nil, err
		}
		cpu1, at1 := serverCPU(childCPU()), time.Now()
		var next atomic.Int64
		g, _ := errgroup.WithContext(f.ctx)
		for range costWorkers {
			g.Go(func() error {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					if err := k.write(i % f.nodes); err != nil {
						return fmt.Errorf("%s: %w", k.kind, err)
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		wall := time.Since(at1)
		used := serverCPU(childCPU()) - cpu1 - idleRate*wall.Seconds()
		after, err := f.apiMetrics()
		if err != nil {
			return nil, err
		}
		c := writeCost{kind: k.kind, what: k.what, writes: n, cpu: used / float64(n), wall: wall, idle: idleRate}
		for key, v := range after {
			verb, _, _ := strings.Cut(key, " ")
			if isWrite(verb) && key != k.kind {
				c.others += v - before[key]
			}
		}
		log.Printf("%d nodes: %s: %d in %s, %.2f ms of API-server CPU each (priced: %t, %.2f CPUs before); %.0f other writes meanwhile",
			f.nodes, k.kind, n, wall.Round(time.Millisecond), 1000*c.cpu, c.priced(), idleRate, c.others)
		out = append(out, c)
	}
	return out, nil
}

// costKinds maps the rollout's requests to the measured kind whose cost they are counted at.
var costKinds = map[string]string{
	"PATCH nodecaches/status": "PATCH nodecaches/status",
	"PATCH nodecaches":        "PATCH nodecaches",
	"POST nodecaches":         "PATCH nodecaches",
	"PATCH nodes":             "PATCH nodes",
	"PUT leases":              "PATCH leases",
	"POST leases":             "PATCH leases",
}

// costMarkdown writes the API server's CPU per write of each kind (--write-costs), and what the
// last run's writes of those kinds cost at that price, against the CPU the API server used.
func (r report) costMarkdown() string {
	b := &strings.Builder{}
	r.header(b, costBeginMarker, "Scale: what one write costs the API server", "bench-writecost",
		fmt.Sprintf("--steady %s --write-costs %d", r.opts.steady, r.opts.writeCosts))
	fmt.Fprintf(b, "\nThe same fleet and caches as the scale section. What one write costs the API server (--write-costs %d): after the fleet's last run converged, %d writes of each kind "+
		"prewarm makes, %d in flight, on the fleet's own objects (its nodes' NodeCaches and Nodes; Leases of the probe's own), with service-account "+
		"tokens as the agents and the controller use; the CPU seconds of kube-apiserver and etcd over the writes, less their rate over the %s "+
		"just before (kwok's and the agents' Lease renewals), per write. Other writes: of any other kind, counted by the API server meanwhile "+
		"(the controller's and agents' reactions are in the price). For comparison, kwok: the API-server CPU while kwok made the nodes "+
		"Ready and schedulable, per node.\n\n", r.opts.writeCosts, r.opts.writeCosts, costWorkers, costIdle)
	fmt.Fprintf(b, "A price is given only where the API server used less than %.0f %% of the machine before the probe: a server already "+
		"busy makes the probe's writes instead of other work, not beside it, and the difference prices nothing (–).\n\n", 100*costBusy)
	b.WriteString("| nodes | write | writes | API-server CPU per write | API server before | writes/s | other writes meanwhile |\n|---:|---|---:|---:|---:|---:|---:|\n")
	for _, f := range r.fleets {
		for _, c := range f.costs {
			price := "–"
			if c.priced() {
				price = fmt.Sprintf("%.1f ms", 1000*c.cpu)
			}
			fmt.Fprintf(b, "| %d | %s: %s | %d | %s | %.2f CPUs | %.0f | %.0f |\n", f.nodes, c.kind, c.what, c.writes, price, c.idle,
				float64(c.writes)/c.wall.Seconds(), c.others)
		}
		fmt.Fprintf(b, "| %d | kwok: a node made Ready and schedulable (all its writes) | %d | %.1f ms | – | – | – |\n", f.nodes, f.nodes,
			1000*f.nodesServerCPU/float64(f.nodes))
	}
	b.WriteString("\nThe last run's writes of those kinds at that price, against the CPU kube-apiserver and etcd used over the run:\n\n")
	b.WriteString("| nodes | caches | writes priced | at the measured price | API server used over the run | priced share | API-server CPU per node: the run | kwok |\n" +
		"|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.fleets {
		if len(f.costs) == 0 {
			continue
		}
		run := f.runs[len(f.runs)-1]
		used := serverCPU(run.procCPU)
		if slices.ContainsFunc(f.costs, func(c writeCost) bool { return !c.priced() }) {
			fmt.Fprintf(b, "| %d | %d | – | not priced | %.0f CPU-s | – | %.0f ms | %.0f ms |\n", f.nodes, run.caches, used,
				1000*used/float64(f.nodes), 1000*f.nodesServerCPU/float64(f.nodes))
			continue
		}
		price := map[string]float64{}
		for _, c := range f.costs {
			price[c.kind] = c.cpu
		}
		var n, cpu float64
		for key, kind := range costKinds {
			n += run.requests[key]
			cpu += run.requests[key] * price[kind]
		}
		fmt.Fprintf(b, "| %d | %d | %.0f | %.0f CPU-s | %.0f CPU-s | %.0f %% | %.0f ms | %.0f ms |\n", f.nodes, run.caches, n, cpu, used,
			100*cpu/used, 1000*used/float64(f.nodes), 1000*f.nodesServerCPU/float64(f.nodes))
	}
	b.WriteString("\nThe objects those writes change, as the fleet's informers hold them after the run (JSON, managed fields included):\n\n")
	b.WriteString("| nodes | object | mean size | largest |\n|---:|---|---:|---:|\n")
	for _, f := range r.fleets {
		for _, s := range f.sizes {
			fmt.Fprintf(b, "| %d | %s | %.1f KiB | %.1f KiB |\n", f.nodes, s.kind, s.mean/1024, float64(s.largest)/1024)
		}
	}
	fmt.Fprintf(b, "\n%s\n", costEndMarker)
	return b.String()
}

// objectSizes are the mean and largest JSON size of one kind of object.
type objectSizes struct {
	kind    string
	mean    float64
	largest int
}

// sizesOf measures the fleet's NodeCaches and Nodes as its informers hold them.
func (f *fleet) sizesOf() ([]objectSizes, error) {
	ncs := &prewarmv1alpha1.NodeCacheList{}
	nodes := &corev1.NodeList{}
	for _, l := range []client.ObjectList{ncs, nodes} {
		if err := f.view.List(f.ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
	}
	nc, err := sizes("NodeCache", ncs.Items)
	if err != nil {
		return nil, err
	}
	node, err := sizes("Node", nodes.Items)
	return []objectSizes{nc, node}, err
}

// sizes measures items' JSON.
func sizes[T any](kind string, items []T) (objectSizes, error) {
	s := objectSizes{kind: kind}
	total := 0
	for i := range items {
		b, err := json.Marshal(&items[i])
		if err != nil {
			return s, err
		}
		total += len(b)
		s.largest = max(s.largest, len(b))
	}
	if len(items) > 0 {
		s.mean = float64(total) / float64(len(items))
	}
	return s, nil
}
