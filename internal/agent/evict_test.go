package agent_test

import (
	"context"
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
)

// hostDisk makes a host folder whose cache root, /opt/dlami/nvme, is a disk of size bytes.
func hostDisk(t *testing.T, size int64) (host, root, disk string) {
	t.Helper()
	host, root = t.TempDir(), "/opt/dlami/nvme"
	disk = filepath.Join(host, root)
	smallDisk(t, disk, size)
	return host, root, disk
}

// smallDisk mounts a filesystem of size bytes at dir (tmpfs: its blocks are counted exactly, as
// a disk's are) for the test's length.
func smallDisk(t *testing.T, dir string, size int64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("mounting a %d-byte filesystem at %s (the test runs as root): %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// usedFraction is the filesystem at dir's used share, in percent.
func usedFraction(t *testing.T, dir string) float64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return float64(st.Blocks-st.Bfree) * 100 / float64(st.Blocks)
}

// counter is a counter's value in reg, by its labels.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// On a disk too small for all its caches, the agent keeps the disk between its watermarks by
// policy: a new cache evicts the least recently used one that no pod uses and is not pinned,
// and only as much as brings the disk to its low watermark; a download that cannot fit even
// after every eviction the policy allows fails with the figures, evicts nothing and leaves no
// partial files; a disk pushed over its high watermark by someone else's files has caches
// evicted until it is at its low one; and an evicted cache comes back when there is room.
func TestEvictionKeepsTheDiskBetweenItsWatermarks(t *testing.T) {
	ctx, api := startAPI(t)
	host, root, disk := hostDisk(t, 100<<20)
	cacheRoot := filepath.Join(disk, "prewarm")
	const (
		uidA = "aaaaaaaa-0000-4000-8000-00000000000a" // a pod mounts it
		uidB = "aaaaaaaa-0000-4000-8000-00000000000b" // pinned
		uidC = "aaaaaaaa-0000-4000-8000-00000000000c" // least recently used
		uidD = "aaaaaaaa-0000-4000-8000-00000000000d"
		uidE = "aaaaaaaa-0000-4000-8000-00000000000e" // the newcomer
		uidF = "aaaaaaaa-0000-4000-8000-00000000000f" // does not fit at all
	)
	for i, m := range []struct {
		name string
		size int
	}{{"a", 15 << 20}, {"b", 15 << 20}, {"c", 15 << 20}, {"d", 15 << 20}, {"e", 20 << 20}, {"f", 50 << 20}} {
		writeFiles(t, filepath.Join(host, "fsx", m.name), map[string][]byte{"config.json": []byte(`{}`), "w.bin": gen.Bytes(uint64(40+i), m.size)})
	}
	req := func(uid, name string) prewarmv1alpha1.CacheRequest {
		return prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "default", Name: name, Root: root, Source: fsxSource(name)}
	}
	pinned := req(uidB, "b")
	pinned.Pinned = true
	askNode(t, ctx, api, "node-ev", req(uidA, "a"), pinned, req(uidC, "c"))

	cfg := testConfig(root)
	cfg.CacheRoots[0].HighWatermarkPercent, cfg.CacheRoots[0].LowWatermarkPercent = 75, 66
	reg := prometheus.NewRegistry()
	a := runAgent(t, ctx, api, "node-ev", agent.Options{
		Config: cfg, HostPrefix: host, Registerer: reg,
		StatusInterval: 100 * time.Millisecond, ProgressInterval: 200 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status_, wait := watchStatus(t, ctx, api, "node-ev", uidA, uidB, uidC, uidD, uidE, uidF)
	ready := func(uids ...string) func() bool {
		return func() bool {
			for _, uid := range uids {
				if status_(uid).State != inferencev1.CacheReady {
					return false
				}
			}
			return true
		}
	}
	// Each sample of the disk stays at or under the high watermark (and the first over it is
	// named).
	var over atomic.Value
	sample := func() {
		if f := usedFraction(t, disk); f > 75 && over.Load() == nil {
			over.Store(f)
		}
	}
	waitSampling := func(what string, cond func() bool) {
		t.Helper()
		wait(what, func() bool { sample(); return cond() })
	}
	waitSampling("a, b and c Ready", ready(uidA, uidB, uidC))
	// d is asked for later than c: c is the least recently used.
	ask := func(reqs ...prewarmv1alpha1.CacheRequest) { t.Helper(); addRequests(t, ctx, api, "node-ev", reqs...) }
	ask(req(uidD, "d"))
	waitSampling("d Ready", ready(uidD))

	// A pod on the node mounts a, the oldest.
	pod := csiPod("default", "reader", "node-ev", uidA)
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	mr := agent.MountRequest{CacheUID: uidA, PodNamespace: "default", PodName: "reader", PodUID: pod.UID}
	model, err := a.ModelToMount(ctx, mr)
	if err != nil {
		t.Fatal(err)
	}
	a.Mounted(mr, model, "/target", nil)

	// e (20 MiB) does not fit under the high watermark (75 MiB) beside 60 MiB: c goes, and
	// only c (with e written the disk is at 65 MiB, under the low watermark of 66).
	ask(req(uidE, "e"))
	waitSampling("e Ready, c evicted", func() bool {
		st := status_(uidC)
		return ready(uidE)() && st.State == inferencev1.CachePending && st.Reason == prewarmv1alpha1.ReasonEvicted
	})
	if st := status_(uidC); !strings.Contains(st.Message, "make room for cache default/e") {
		t.Errorf("c's status does not say why it was evicted: %+v", st)
	}
	for _, uid := range []string{uidA, uidB, uidD} {
		if st := status_(uid); st.State != inferencev1.CacheReady {
			t.Errorf("cache %s (mounted, pinned, or more recently used than c) is %s: %s", uid, st.Reason, st.Message)
		}
		if _, err := engine.CheckDest(filepath.Join(cacheRoot, uid, "model")); err != nil {
			t.Errorf("cache %s is not whole on disk: %v", uid, err)
		}
	}
	if _, err := os.Stat(filepath.Join(cacheRoot, uidC, "model")); !errors.Is(err, iofs.ErrNotExist) {
		t.Errorf("the evicted cache's model is still there: %v", err)
	}
	if n := counter(t, reg, "prewarm_agent_evictions_total", map[string]string{"reason": "MakeRoom"}); n != 1 {
		t.Errorf("prewarm_agent_evictions_total{reason=MakeRoom} = %v, want 1", n)
	}

	// f (50 MiB) does not fit even with d and e gone (a is mounted, b pinned): nothing is
	// evicted, f fails with the figures, and leaves no partial files.
	ask(req(uidF, "f"))
	waitSampling("f InsufficientCapacity", func() bool {
		st := status_(uidF)
		return st.State == inferencev1.CacheFailed && st.Reason == prewarmv1alpha1.ReasonInsufficientCapacity
	})
	if st := status_(uidF); !strings.Contains(st.Message, "would free 36.7 MB") || !strings.Contains(st.Message, "default/a used by default/reader") ||
		!strings.Contains(st.Message, "default/b pinned") {
		t.Errorf("f's failure does not give the figures and what was kept: %s", st.Message)
	}
	if !ready(uidA, uidB, uidD, uidE)() {
		t.Errorf("a download that cannot fit evicted caches: a %s, b %s, d %s, e %s", status_(uidA).Reason, status_(uidB).Reason, status_(uidD).Reason, status_(uidE).Reason)
	}
	_ = filepath.WalkDir(filepath.Join(cacheRoot, uidF), func(p string, d iofs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("a download that did not fit left %s", p)
		}
		return nil
	})

	// Someone else's 15 MiB push the disk over its high watermark: d, the least recently used
	// of what may go, is evicted, which brings the disk to its low watermark; e stays.
	writeFiles(t, filepath.Join(disk, "other"), map[string][]byte{"big": gen.Bytes(99, 15<<20)})
	wait("d evicted for the watermark", func() bool {
		st := status_(uidD)
		return st.State == inferencev1.CachePending && st.Reason == prewarmv1alpha1.ReasonEvicted && strings.Contains(st.Message, "high watermark")
	})
	if !ready(uidA, uidB, uidE)() {
		t.Errorf("more was evicted than brings the disk to its low watermark: a %s, b %s, e %s", status_(uidA).Reason, status_(uidB).Reason, status_(uidE).Reason)
	}
	if f := usedFraction(t, disk); f > 75 {
		t.Errorf("the disk is %.1f%% used after eviction, above its high watermark", f)
	}
	if n := counter(t, reg, "prewarm_agent_evictions_total", map[string]string{"reason": "HighWatermark"}); n != 1 {
		t.Errorf("prewarm_agent_evictions_total{reason=HighWatermark} = %v, want 1", n)
	}

	// The other files go: there is room for one of the evicted caches again, which comes back
	// without evicting anything; the other waits, saying for what.
	if err := os.RemoveAll(filepath.Join(disk, "other")); err != nil {
		t.Fatal(err)
	}
	waitSampling("one evicted cache back", func() bool {
		return status_(uidC).State == inferencev1.CacheReady || status_(uidD).State == inferencev1.CacheReady
	})
	back, waiting := uidC, uidD
	if status_(uidD).State == inferencev1.CacheReady {
		back, waiting = uidD, uidC
	}
	waitSampling("the other waiting for room", func() bool {
		st := status_(waiting)
		return st.Reason == prewarmv1alpha1.ReasonEvicted && strings.Contains(st.Message, "fetched again when 15.7 MB more fit")
	})
	if !ready(uidA, uidB, uidE, back)() {
		t.Errorf("a cache coming back evicted another: a %s, b %s, e %s", status_(uidA).Reason, status_(uidB).Reason, status_(uidE).Reason)
	}
	if f, ok := over.Load().(float64); ok {
		t.Errorf("the disk was seen %.1f%% used, above its high watermark of 75%%", f)
	}
}

// An eviction racing with mounts of the same cache never hands a pod a half-removed directory:
// every model the node plugin is given is whole until it is done with it, and a mount that
// comes after the eviction waits for the cache to be fetched again.
func TestEvictionNeverRacesAMount(t *testing.T) {
	ctx, api := startAPI(t)
	host, root, _ := hostDisk(t, 64<<20)
	const uidA, uidB = "bbbbbbbb-0000-4000-8000-00000000000a", "bbbbbbbb-0000-4000-8000-00000000000b"
	writeFiles(t, filepath.Join(host, "fsx", "a"), map[string][]byte{"w.bin": gen.Bytes(1, 20<<20), "x.bin": gen.Bytes(2, 4<<20)})
	writeFiles(t, filepath.Join(host, "fsx", "b"), map[string][]byte{"w.bin": gen.Bytes(3, 32<<20)})
	askNode(t, ctx, api, "node-race", prewarmv1alpha1.CacheRequest{UID: uidA, Namespace: "default", Name: "a", Root: root, Source: fsxSource("a")})
	cfg := testConfig(root)
	cfg.CacheRoots[0].HighWatermarkPercent, cfg.CacheRoots[0].LowWatermarkPercent = 85, 60
	a := runAgent(t, ctx, api, "node-race", agent.Options{
		Config: cfg, HostPrefix: host, MountWait: 200 * time.Millisecond,
		StatusInterval: 50 * time.Millisecond, ProgressInterval: 100 * time.Millisecond, RecheckInterval: 200 * time.Millisecond,
		RetryInterval: 100 * time.Millisecond, MaxRetryInterval: 500 * time.Millisecond,
	})
	status_, wait := watchStatus(t, ctx, api, "node-race", uidA, uidB)
	wait("a Ready", func() bool { return status_(uidA).State == inferencev1.CacheReady })

	// The pod's mounts, over and over, as a kubelet's would be: no pod object is in the list
	// yet (it lags), so only the agent's own count of mounts under way guards them.
	var mounts, waits, broken atomic.Int64
	var lastBroken atomic.Value
	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	var lastErr atomic.Value
	go func() {
		defer close(done)
		req := agent.MountRequest{CacheUID: uidA, PodNamespace: "default", PodName: "p", PodUID: "u"}
		for mctx.Err() == nil {
			model, err := a.ModelToMount(mctx, req)
			if err != nil {
				// Told to wait (the cache is fetched again), or, on a node that cannot hold it
				// for now, refused (a cold copy is the node plugin's, which this test has not).
				lastErr.Store(err.Error())
				waits.Add(1)
				if c := status.Code(err); mctx.Err() == nil && c != codes.Unavailable && c != codes.FailedPrecondition {
					broken.Add(1)
				}
			} else {
				if _, damaged, err := engine.Check(mctx, model, engine.CheckOptions{}); err != nil || len(damaged) > 0 {
					broken.Add(1)
					lastBroken.Store(err)
				}
				mounts.Add(1)
				a.Mounted(req, model, "/target", nil)
			}
			// The next mount comes a little later (a kubelet's are not back to back, and it
			// backs off after a refusal).
			select {
			case <-mctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	wait("mounts under way", func() bool { return mounts.Load() > 10 })

	// b does not fit beside a: a is evicted between two mounts, and the mounts after wait for
	// it (which, a pod waiting, is fetched again at once).
	addRequests(t, ctx, api, "node-race", prewarmv1alpha1.CacheRequest{UID: uidB, Namespace: "default", Name: "b", Root: root, Source: fsxSource("b")})
	before := mounts.Load()
	wait("a evicted, waited for, and mounted again", func() bool {
		return waits.Load() > 0 && mounts.Load() > before+10 && status_(uidA).State == inferencev1.CacheReady
	})
	stop()
	<-done
	t.Logf("%d mounts, %d answers to wait (the last: %v)", mounts.Load(), waits.Load(), lastErr.Load())
	if n := broken.Load(); n > 0 {
		t.Errorf("%d of %d mounts were handed a model that was not whole (last: %v)", n, mounts.Load(), lastBroken.Load())
	}
}

// A fleet that writes progress rarely (a long agent.progressInterval) still has its disks looked
// at for their watermarks every 10 s: someone else's files over the high watermark evict a
// cache within that, not within the progress interval.
func TestWatermarksAreKeptWhateverTheProgressInterval(t *testing.T) {
	ctx, api := startAPI(t)
	host, root, disk := hostDisk(t, 100<<20)
	const uid = "cccccccc-0000-4000-8000-00000000000a"
	writeFiles(t, filepath.Join(host, "fsx", "a"), map[string][]byte{"w.bin": gen.Bytes(7, 15<<20)})
	askNode(t, ctx, api, "node-slow-progress", prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "default", Name: "a", Root: root, Source: fsxSource("a")})
	cfg := testConfig(root)
	cfg.CacheRoots[0].HighWatermarkPercent, cfg.CacheRoots[0].LowWatermarkPercent = 75, 66
	runAgent(t, ctx, api, "node-slow-progress", agent.Options{
		Config: cfg, HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, ProgressInterval: time.Hour, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status_, wait := watchStatus(t, ctx, api, "node-slow-progress", uid)
	wait("a Ready", func() bool { return status_(uid).State == inferencev1.CacheReady })

	writeFiles(t, filepath.Join(disk, "other"), map[string][]byte{"big": gen.Bytes(98, 65<<20)})
	start := time.Now()
	wait("a evicted for the watermark", func() bool {
		st := status_(uid)
		return st.State == inferencev1.CachePending && st.Reason == prewarmv1alpha1.ReasonEvicted && strings.Contains(st.Message, "high watermark")
	})
	t.Logf("evicted %s after the disk went over its high watermark", time.Since(start).Round(100*time.Millisecond))
}

// A download never evicts a cache of higher priority than its own: it fails with the figures,
// naming what it kept; one of the same or higher priority may evict it.
func TestEvictionKeepsHigherPriorities(t *testing.T) {
	ctx, api := startAPI(t)
	host, root, _ := hostDisk(t, 40<<20)
	const uidHigh, uidLow, uidTop = "cccccccc-0000-4000-8000-00000000000a", "cccccccc-0000-4000-8000-00000000000b", "cccccccc-0000-4000-8000-00000000000c"
	for i, name := range []string{"high", "low", "top"} {
		writeFiles(t, filepath.Join(host, "fsx", name), map[string][]byte{"w.bin": gen.Bytes(uint64(60+i), 20<<20)})
	}
	req := func(uid, name string, priority int32) prewarmv1alpha1.CacheRequest {
		return prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "default", Name: name, Root: root, Source: fsxSource(name), Priority: priority}
	}
	askNode(t, ctx, api, "node-prio", req(uidHigh, "high", 10))
	cfg := testConfig(root)
	cfg.CacheRoots[0].HighWatermarkPercent, cfg.CacheRoots[0].LowWatermarkPercent = 80, 50
	runAgent(t, ctx, api, "node-prio", agent.Options{
		Config: cfg, HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, ProgressInterval: 200 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status_, wait := watchStatus(t, ctx, api, "node-prio", uidHigh, uidLow, uidTop)
	wait("high Ready", func() bool { return status_(uidHigh).State == inferencev1.CacheReady })
	add := func(r prewarmv1alpha1.CacheRequest) { t.Helper(); addRequests(t, ctx, api, "node-prio", r) }
	add(req(uidLow, "low", 0))
	wait("low InsufficientCapacity, high kept", func() bool {
		st := status_(uidLow)
		return st.Reason == prewarmv1alpha1.ReasonInsufficientCapacity && strings.Contains(st.Message, "default/high priority 10")
	})
	if st := status_(uidHigh); st.State != inferencev1.CacheReady {
		t.Errorf("a download of lower priority evicted high: %s %s", st.Reason, st.Message)
	}
	add(req(uidTop, "top", 10))
	wait("top Ready, high evicted", func() bool {
		st := status_(uidHigh)
		return status_(uidTop).State == inferencev1.CacheReady && st.Reason == prewarmv1alpha1.ReasonEvicted
	})
}
