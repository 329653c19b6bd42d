package main

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"

	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on Linux).
const clockTicks = 100

// procStat returns a process's command name, parent and CPU seconds (user + system).
func procStat(pid int) (string, int, float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, 0, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	f := strings.Fields(s[end+2:]) // from field 3 (state) on
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return s[open+1 : end], ppid, (utime + stime) / clockTicks, true
}

func cpuSeconds(pid int) float64 {
	_, _, cpu, _ := procStat(pid)
	return cpu
}

// rssMiB reads a VmRSS or VmHWM line of /proc/<pid>/status.
func rssMiB(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// proc is a process as /proc/<pid>/stat shows it.
type proc struct {
	name   string
	parent int
	cpu    float64 // CPU seconds, user + system
}

// procs reads every process of the machine, by pid.
func procs() map[int]proc {
	out := map[int]proc{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if n, pp, c, ok := procStat(pid); ok {
			out[pid] = proc{name: n, parent: pp, cpu: c}
		}
	}
	return out
}

// childCPU is the CPU seconds of this process ("bench": the simulated agents and the view) and
// of every process below it (the API server, etcd, kwok, ...), by command name.
func childCPU() map[string]float64 {
	self, all := os.Getpid(), procs()
	below := func(pid int) bool {
		for p := pid; p > 1; p = all[p].parent {
			if p == self {
				return true
			}
		}
		return false
	}
	out := map[string]float64{}
	for pid, p := range all {
		switch {
		case pid == self:
			out["bench (simulated agents)"] += p.cpu
		case below(pid):
			out[p.name] += p.cpu
		}
	}
	return out
}

// apiFamilies reads the API server's metrics.
func (f *fleet) apiFamilies() (map[string]*dto.MetricFamily, error) {
	cs, err := kubernetes.NewForConfig(f.cluster.Config)
	if err != nil {
		return nil, err
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(f.ctx)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(raw))
}

// apiMetrics reads apiserver_request_total from the API server, summed by verb and resource.
func (f *fleet) apiMetrics() (map[string]float64, error) {
	families, err := f.apiFamilies()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	fam := families["apiserver_request_total"]
	if fam == nil {
		return out, nil
	}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		out[l["verb"]+" "+res] += m.GetCounter().GetValue()
	}
	return out, nil
}

// writes sums the requests that write, on resources whose name is in of (all when empty).
func writes(req map[string]float64, of ...string) float64 {
	total := 0.0
	for key, v := range req {
		verb, res, _ := strings.Cut(key, " ")
		if !isWrite(verb) {
			continue
		}
		if len(of) == 0 || slices.Contains(of, res) {
			total += v
		}
	}
	return total
}

// isWrite reports whether an apiserver_request_total verb writes.
func isWrite(verb string) bool {
	switch verb {
	case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION", "CREATE", "UPDATE":
		return true
	}
	return false
}

// controllerResources are the objects only prewarm's controller writes once the nodes are up
// (the node-lifecycle controller's taint writes are done by then; the labels are prewarm's).
var controllerResources = []string{"nodecaches", "nodes", "modeldatacacheconfigs", "modeldatacacheconfigs/status",
	"inferenceimagecaches", "inferenceimagecaches/status", "inferenceendpointconfigs", "inferenceendpointconfigs/status"}

type report struct {
	opts    options
	started time.Time
	fleets  []fleetResult
}

const (
	beginMarker = "<!-- bench-scale:begin (make bench-scale writes this section) -->"
	endMarker   = "<!-- bench-scale:end -->"
)

func (r report) markdown() string {
	var b strings.Builder
	r.header(&b, beginMarker, "Scale: the control plane on a large fleet", "bench-scale",
		fmt.Sprintf("--max-node-caches %d --steady %s --api-priority %s", r.opts.maxNodeCaches, r.opts.steady, r.opts.apiPriority))
	applied := "not applied (the chart's default)"
	if r.opts.apiPriority == "on" {
		applied = "applied (apiPriority.enabled)"
	}
	fmt.Fprintf(&b, "The agents' own API priority level, prewarm-agents, was %s.\n", applied)
	b.WriteString(`A real kube-apiserver and etcd, kube-controller-manager, kube-scheduler and kwok; the real controller
binary at its default settings; every node's agent simulated by internal/testutil/agentsim (the agent's own
reports and write policy; each download takes the --download time). The controller and the simulated agents
authenticate with tokens of the chart's service accounts, so that API Priority and Fairness classifies their
requests as in an installation (the admin's would be exempt). Nodes have 8 GPUs and one of ten instance
types. One cache targets every node; with 10 or 50 caches, each targets one instance type (with 50, five
caches share each type). Every parent has a weights cache and an image cache (one DaemonSet pod per node, run by
kwok). kwok renews node leases over --node-lease (the node lifecycle controller waits five times that): at the
kubelet's 10 s, 5,000 nodes' lease writes alone would take this API server's CPU. The last cache count of a
fleet is not deleted (–). Converged: every weights cache Ready on all its targets with every node labelled, every image cache
Complete and labelled, every gate open. Writes per node-cache: the agents' NodeCache status writes, and the
controller's writes to NodeCaches, node labels and prewarm's objects, over the node-caches of the run.

`)
	b.WriteString("| nodes | kwok: nodes Ready | schedulable |\n|---:|---:|---:|\n")
	for _, f := range r.fleets {
		fmt.Fprintf(&b, "| %d | %.1f s | %.1f s |\n", f.nodes, f.nodesReady.Seconds(), f.schedulable.Seconds())
	}
	b.WriteString("\nAgents' own time: what the simulated downloads take alone (each node downloads " + strconv.Itoa(maxParallel) +
		" caches at once); overhead: converged minus that, the control plane's part.\n\n")
	b.WriteString("| nodes | caches | node-caches | converged | agents' own time | overhead | converged ÷ schedulable | overhead ÷ schedulable | gates open | deleted | agent writes / node-cache | controller writes / node-cache | controller CPU | RSS (peak) | largest object |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, f := range r.fleets {
		for _, c := range f.runs {
			nc := float64(c.nodeCaches)
			own := ownTime(f.nodes, c.caches, r.opts.download)
			deleted := "–"
			if c.deleted > 0 {
				deleted = fmt.Sprintf("%.1f s", c.deleted.Seconds())
			}
			fmt.Fprintf(&b, "| %d | %d | %d | %.1f s | %.0f s | %.1f s | %.2f× | %.2f× | %.1f s | %s | %.2f | %.2f | %.1f s | %.0f MiB (%.0f) | %s %s, %.1f KiB |\n",
				f.nodes, c.caches, c.nodeCaches, c.converge.Seconds(), own.Seconds(), (c.converge - own).Seconds(),
				c.converge.Seconds()/f.schedulable.Seconds(), (c.converge-own).Seconds()/f.schedulable.Seconds(), c.gate.Seconds(), deleted,
				float64(c.agentWrites)/nc, writes(c.requests, controllerResources...)/nc, c.controllerCPU, c.rssMiB, c.peakMiB,
				c.largest.kind, c.largest.name, float64(c.largest.bytes)/1024)
		}
		for _, k := range f.skipped {
			fmt.Fprintf(&b, "| %d | %d | %d | skipped (--max-node-caches) | | | | | | | | | | | |\n", f.nodes, k, nodeCachesOf(f.nodes, k))
		}
	}
	b.WriteString("\nWhen each step was done, from the apply (seconds):\n\n| nodes | caches | " + strings.Join(milestoneNames, " | ") + " |\n|---:|---:|")
	b.WriteString(strings.Repeat("---:|", len(milestoneNames)) + "\n")
	for _, f := range r.fleets {
		for _, c := range f.runs {
			fmt.Fprintf(&b, "| %d | %d |", f.nodes, c.caches)
			for _, m := range milestoneNames {
				if d, ok := c.milestones[m]; ok {
					fmt.Fprintf(&b, " %.1f |", d.Seconds())
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
	}
	if len(r.fleets) > 0 {
		last := r.fleets[len(r.fleets)-1]
		if len(last.runs) > 0 {
			run := last.runs[len(last.runs)-1]
			fmt.Fprintf(&b, "\nAPI requests during the largest run (%d nodes, %d caches, %.1f s), by verb and resource (the top 15):\n\n", last.nodes, run.caches, run.converge.Seconds())
			b.WriteString("| requests | verb resource |\n|---:|---|\n")
			rows := largestFirst(run.requests)
			for _, k := range rows[:min(len(rows), 15)] {
				fmt.Fprintf(&b, "| %.0f | %s |\n", run.requests[k], k)
			}
			if run.waits.latency != nil {
				b.WriteString("\nWhere those requests waited, in the API server (its own metrics over the run): the mean time to answer each of the requests above, " +
					"and by API Priority and Fairness priority level the requests it dispatched, their mean wait in its queues, the level's seats and what it rejected:\n\n")
				b.WriteString("| verb resource | requests | mean latency |\n|---|---:|---:|\n")
				for _, k := range rows[:min(len(rows), 15)] {
					if l, ok := run.waits.latency[k]; ok {
						fmt.Fprintf(&b, "| %s | %.0f | %s |\n", k, l.count, ms(l.mean()))
					}
				}
				b.WriteString("\n| priority level | requests | mean wait in queue | seats | rejected |\n|---|---:|---:|---:|---:|\n")
				for _, pl := range slices.Sorted(maps.Keys(run.waits.queued)) {
					q := run.waits.queued[pl]
					fmt.Fprintf(&b, "| %s | %.0f | %s | %.0f | %.0f |\n", pl, q.count, ms(q.mean()), run.waits.seats[pl], run.waits.rejected[pl])
				}
			}
			if len(run.client) > 0 {
				b.WriteString("\nThe controller's work queues over the run (its `workqueue_*` metrics), by controller:\n\n")
				b.WriteString("| controller | reconciles | mean wait in queue | mean work |\n|---|---:|---:|---:|\n")
				for _, name := range slices.Sorted(maps.Keys(run.client)) {
					w := run.client[name]
					if w.reconciles == 0 {
						continue
					}
					fmt.Fprintf(&b, "| %s | %.0f | %s | %s |\n", name, w.reconciles, ms(w.meanQueue), ms(w.meanWork))
				}
			}
			fmt.Fprintf(&b, "\nCPU seconds by process during that run (%.1f s of wall time; this machine has %d CPUs, %.0f CPU-seconds):\n\n",
				run.converge.Seconds(), runtime.NumCPU(), run.converge.Seconds()*float64(runtime.NumCPU()))
			b.WriteString("| process | CPU seconds | share of the machine |\n|---|---:|---:|\n")
			procs := maps.Clone(run.procCPU)
			procs["controller"] = run.controllerCPU
			names := largestFirst(procs)
			for _, n := range names {
				if procs[n] < 0.05 {
					continue
				}
				fmt.Fprintf(&b, "| %s | %.1f | %.0f %% |\n", n, procs[n], 100*procs[n]/(run.converge.Seconds()*float64(runtime.NumCPU())))
			}
		}
	}
	r.steadyMarkdown(&b)
	fmt.Fprintf(&b, "\n%s\n", endMarker)
	return b.String()
}

// steadyResources are the columns of the steady-state table; the rest is summed as other.
var steadyResources = []string{"leases", "nodecaches/status", "nodecaches", "nodes", "nodes/status", "pods/status"}

// steadyMarkdown writes the write rate of each converged fleet, minute by minute.
func (r report) steadyMarkdown(b *strings.Builder) {
	if !slices.ContainsFunc(r.fleets, func(f fleetResult) bool { return len(f.steady) > 0 }) {
		return
	}
	fmt.Fprintf(b, "\nThe API server's writes per second once the fleet's last run has converged (--steady %s), minute by minute, by resource; "+
		"\"before\" is a minute before the controller and agents start (kwok's node leases and status alone). Every agent renews its Lease "+
		"every %s (agent.leaseDuration %s ÷ 3) and writes its NodeCache status only on a change.\n\n",
		r.opts.steady, agent.RenewInterval(leaseDuration), leaseDuration)
	b.WriteString("| nodes | caches | minute | all writes/s | " + strings.Join(steadyResources, " | ") + " | other |\n|---:|---:|---|---:|")
	b.WriteString(strings.Repeat("---:|", len(steadyResources)+1) + "\n")
	row := func(f fleetResult, caches int, minute string, rate map[string]float64) {
		total, other := 0.0, 0.0
		for res, v := range rate {
			total += v
			if !slices.Contains(steadyResources, res) {
				other += v
			}
		}
		fmt.Fprintf(b, "| %d | %d | %s | %.1f |", f.nodes, caches, minute, total)
		for _, res := range steadyResources {
			fmt.Fprintf(b, " %.1f |", rate[res])
		}
		fmt.Fprintf(b, " %.1f |\n", other)
	}
	for _, f := range r.fleets {
		if len(f.steady) == 0 {
			continue
		}
		caches := f.runs[len(f.runs)-1].caches
		row(f, 0, "before", f.background)
		for i, rate := range f.steady {
			row(f, caches, strconv.Itoa(i+1), rate)
		}
	}
}

// largestFirst is m's keys by value, the largest first (by name among equals).
func largestFirst(m map[string]float64) []string {
	return slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b)) })
}

// section is the report's section of docs/benchmarks.md, chosen by the flags: its markers and
// text.
func (r report) section() (begin, end, text string) {
	switch {
	case r.opts.apiPriority == "both":
		return apfBeginMarker, apfEndMarker, r.apfMarkdown()
	case len(r.opts.serverCPUs) > 0:
		return serverBeginMarker, serverEndMarker, r.serverMarkdown()
	case r.opts.writeCosts > 0:
		return costBeginMarker, costEndMarker, r.costMarkdown()
	}
	return beginMarker, endMarker, r.markdown()
}

// write replaces the report's section of the file at path (or appends it).
func (r report) write(path string) error {
	begin, end, text := r.section()
	return testutil.WriteSection(path, begin, end, text)
}

// clientFigures are the controller's own metrics since it started, by controller: reconciles,
// their mean time in the work queue and in the reconciler.
type clientFigures map[string]workFigures

type workFigures struct {
	reconciles          float64
	meanQueue, meanWork time.Duration
}

func (f *fleet) controllerClientFigures() clientFigures {
	resp, err := http.Get("http://" + f.metricsAddr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil
	}
	out := clientFigures{}
	for _, name := range []string{"workqueue_queue_duration_seconds", "workqueue_work_duration_seconds"} {
		fam := families[name]
		if fam == nil {
			continue
		}
		for _, m := range fam.GetMetric() {
			ctrl := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" {
					ctrl = l.GetValue()
				}
			}
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 {
				continue
			}
			w := out[ctrl]
			mean := time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * float64(time.Second))
			if name == "workqueue_queue_duration_seconds" {
				w.meanQueue = mean
			} else {
				w.meanWork, w.reconciles = mean, float64(h.GetSampleCount())
			}
			out[ctrl] = w
		}
	}
	return out
}

func (c clientFigures) String() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(c)) {
		w := c[name]
		parts = append(parts, fmt.Sprintf("%s: %.0f reconciles, %s queued, %s working (means)", name, w.reconciles,
			w.meanQueue.Round(time.Millisecond), w.meanWork.Round(time.Millisecond)))
	}
	return strings.Join(parts, "; ")
}

// apiWaits is where the API server's requests spent their time: latency by verb and resource
// (apiserver_request_duration_seconds), and, by API Priority and Fairness priority level, the
// time requests waited in its queues and the requests it rejected.
type apiWaits struct {
	latency map[string]sumCount // "VERB resource[/subresource]"
	queued  map[string]sumCount // priority level
	// seats is the priority levels' concurrency limit (apiserver_flowcontrol_nominal_limit_seats).
	seats    map[string]float64
	rejected map[string]float64 // priority level
}

type sumCount struct{ sum, count float64 }

func (s sumCount) mean() time.Duration {
	if s.count == 0 {
		return 0
	}
	return time.Duration(s.sum / s.count * float64(time.Second))
}

func (f *fleet) apiWaits() (apiWaits, error) {
	w := apiWaits{latency: map[string]sumCount{}, queued: map[string]sumCount{}, seats: map[string]float64{}, rejected: map[string]float64{}}
	families, err := f.apiFamilies()
	if err != nil {
		return w, err
	}
	each := func(name string, fn func(l map[string]string, m *dto.Metric)) {
		for _, m := range families[name].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			fn(l, m)
		}
	}
	each("apiserver_request_duration_seconds", func(l map[string]string, m *dto.Metric) {
		if l["verb"] == "WATCH" {
			return // a watch lasts as long as its client keeps it
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		s := w.latency[key]
		s.sum, s.count = s.sum+m.GetHistogram().GetSampleSum(), s.count+float64(m.GetHistogram().GetSampleCount())
		w.latency[key] = s
	})
	each("apiserver_flowcontrol_request_wait_duration_seconds", func(l map[string]string, m *dto.Metric) {
		s := w.queued[l["priority_level"]]
		s.sum, s.count = s.sum+m.GetHistogram().GetSampleSum(), s.count+float64(m.GetHistogram().GetSampleCount())
		w.queued[l["priority_level"]] = s
	})
	each("apiserver_flowcontrol_nominal_limit_seats", func(l map[string]string, m *dto.Metric) {
		w.seats[l["priority_level"]] = m.GetGauge().GetValue()
	})
	each("apiserver_flowcontrol_rejected_requests_total", func(l map[string]string, m *dto.Metric) {
		w.rejected[l["priority_level"]] += m.GetCounter().GetValue()
	})
	return w, nil
}

// since is what happened between before and w.
func (w apiWaits) since(before apiWaits) apiWaits {
	diff := func(a, b map[string]sumCount) map[string]sumCount {
		out := map[string]sumCount{}
		for k, v := range a {
			if d := (sumCount{v.sum - b[k].sum, v.count - b[k].count}); d.count > 0 {
				out[k] = d
			}
		}
		return out
	}
	out := apiWaits{latency: diff(w.latency, before.latency), queued: diff(w.queued, before.queued), seats: w.seats, rejected: map[string]float64{}}
	for k, v := range w.rejected {
		if d := v - before.rejected[k]; d > 0 {
			out.rejected[k] = d
		}
	}
	return out
}

// ms prints d in milliseconds under ten seconds, in seconds above.
func ms(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// header starts a section: its marker and title, and the command and machine it ran on.
func (r report) header(b *strings.Builder, marker, title, target, flags string) {
	fmt.Fprintf(b, "%s\n## %s\n\n", marker, title)
	fmt.Fprintf(b, "`make %s` (`go run ./test/bench/scale --nodes %s --caches %s --download %s %s`), %s, on this machine (%d CPUs, %s).\n",
		target, testutil.JoinInts(r.opts.nodes), testutil.JoinInts(r.opts.caches), r.opts.download, flags,
		r.started.UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), runtime.GOARCH)
}
