package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// serverProcs are the process names of the API server: kube-apiserver and its etcd.
var serverProcs = []string{"kube-apiserver", "etcd"}

// capServer puts this bench's kube-apiserver and etcd into a CPU cgroup of their own, allowed
// cpus CPUs between them (the CFS quota of cgroup v1's cpu controller, or cgroup v2's cpu.max):
// the same load on a smaller API server. The returned func moves them back and removes the
// cgroup.
func capServer(cpus float64) (func(), error) {
	var pids []int
	self := os.Getpid()
	for pid, p := range procs() {
		if p.parent == self && slices.Contains(serverProcs, p.name) {
			pids = append(pids, pid)
		}
	}
	if len(pids) != len(serverProcs) {
		return nil, fmt.Errorf("found %d API server processes (%v) of this bench, want kube-apiserver and etcd", len(pids), pids)
	}
	quota := int64(cpus * 100000)
	root, dir, limit := "", "", ""
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil { // cgroup v2
		root = "/sys/fs/cgroup"
		if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
			return nil, fmt.Errorf("enabling the cpu controller: %w", err)
		}
		limit = "cpu.max"
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil { // cgroup v1
		root, limit = "/sys/fs/cgroup/cpu", "cpu.cfs_quota_us"
	} else {
		return nil, errors.New("no cgroup cpu controller with a CPU quota (/sys/fs/cgroup)")
	}
	dir = filepath.Join(root, fmt.Sprintf("prewarm-bench-scale-%d-%d", self, time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	release := func() {
		for _, pid := range pids {
			_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		}
		_ = os.Remove(dir) // empty now: its processes left (or exited)
	}
	value := strconv.FormatInt(quota, 10)
	if limit == "cpu.max" {
		value += " 100000"
	} else if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte("100000"), 0); err != nil {
		release()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, limit), []byte(value), 0); err != nil {
		release()
		return nil, fmt.Errorf("setting %s: %w", limit, err)
	}
	for _, pid := range pids {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			release()
			return nil, fmt.Errorf("moving process %d into %s: %w", pid, dir, err)
		}
	}
	return release, nil
}

// serverCPU is the CPU seconds kube-apiserver and etcd have used, from childCPU's figures.
func serverCPU(procs map[string]float64) float64 {
	var s float64
	for _, name := range serverProcs {
		s += procs[name]
	}
	return s
}

// cpuCap names a cap: "0.5 CPUs", or "none".
func cpuCap(cpus float64) string {
	if cpus == 0 {
		return "none"
	}
	return strconv.FormatFloat(cpus, 'f', -1, 64) + " CPUs"
}

const (
	serverBeginMarker = "<!-- bench-scale-server:begin (make bench-server writes this section) -->"
	serverEndMarker   = "<!-- bench-scale-server:end -->"
)

// serverMarkdown is the section of --server-cpus: each fleet on API servers allowed more or
// fewer CPUs, and how the time to converge follows kwok's own time.
func (r report) serverMarkdown() string {
	var b strings.Builder
	caps := make([]string, len(r.opts.serverCPUs))
	for i, c := range r.opts.serverCPUs {
		caps[i] = strconv.FormatFloat(c, 'f', -1, 64)
	}
	r.header(&b, serverBeginMarker, "Scale: the same load on a smaller and a larger API server", "bench-server",
		"--steady 0s --server-cpus "+strings.Join(caps, ","))
	b.WriteString("\nThe same fleet and caches as the scale section, once per API server size on a fresh cluster each: kube-apiserver " +
		"and etcd are put in a CPU cgroup of their own, allowed the CPUs in the \"API server cap\" column between them (a CFS quota; " +
		"\"none\": the whole machine, shared with the harness). kwok's nodes and prewarm's rollout run on the same server, so the two " +
		"times scale together if the API server sets both. \"Used\" is the CPUs kube-apiserver and etcd used on average over that step.\n\n")
	b.WriteString("| nodes | caches | API server cap | kwok: schedulable | used | converged | used | converged ÷ schedulable |\n")
	b.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for _, f := range r.fleets {
		for _, c := range f.runs {
			fmt.Fprintf(&b, "| %d | %d | %s | %.1f s | %.2f CPUs | %.1f s | %.2f CPUs | %.2f× |\n", f.nodes, c.caches, cpuCap(f.serverCap),
				f.schedulable.Seconds(), f.nodesServerCPU/f.schedulable.Seconds(), c.converge.Seconds(),
				serverCPU(c.procCPU)/c.converge.Seconds(), c.converge.Seconds()/f.schedulable.Seconds())
		}
	}
	fmt.Fprintf(&b, "\n%s\n", serverEndMarker)
	return b.String()
}
