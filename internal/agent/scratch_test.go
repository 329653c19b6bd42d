package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
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

// A node whose cache root is on the kubelet's filesystem keeps no cache (NoLocalDisk, for the
// cache and for the root), yet its pod gets the model: a copy downloaded from the source under
// the kubelet's directory, verified, and removed once no pod of the node uses it.
func TestNoLocalDiskServesACopy(t *testing.T) {
	ctx, api := startAPI(t)
	host, kubelet := t.TempDir(), t.TempDir()
	root := "/opt/dlami/nvme"
	for _, d := range []string{filepath.Join(host, root), filepath.Join(kubelet, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
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
	cfg.CacheRoots = []config.CacheRoot{{Path: root}} // not allowed on the kubelet's filesystem
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
		!strings.Contains(nc.Status.Roots[0].Message, "same filesystem as the kubelet's directory") {
		t.Errorf("roots %+v; want the root NoLocalDisk, on the kubelet's filesystem", nc.Status.Roots)
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
