// Package capacity measures how an agent keeps a disk smaller than its caches between its
// watermarks: a run that asks one node for caches past its capacity and deletes some, sampling
// the disk's used share throughout. make bench-capacity writes the plot to docs/benchmarks.md;
// the test suite runs the same and checks its invariants.
package capacity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/harness"
)

var server *testutil.APIServer

func TestMain(m *testing.M) { os.Exit(testutil.RunWithAPIServer(m, &server)) }

const (
	beginMarker = "<!-- bench-capacity:begin (make bench-capacity writes this section) -->"
	endMarker   = "<!-- bench-capacity:end -->"
	fsxID       = "fs-0123456789abcdef0"
	node        = "node-capacity"
	root        = "/opt/dlami/nvme"
	diskBytes   = 200 << 20
	cacheBytes  = 30 << 20
	high, low   = 85, 70
)

// sample is the disk's used share at a time of the run.
type sample struct {
	at   time.Duration
	used float64
}

// step is one thing the run did, and the disk after it settled.
type step struct {
	at     time.Duration
	what   string
	used   float64
	states string
}

// A node whose disk (200 MiB) is smaller than the caches it is asked for (ten of 30 MiB, one of
// them used by a pod throughout, two deleted along the way) keeps the disk at or under its high watermark at every sample,
// never evicts the cache the pod uses, and holds as many caches as fit.
func TestDiskUseOverARun(t *testing.T) {
	ctx := t.Context()
	host := t.TempDir()
	disk := filepath.Join(host, root)
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size="+strconv.Itoa(diskBytes)); err != nil {
		t.Fatalf("mounting a %d-byte filesystem at %s (the test runs as root): %v", diskBytes, disk, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(disk, unix.MNT_DETACH) })
	const caches = 10
	uids := make([]string, caches)
	for i := range caches {
		uids[i] = fmt.Sprintf("eeeeeeee-0000-4000-8000-%012d", i)
		dir := filepath.Join(host, "fsx", fmt.Sprintf("m%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "w.bin"), gen.Bytes(uint64(i+1), cacheBytes), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	request := func(i int) prewarmv1alpha1.CacheRequest {
		return prewarmv1alpha1.CacheRequest{UID: uids[i], Namespace: "default", Name: fmt.Sprintf("m%d", i), Root: root,
			Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: fsxID, Path: fmt.Sprintf("m%d", i)}}
	}
	c := server.Client
	if err := c.Create(ctx, &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	cfg := config.OperatorConfiguration{Kind: config.Kind, CacheRoots: testutil.DirRoots(root),
		FSx:          []config.FSxMount{{FileSystemID: fsxID, MountPath: "/fsx"}},
		SourceAccess: []config.SourceRule{{Namespaces: []string{"default"}, FSx: &config.FSxRule{FileSystemID: fsxID}}},
		Agent:        config.Agent{Kubelet: testutil.NoKubelet()}}
	cfg.CacheRoots[0].HighWatermarkPercent, cfg.CacheRoots[0].LowWatermarkPercent = high, low
	harness.RunAgent(t, ctx, server, node, agent.Options{
		Config: cfg, HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, ProgressInterval: 200 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})

	start := time.Now()
	var mu sync.Mutex
	var samples []sample
	sctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			mu.Lock()
			samples = append(samples, sample{time.Since(start), usedPercent(disk)})
			mu.Unlock()
			select {
			case <-sctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	var steps []step
	settle := func(what string, asked []int) {
		t.Helper()
		var states map[string]prewarmv1alpha1.CacheStatus
		err := testutil.Eventually(ctx, time.Minute, func() (bool, error) {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := c.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
				return false, err
			}
			states = map[string]prewarmv1alpha1.CacheStatus{}
			for _, cs := range nc.Status.Caches {
				states[cs.UID] = cs
			}
			for _, i := range asked {
				st, ok := states[uids[i]]
				if !ok || st.State == inferencev1.CacheDownloading || st.Reason == prewarmv1alpha1.ReasonQueued {
					return false, nil
				}
			}
			return len(states) == len(asked), nil
		})
		if err != nil {
			t.Fatalf("%s: the node did not settle: %v (%v)", what, err, states)
		}
		var b strings.Builder
		for _, i := range asked {
			st := states[uids[i]]
			fmt.Fprintf(&b, "m%d %s ", i, short(st))
		}
		steps = append(steps, step{at: time.Since(start), what: what, used: usedPercent(disk), states: strings.TrimSpace(b.String())})
	}
	ask := func(asked []int) {
		t.Helper()
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(nc.DeepCopy())
		nc.Spec.Caches = nil
		for _, i := range asked {
			nc.Spec.Caches = append(nc.Spec.Caches, request(i))
		}
		if err := c.Patch(ctx, nc, patch); err != nil {
			t.Fatal(err)
		}
	}

	// m0 is used by a pod on the node throughout.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "worker"}, Spec: corev1.PodSpec{
		NodeName: node, Containers: []corev1.Container{{Name: "w", Image: "x"}},
		Volumes: []corev1.Volume{{Name: "m", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: prewarmv1alpha1.CSIDriverName, VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: uids[0]},
		}}}},
	}}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	var asked []int
	for i := range caches {
		asked = append(asked, i)
		ask(asked)
		settle(fmt.Sprintf("ask for m%d", i), asked)
		if i == 5 || i == 8 {
			// The cache asked for before this one is deleted: its request goes, its files are
			// removed, and an evicted cache that fits again is fetched again.
			gone := asked[len(asked)-2]
			asked = append(asked[:len(asked)-2:len(asked)-2], asked[len(asked)-1])
			ask(asked)
			settle(fmt.Sprintf("delete m%d", gone), asked)
		}
	}
	stop()
	<-sampled

	mu.Lock()
	defer mu.Unlock()
	peak := 0.0
	for _, s := range samples {
		peak = max(peak, s.used)
	}
	if peak > high {
		t.Errorf("the disk was %.1f%% used at its peak, above its high watermark of %d%%", peak, high)
	}
	last := steps[len(steps)-1]
	if !strings.Contains(last.states, "m0 Ready") {
		t.Errorf("the cache a pod uses is not Ready at the end: %s", last.states)
	}
	if n := strings.Count(last.states, "Ready"); n < 4 {
		t.Errorf("only %d caches of 30 MiB Ready on a 200 MiB disk with an 85%% high watermark: %s", n, last.states)
	}
	chart := plot(samples, steps)
	t.Logf("disk used over the run:\n%s", chart)
	if path := os.Getenv("PREWARM_CAPACITY_REPORT"); path != "" && !t.Failed() {
		if err := testutil.WriteSection(path, beginMarker, endMarker, markdown(chart, steps, peak)); err != nil {
			t.Fatal(err)
		}
		t.Logf("figures written to %s", path)
	}
}

func short(st prewarmv1alpha1.CacheStatus) string {
	if st.State == inferencev1.CacheReady {
		return "Ready"
	}
	return string(st.State) + "/" + st.Reason
}

func usedPercent(dir string) float64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Blocks == 0 {
		return 0
	}
	return float64(st.Blocks-st.Bfree) * 100 / float64(st.Blocks)
}

// plot draws the disk's used share over the run, in text: one column per slice of time (its
// highest sample; a row is filled where the sample is above the row's figure), the watermarks as
// lines, and the steps numbered along the bottom.
func plot(samples []sample, steps []step) string {
	const cols, rows = 72, 20
	if len(samples) == 0 {
		return ""
	}
	end := samples[len(samples)-1].at
	col := func(at time.Duration) int { return min(cols-1, int(int64(at)*cols/int64(max(end, 1)))) }
	top := make([]float64, cols)
	for _, s := range samples {
		top[col(s.at)] = max(top[col(s.at)], s.used)
	}
	var b strings.Builder
	for r := rows; r >= 1; r-- {
		lo := float64(r-1) * 100 / rows
		line := []byte(strings.Repeat(" ", cols))
		for c, v := range top {
			if v > lo {
				line[c] = '#'
			}
		}
		label := "    "
		switch {
		case int(lo) <= high && high < int(lo)+100/rows:
			label = "high"
			for c := range line {
				if line[c] == ' ' {
					line[c] = '-'
				}
			}
		case int(lo) <= low && low < int(lo)+100/rows:
			label = " low"
			for c := range line {
				if line[c] == ' ' {
					line[c] = '.'
				}
			}
		}
		fmt.Fprintf(&b, "%3.0f%% %s |%s\n", lo, label, line)
	}
	marks := []byte(strings.Repeat(" ", cols))
	for i, s := range steps {
		if c := col(s.at); c < cols {
			marks[c] = "123456789abcdefghijklmnopqrstuvwxyz"[i%35]
		}
	}
	fmt.Fprintf(&b, "          +%s\n", strings.Repeat("-", cols))
	fmt.Fprintf(&b, "    steps  %s\n", marks)
	fmt.Fprintf(&b, "           0 s%s%.0f s\n", strings.Repeat(" ", cols-6), end.Seconds())
	return b.String()
}

func markdown(chart string, steps []step, peak float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## Capacity: a disk smaller than its caches\n\n", beginMarker)
	fmt.Fprintf(&b, "`make bench-capacity` (`go test ./test/bench/capacity -run TestDiskUseOverARun -v`), %s, on this machine (%d CPUs, %s).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOARCH)
	fmt.Fprintf(&b, "One agent (a real process's code, against a real API server) on a %d MiB filesystem (tmpfs, whose blocks are counted like a disk's), "+
		"`highWatermarkPercent: %d`, `lowWatermarkPercent: %d`, no reserve, asked one after another for ten caches of %d MiB (%d MiB in all); "+
		"a pod on the node uses m0 throughout; m4 and then m7 (each the cache asked for before the last) are deleted along the way. The disk's used share, sampled every 20 ms (each column: the highest sample of its slice of time, filled up to the last row it is above); "+
		"the marks along the bottom are the steps below (1–9, then a, b, c for 10–12). Peak: **%.1f%%** (high watermark %d%%).\n\n",
		diskBytes>>20, high, low, cacheBytes>>20, 10*cacheBytes>>20, peak, high)
	b.WriteString("```\n" + chart + "```\n\n")
	b.WriteString("| step | at | what | disk used after | the caches then |\n|---:|---:|:---|---:|:---|\n")
	for i, s := range steps {
		fmt.Fprintf(&b, "| %d | %.1f s | %s | %.1f%% | %s |\n", i+1, s.at.Seconds(), s.what, s.used, s.states)
	}
	b.WriteString("\n" + endMarker + "\n")
	return b.String()
}
