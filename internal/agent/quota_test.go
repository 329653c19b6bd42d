package agent_test

import (
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// A namespace's quota caps what its caches hold together on one node: the cache that would take
// it past the limit writes nothing and fails BudgetExceeded with the figures, though the disk has
// room; another namespace's cache on the same disk is unaffected; a pod of the namespace on the
// node does not get the same bytes as a copy read from the source either: its mount is refused,
// naming the limit (with a CacheRefused event), and nothing is written on the kubelet's
// filesystem; and once another cache of the namespace leaves the node, the refused one is kept
// after all (woken then, long before its retry), and the pod mounts it.
func TestNamespaceQuotaCapsWhatANodeHolds(t *testing.T) {
	ctx, api := startAPI(t)
	host, root, disk := hostDisk(t, 200<<20)
	kubelet := t.TempDir()
	smallDisk(t, kubelet, 200<<20) // room for a copy: only the quota refuses it
	if err := os.MkdirAll(filepath.Join(kubelet, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	cacheRoot := filepath.Join(disk, prewarmv1alpha1.Directory)
	const (
		uidX = "bbbbbbbb-0000-4000-8000-00000000000a" // a's first
		uidY = "bbbbbbbb-0000-4000-8000-00000000000b" // a's second: past a's limit
		uidZ = "bbbbbbbb-0000-4000-8000-00000000000c" // b's
	)
	for i, name := range []string{"x", "y", "z"} {
		writeFiles(t, filepath.Join(host, "fsx", name), map[string][]byte{"config.json": []byte(`{}`), "w.bin": gen.Bytes(uint64(60+i), 25<<20)})
	}
	req := func(uid, ns, name string) prewarmv1alpha1.CacheRequest {
		return prewarmv1alpha1.CacheRequest{UID: uid, Namespace: ns, Name: name, Root: root, Source: fsxSource(name)}
	}
	askNode(t, ctx, api, "node-q", req(uidX, "a", "x"))

	cfg := testConfig(root)
	limit := resource.MustParse("40Mi")
	cfg.NamespaceQuotas = []config.NamespaceQuota{{Namespaces: []string{"a"}, MaxBytesPerNode: &limit}}
	a := runAgent(t, ctx, api, "node-q", agent.Options{
		Config: cfg, HostPrefix: host, KubeletDir: kubelet, MountWait: 300 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		// Far beyond the test: the refused cache is kept only because it is woken.
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Hour, EventInterval: time.Hour,
	})
	status_, wait := watchStatus(t, ctx, api, "node-q", uidX, uidY, uidZ)
	// What namespace a's caches take on the node stays within its limit throughout.
	var over atomic.Int64
	sample := func() {
		if n := dirBytes(filepath.Join(cacheRoot, uidX)) + dirBytes(filepath.Join(cacheRoot, uidY)); n > limit.Value() && over.Load() == 0 {
			over.Store(n)
		}
	}
	state := func(uid string, s inferencev1.CacheState, reason string) func() bool {
		return func() bool {
			sample()
			st := status_(uid)
			return st.State == s && (reason == "" || st.Reason == reason)
		}
	}
	wait("a/x Ready", state(uidX, inferencev1.CacheReady, ""))

	addRequests(t, ctx, api, "node-q", req(uidY, "a", "y"), req(uidZ, "b", "z"))
	wait("a/y BudgetExceeded", state(uidY, inferencev1.CacheFailed, prewarmv1alpha1.ReasonBudgetExceeded))
	wait("b/z Ready", state(uidZ, inferencev1.CacheReady, ""))
	msg := status_(uidY).Message
	for _, want := range []string{"namespace a may hold 41.9 MB on this node (namespaceQuotas[0].maxBytesPerNode)",
		"its other caches and copies here hold 26.2 MB (a/x 26.2 MB)", "this cache needs 26.2 MB more"} {
		if !strings.Contains(msg, want) {
			t.Errorf("a/y's status %q does not say %q", msg, want)
		}
	}
	_ = filepath.WalkDir(filepath.Join(cacheRoot, uidY), func(p string, d iofs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("a cache refused for its namespace's limit left %s", p)
		}
		return nil
	})

	// A pod of namespace a asks for y on the node: a copy of y would take a past its limit just
	// the same, so the pod waits, told why, and the kubelet's filesystem is left as it was.
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	before := usedBytes(t, kubelet)
	pod := csiPod("a", "worker", "node-q", uidY)
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	mount := agent.MountRequest{CacheUID: uidY, PodNamespace: "a", PodName: "worker", PodUID: pod.UID}
	err := mountRefused(t, ctx, a, mount, wait)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "nor a copy of it (BudgetExceeded): namespace a may hold 41.9 MB on this node (namespaceQuotas[0].maxBytesPerNode)") ||
		!strings.Contains(err.Error(), "this cache needs 26.2 MB more") {
		t.Errorf("a pod of a cache past its namespace's per-node limit: %v; want ResourceExhausted naming the limit and the figures", err)
	}
	podEvent(t, ctx, api, "a", "worker", agent.EventCacheRefused, "namespaceQuotas[0].maxBytesPerNode")
	if msg := status_(uidY).Message; !strings.Contains(msg, "nor copied for its pods on the node, which wait for room") {
		t.Errorf("a/y's status %q does not say its pods get no copy either", msg)
	}
	if after := usedBytes(t, kubelet); after != before {
		t.Errorf("the kubelet's filesystem went from %d to %d bytes used for a copy refused room", before, after)
	}
	if entries, _ := os.ReadDir(filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "scratch")); len(entries) > 0 {
		t.Errorf("a copy refused room left %s under the scratch directory", entries[0].Name())
	}

	// x leaves the node: y fits a's limit now, and is kept.
	nc := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-q"}, nc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nc.DeepCopy())
	nc.Spec.Caches = slices.DeleteFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == uidX })
	if err := api.Client.Patch(ctx, nc, patch); err != nil {
		t.Fatal(err)
	}
	wait("a/x removed", func() bool {
		_, err := os.Stat(filepath.Join(cacheRoot, uidX))
		return errors.Is(err, os.ErrNotExist)
	})
	wait("a/y Ready once a/x left", state(uidY, inferencev1.CacheReady, ""))
	if dir := mountWhenReady(t, ctx, a, mount, wait); dir != filepath.Join(cacheRoot, uidY, "model") {
		t.Errorf("the waiting pod mounts %s; want the cache itself", dir)
	}
	if st := status_(uidZ); st.State != inferencev1.CacheReady {
		t.Errorf("b/z is %s %s: %s", st.State, st.Reason, st.Message)
	}
	if n := over.Load(); n > 0 {
		t.Errorf("namespace a's caches were seen taking %d bytes on the node, past its %d-byte limit", n, limit.Value())
	}
}

// dirBytes is what the files under dir take on disk (0 when it is not there).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d iofs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += info.Size()
		}
		return nil
	})
	return n
}
