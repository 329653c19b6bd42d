package agent_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
)

// A node with no disk at its cache root keeps no cache (NoLocalDisk, for the cache and for the
// root), yet its pod gets the model: a copy downloaded from the source under the kubelet's
// directory, verified, and removed once no pod of the node uses it.
func TestNoLocalDiskServesACopy(t *testing.T) {
	ctx, api := startAPI(t)
	host, kubelet := t.TempDir(), t.TempDir()
	root := "/opt/dlami/nvme" // not there on the node
	if err := os.MkdirAll(filepath.Join(kubelet, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"config.json": []byte(`{}`), "w.bin": gen.Bytes(4, 2<<20)}
	writeFiles(t, filepath.Join(host, "fsx", "model"), files)
	const uid = "dddddddd-4444-4444-8444-444444444444"
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Create(ctx, &prewarmv1alpha1.NodeCache{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec:       prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{{UID: uid, Namespace: "a", Name: "m-cache", Root: root, Source: fsxSource("model")}}},
	}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(root)
	cfg.CacheRoots = []config.CacheRoot{{Path: root}} // no disk there, and not allowed anywhere
	a := runAgent(t, ctx, api, "node-1", agent.Options{
		Config: cfg, HostPrefix: host, KubeletDir: kubelet, MountWait: 300 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second, EventInterval: time.Hour,
	})
	status_, wait := watchStatus(t, ctx, api, "node-1", uid)
	wait("the cache NoLocalDisk", func() bool {
		st := status_(uid)
		return st.State == inferencev1.CacheFailed && st.Reason == prewarmv1alpha1.ReasonNoLocalDisk
	})
	nc := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, types.NamespacedName{Name: "node-1"}, nc); err != nil {
		t.Fatal(err)
	}
	if len(nc.Status.Roots) != 1 || nc.Status.Roots[0].Reason != prewarmv1alpha1.ReasonNoLocalDisk ||
		!strings.Contains(nc.Status.Roots[0].Message, "does not exist on this node") {
		t.Errorf("roots %+v; want the root NoLocalDisk: nothing there", nc.Status.Roots)
	}

	// The pod, on the node, with the cache's volume.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "worker"}, Spec: corev1.PodSpec{
		NodeName: "node-1", Containers: []corev1.Container{{Name: "w", Image: "x"}},
		Volumes: []corev1.Volume{{Name: "m", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: prewarmv1alpha1.CSIDriverName, VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: uid},
		}}}},
	}}
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	req := agent.MountRequest{CacheUID: uid, PodNamespace: "a", PodName: "worker", PodUID: pod.UID}
	copyDir := filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "scratch", uid)
	dir := mountWhenReady(t, ctx, a, req, wait)
	if want := filepath.Join(copyDir, "model"); dir != want {
		t.Errorf("mounts %s; want the copy %s", dir, want)
	}
	if _, err := engine.CheckDest(dir); err != nil {
		t.Errorf("the copy does not check: %v", err)
	}
	for name, data := range files {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != string(data) {
			t.Errorf("%s in the copy: %d bytes, %v", name, len(b), err)
		}
	}
	if _, err := os.Stat(filepath.Join(host, root, prewarmv1alpha1.Directory, uid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cache directory under the root: %v; want none", err)
	}
	wait("the cache's report says its pods read a copy", func() bool {
		return strings.Contains(status_(uid).Message, "read the model from a copy under the kubelet's directory")
	})

	// Gone at once, as the kubelet makes a pod gone once its volumes are unmounted (none runs
	// here).
	if err := api.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	wait("the copy removed once no pod uses it", func() bool {
		_, err := os.Stat(copyDir)
		return errors.Is(err, os.ErrNotExist)
	})
}

// A node whose disk cannot hold a cache, even after evicting what the policy lets go
// (InsufficientCapacity), still starts its pod: the node plugin serves a copy read from the
// source, and the pod's event says it runs cold and why.
func TestANodeWithoutRoomServesACopy(t *testing.T) {
	ctx, api := startAPI(t)
	host, root, _ := hostDisk(t, 16<<20)
	kubelet := t.TempDir()
	smallDisk(t, kubelet, 64<<20) // room for the copy under its watermark
	if err := os.MkdirAll(filepath.Join(kubelet, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"config.json": []byte(`{}`), "w.bin": gen.Bytes(5, 20<<20)}
	writeFiles(t, filepath.Join(host, "fsx", "model"), files)
	const uid = "dddddddd-5555-4555-8555-555555555555"
	askNode(t, ctx, api, "node-1", prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "default", Name: "big", Root: root, Source: fsxSource("model")})
	a := runAgent(t, ctx, api, "node-1", agent.Options{
		Config: testConfig(root), HostPrefix: host, KubeletDir: kubelet, MountWait: 300 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second, EventInterval: time.Hour,
	})
	status_, wait := watchStatus(t, ctx, api, "node-1", uid)
	wait("the cache InsufficientCapacity", func() bool {
		st := status_(uid)
		return st.State == inferencev1.CacheFailed && st.Reason == prewarmv1alpha1.ReasonInsufficientCapacity
	})
	mountsColdCopy(t, ctx, api, a, kubelet, "default", "node-1", uid, wait, "InsufficientCapacity: needs 21.0 MB more")
}

// mountsColdCopy places a pod of namespace ns on node asking for cache uid, and checks that it
// mounts a complete copy read from the source, with a CacheMounted event saying it runs cold
// and why (why contains wantWhy).
func mountsColdCopy(t *testing.T, ctx context.Context, api *testutil.APIServer, a *agent.Agent, kubelet, ns, node, uid string, wait func(string, func() bool), wantWhy string) {
	t.Helper()
	pod := csiPod(ns, "worker", node, uid)
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	req := agent.MountRequest{CacheUID: uid, PodNamespace: ns, PodName: "worker", PodUID: pod.UID}
	dir := mountWhenReady(t, ctx, a, req, wait)
	if want := filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "scratch", uid, "model"); dir != want {
		t.Errorf("mounts %s; want the copy %s", dir, want)
	}
	if _, err := engine.CheckDest(dir); err != nil {
		t.Errorf("the copy does not check: %v", err)
	}
	a.Mounted(req, dir, filepath.Join(kubelet, "pods", "x"), nil)
	err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := api.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "worker" && e.Reason == agent.EventCacheMounted &&
				strings.Contains(e.Note, "running cold") && strings.Contains(e.Note, wantWhy)
		}), nil
	})
	if err != nil {
		t.Errorf("no CacheMounted event on the pod saying it runs cold and why: %v", err)
	}
}

// mountWhenReady asks for req's mount until the answer is not to wait, and returns the model
// directory it is given (the test fails on a refusal).
func mountWhenReady(t *testing.T, ctx context.Context, a *agent.Agent, req agent.MountRequest, wait func(string, func() bool)) string {
	t.Helper()
	var dir string
	wait("the copy ready for the pod", func() bool {
		var err error
		dir, err = a.ModelToMount(ctx, req)
		if status.Code(err) == codes.Unavailable {
			return false
		}
		if err != nil {
			t.Fatalf("ModelToMount: %v", err)
		}
		return true
	})
	return dir
}

// mountOnceThereIsRoom asks for req's mount, refused room for now, until it is given, and returns
// the model directory (the test fails on another refusal).
func mountOnceThereIsRoom(t *testing.T, ctx context.Context, a *agent.Agent, req agent.MountRequest, wait func(string, func() bool)) string {
	t.Helper()
	var dir string
	wait("the copy made once there is room", func() bool {
		var err error
		dir, err = a.ModelToMount(ctx, req)
		if c := status.Code(err); c == codes.Unavailable || c == codes.ResourceExhausted {
			return false
		}
		if err != nil {
			t.Fatalf("ModelToMount: %v", err)
		}
		return true
	})
	return dir
}

// mountRefused asks for req's mount until the answer is not to wait, and returns the refusal
// (the test fails when the model is mounted).
func mountRefused(t *testing.T, ctx context.Context, a *agent.Agent, req agent.MountRequest, wait func(string, func() bool)) error {
	t.Helper()
	var err error
	wait("an answer that is not to wait", func() bool {
		var dir string
		dir, err = a.ModelToMount(ctx, req)
		if err == nil {
			t.Fatalf("ModelToMount mounts %s; want a refusal", dir)
		}
		return status.Code(err) != codes.Unavailable
	})
	return err
}

// podEvent waits for an event of reason on pod ns/name whose note contains want.
func podEvent(t *testing.T, ctx context.Context, api *testutil.APIServer, ns, name, reason, want string) {
	t.Helper()
	err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := api.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == name && e.Reason == reason && strings.Contains(e.Note, want)
		}), nil
	})
	if err != nil {
		t.Errorf("no %s event on pod %s/%s saying %q: %v", reason, ns, name, want, err)
	}
}

// usedBytes is what is used of the filesystem at dir.
func usedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// noDiskNode starts an agent for node whose only cache root is memory (NoLocalDisk: every cache
// is served to its pods as a scratch copy), with a kubelet directory that is a filesystem of
// kubeletSize bytes, asked for one cache of namespace "default" per model (name: its size in
// files of 1 MiB), each read from its own directory of the FSx mount. It returns the agent, the
// kubelet directory, the caches' UIDs by name, and the status helpers.
func noDiskNode(t *testing.T, ctx context.Context, api *testutil.APIServer, node string, kubeletSize int64, models map[string]int, tune func(*agent.Options)) (*agent.Agent, string, map[string]string, func(string) prewarmv1alpha1.CacheStatus, func(string, func() bool)) {
	t.Helper()
	host, root, _ := hostDisk(t, 4<<20)
	kubelet := t.TempDir()
	smallDisk(t, kubelet, kubeletSize)
	if err := os.MkdirAll(filepath.Join(kubelet, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	uids := map[string]string{}
	var reqs []prewarmv1alpha1.CacheRequest
	for i, name := range slices.Sorted(maps.Keys(models)) {
		files := map[string][]byte{"config.json": []byte(`{}`)}
		for f := range models[name] {
			files[fmt.Sprintf("w-%02d.bin", f)] = gen.Bytes(uint64(100*i+f), 1<<20)
		}
		writeFiles(t, filepath.Join(host, "fsx", name), files)
		uids[name] = fmt.Sprintf("cccccccc-0000-4000-8000-%012d", i+1)
		reqs = append(reqs, prewarmv1alpha1.CacheRequest{UID: uids[name], Namespace: "default", Name: name, Root: root, Source: fsxSource(name)})
	}
	askNode(t, ctx, api, node, reqs...)
	cfg := testConfig(root)
	cfg.CacheRoots = []config.CacheRoot{{Path: root}} // memory: not a disk
	cfg.Agent.Kubelet = config.Kubelet{}              // the kubelet's defaults (no file on the node)
	o := agent.Options{
		Config: cfg, HostPrefix: host, KubeletDir: kubelet, MountWait: 300 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second, EventInterval: time.Hour,
	}
	if tune != nil {
		tune(&o)
	}
	a := runAgent(t, ctx, api, node, o)
	status_, wait := watchStatus(t, ctx, api, node, slices.Collect(maps.Values(uids))...)
	wait("every cache NoLocalDisk", func() bool {
		for _, uid := range uids {
			if st := status_(uid); st.State != inferencev1.CacheFailed || st.Reason != prewarmv1alpha1.ReasonNoLocalDisk {
				return false
			}
		}
		return true
	})
	return a, kubelet, uids, status_, wait
}

// Scratch copies live on the kubelet's filesystem and stay clear of its thresholds: a copy that
// would take it past 80 % used is refused though it would fit in the free space, writing
// nothing; of two copies asked for at once that each fit alone but not together, one is
// refused (the first's room is promised before it writes), and the refused one is made once the
// other copy is removed.
func TestScratchCopiesKeepClearOfTheKubeletsThresholds(t *testing.T) {
	ctx, api := startAPI(t)
	// 16 MiB: copies may fill it to 12.8 MiB (80 %) and leave 1 MiB free.
	a, kubelet, uids, status_, wait := noDiskNode(t, ctx, api, "node-k", 16<<20, map[string]int{"big": 14, "one": 7, "two": 7},
		func(o *agent.Options) {
			o.Reserve = 1 << 20
			// One file at a time, slowly (a file's room is allocated when it is begun): both
			// copies claim their room long before either has taken much of it.
			o.Engine = []engine.Option{engine.WithConcurrency(1), engine.WithRateLimit(2 << 20)}
		})
	scratch := filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "scratch")
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mountReq := func(name string) agent.MountRequest {
		pod := csiPod("default", name, "node-k", uids[name])
		if err := api.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return agent.MountRequest{CacheUID: uids[name], PodNamespace: "default", PodName: name, PodUID: pod.UID}
	}

	// 14 MiB fits in the 15 MiB free, but not under the watermark.
	before := usedBytes(t, kubelet)
	err := mountRefused(t, ctx, a, mountReq("big"), wait)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "copies may fill it to 80% and leave 1.0 MB free (agent.reserve)") ||
		!strings.Contains(err.Error(), "a copy of cache default/big for its pods needs 14.7 MB more") {
		t.Errorf("a copy past the kubelet filesystem's watermark: %v; want ResourceExhausted with the figures", err)
	}
	podEvent(t, ctx, api, "default", "big", agent.EventCacheRefused, "the kubelet's filesystem")
	wait("the cache's report says why no copy is made", func() bool {
		return strings.Contains(status_(uids["big"]).Message, "no copy for the node's pods either: the kubelet's filesystem")
	})
	if after := usedBytes(t, kubelet); after != before {
		t.Errorf("the kubelet's filesystem went from %d to %d bytes used for a copy refused room", before, after)
	}
	if _, err := os.Stat(filepath.Join(scratch, uids["big"])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a copy refused room left its directory: %v", err)
	}

	// Two copies at once, 7 MiB each: 12.8 MiB holds one of them.
	type answer struct {
		name, dir string
		err       error
	}
	answers := make(chan answer, 2)
	reqs := map[string]agent.MountRequest{"one": mountReq("one"), "two": mountReq("two")}
	for name, req := range reqs {
		go func() {
			for {
				dir, err := a.ModelToMount(ctx, req)
				if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
					answers <- answer{name, dir, err}
					return
				}
			}
		}()
	}
	got := map[bool]answer{}
	for range 2 {
		ans := <-answers
		got[ans.err == nil] = ans
	}
	mounted, refused := got[true], got[false]
	if mounted.name == "" || refused.name == "" {
		t.Fatalf("two copies that do not fit together: %+v; want one made and one refused", got)
	}
	if status.Code(refused.err) != codes.ResourceExhausted || !strings.Contains(refused.err.Error(), "copies may fill it to 80%") {
		t.Errorf("the copy that does not fit beside the other: %v; want ResourceExhausted with the figures", refused.err)
	}
	if _, err := engine.CheckDest(mounted.dir); err != nil {
		t.Errorf("the copy made does not check: %v", err)
	}
	if used := usedBytes(t, kubelet); used > 16<<20*80/100 {
		t.Errorf("the kubelet's filesystem is %d bytes used; copies may take it to %d", used, 16<<20*80/100)
	}
	if _, err := os.Stat(filepath.Join(scratch, uids[refused.name])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy refused room left its directory: %v", err)
	}

	// The pod of the copy made is gone: its copy is removed, and the other is made.
	if err := api.Client.Delete(ctx, csiPod("default", mounted.name, "node-k", ""), client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	wait("the first copy removed", func() bool {
		_, err := os.Stat(filepath.Join(scratch, uids[mounted.name]))
		return errors.Is(err, os.ErrNotExist)
	})
	if dir := mountOnceThereIsRoom(t, ctx, a, reqs[refused.name], wait); !strings.HasPrefix(dir, filepath.Join(scratch, uids[refused.name])) {
		t.Errorf("the copy refused before mounts %s once there is room; want its copy", dir)
	}
}

// The copies a node makes are bounded together (agent.maxScratchBytes): past it a pod's copy is
// refused, naming the setting, though the kubelet's filesystem has room.
func TestScratchCopiesAreBoundedPerNode(t *testing.T) {
	ctx, api := startAPI(t)
	a, kubelet, uids, status_, wait := noDiskNode(t, ctx, api, "node-b", 64<<20, map[string]int{"m": 6},
		func(o *agent.Options) {
			limit := resource.MustParse("4Mi")
			o.Config.Agent.MaxScratchBytes = &limit
		})
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := csiPod("default", "m", "node-b", uids["m"])
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	before := usedBytes(t, kubelet)
	err := mountRefused(t, ctx, a, agent.MountRequest{CacheUID: uids["m"], PodNamespace: "default", PodName: "m", PodUID: pod.UID}, wait)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "may take 4.2 MB together (agent.maxScratchBytes)") {
		t.Errorf("a copy past agent.maxScratchBytes: %v; want ResourceExhausted naming the setting", err)
	}
	wait("the cache's report says why no copy is made", func() bool {
		return strings.Contains(status_(uids["m"]).Message, "(agent.maxScratchBytes)")
	})
	if after := usedBytes(t, kubelet); after != before {
		t.Errorf("the kubelet's filesystem went from %d to %d bytes used for a copy refused room", before, after)
	}
}

// A scratch copy is never removed while a pod's volume mounts it, by the mount table, even once
// the pod object is gone (the kubelet unmounts a volume after the pod is deleted, or the agent
// restarted meanwhile): the agent's own copy stays, its cache's report saying why, and so does a
// copy left by an earlier run of the agent, which the sweep removes only once it is unmounted.
func TestAMountedScratchCopyStays(t *testing.T) {
	ctx, api := startAPI(t)
	a, kubelet, uids, status_, wait := noDiskNode(t, ctx, api, "node-m", 64<<20, map[string]int{"m": 2}, nil)
	scratch := filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "scratch")
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// bindIntoPod mounts dir as a pod's volume would be, under the kubelet's pods directory, and
	// returns the unmount.
	bindIntoPod := func(dir, podUID string) func() {
		target := filepath.Join(kubelet, "pods", podUID, "volumes", "kubernetes.io~csi", "model", "mount")
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(dir, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mounting %s at %s: %v", dir, target, err)
		}
		var once sync.Once
		unmount := func() {
			once.Do(func() {
				if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
					t.Errorf("unmounting %s: %v", target, err)
				}
			})
		}
		t.Cleanup(unmount)
		return unmount
	}

	// The agent's own copy: the pod mounts it, then the pod object goes while its volume is
	// still mounted.
	pod := csiPod("default", "worker", "node-m", uids["m"])
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	req := agent.MountRequest{CacheUID: uids["m"], PodNamespace: "default", PodName: "worker", PodUID: pod.UID}
	model := mountWhenReady(t, ctx, a, req, wait)
	unmount := bindIntoPod(model, string(pod.UID))
	a.Mounted(req, model, filepath.Join(kubelet, "pods", string(pod.UID)), nil)
	if err := api.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	wait("the cache's report says its copy is kept while a volume mounts it", func() bool {
		return strings.Contains(status_(uids["m"]).Message, "kept while a pod's volume still mounts it")
	})
	if _, err := engine.CheckDest(model); err != nil {
		t.Errorf("the copy a volume still mounts: %v", err)
	}
	unmount()
	wait("the copy removed once unmounted", func() bool {
		_, err := os.Stat(filepath.Join(scratch, uids["m"]))
		return errors.Is(err, os.ErrNotExist)
	})

	// Copies left by an earlier run of the agent (no cache of this node's now, no pod object):
	// one still mounted by a volume, one not. Each is made aside (a name the sweep leaves
	// alone) and moved in whole, the mounted one first.
	const (
		uidMounted = "cccccccc-0000-4000-8000-0000000000a1"
		uidLoose   = "cccccccc-0000-4000-8000-0000000000a2" // after uidMounted: swept after it
	)
	leftover := func(uid string) string {
		aside := filepath.Join(scratch, "aside-"+uid)
		writeFiles(t, filepath.Join(aside, "model"), map[string][]byte{"w.bin": gen.Bytes(99, 1<<20)})
		return aside
	}
	mountedAside, looseAside := leftover(uidMounted), leftover(uidLoose)
	unmount = bindIntoPod(filepath.Join(mountedAside, "model"), "left-behind")
	for _, m := range []struct{ aside, uid string }{{mountedAside, uidMounted}, {looseAside, uidLoose}} {
		if err := os.Rename(m.aside, filepath.Join(scratch, m.uid)); err != nil {
			t.Fatal(err)
		}
	}
	wait("the sweep removes the copy nothing mounts", func() bool {
		_, err := os.Stat(filepath.Join(scratch, uidLoose))
		return errors.Is(err, os.ErrNotExist)
	})
	if _, err := os.Stat(filepath.Join(scratch, uidMounted, "model", "w.bin")); err != nil {
		t.Errorf("the sweep removed a copy a pod's volume still mounts: %v", err)
	}
	unmount()
	wait("the sweep removes the other once unmounted", func() bool {
		_, err := os.Stat(filepath.Join(scratch, uidMounted))
		return errors.Is(err, os.ErrNotExist)
	})
}

// A namespace's copies count in its per-node limit (namespaceQuotas[].maxBytesPerNode), with
// its caches: a pod whose copy would take the namespace past it is refused, naming the limit,
// and nothing is written for it; once the namespace's other copy is removed, it is made.
func TestScratchCopiesCountInTheNamespaceQuota(t *testing.T) {
	ctx, api := startAPI(t)
	a, kubelet, uids, status_, wait := noDiskNode(t, ctx, api, "node-n", 64<<20, map[string]int{"m1": 6, "m2": 6},
		func(o *agent.Options) {
			limit := resource.MustParse("10Mi")
			o.Config.NamespaceQuotas = []config.NamespaceQuota{{Namespaces: []string{"default"}, MaxBytesPerNode: &limit}}
		})
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mountReq := func(name string) agent.MountRequest {
		pod := csiPod("default", name, "node-n", uids[name])
		if err := api.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return agent.MountRequest{CacheUID: uids[name], PodNamespace: "default", PodName: name, PodUID: pod.UID}
	}
	first := mountWhenReady(t, ctx, a, mountReq("m1"), wait)
	if _, err := engine.CheckDest(first); err != nil {
		t.Fatalf("the first copy does not check: %v", err)
	}

	before := usedBytes(t, kubelet)
	second := mountReq("m2")
	err := mountRefused(t, ctx, a, second, wait)
	if status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "namespace default may hold 10.5 MB on this node (namespaceQuotas[0].maxBytesPerNode); its other caches and copies here hold 6.3 MB (a copy of default/m1 6.3 MB), and a copy of cache default/m2 for its pods needs 6.3 MB more") {
		t.Errorf("a copy past its namespace's per-node limit: %v; want ResourceExhausted naming the limit and the figures", err)
	}
	podEvent(t, ctx, api, "default", "m2", agent.EventCacheRefused, "namespaceQuotas[0].maxBytesPerNode")
	wait("the cache's report says why no copy is made", func() bool {
		return strings.Contains(status_(uids["m2"]).Message, "no copy for the node's pods either: namespace default may hold")
	})
	if after := usedBytes(t, kubelet); after != before {
		t.Errorf("the kubelet's filesystem went from %d to %d bytes used for a copy refused room", before, after)
	}
	if _, err := os.Stat(filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "scratch", uids["m2"])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a copy refused room left its directory: %v", err)
	}

	if err := api.Client.Delete(ctx, csiPod("default", "m1", "node-n", ""), client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	if dir := mountOnceThereIsRoom(t, ctx, a, second, wait); !strings.Contains(dir, uids["m2"]) {
		t.Errorf("the copy refused before mounts %s once the namespace's other copy is gone; want its copy", dir)
	}
}
