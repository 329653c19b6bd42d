package agent_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source/fs"
)

const (
	uidWarm    = "11111111-1111-4111-8111-111111111111"
	uidNew     = "22222222-2222-4222-8222-222222222222"
	uidStale   = "33333333-3333-4333-8333-333333333333"
	uidStale2  = "44444444-4444-4444-8444-444444444444"
	uidOutside = "55555555-5555-4555-8555-555555555555"
	uidDenied  = "66666666-6666-4666-8666-666666666666"
)

// The agent, against a real API server and real directories: on start it takes a whole cache
// on disk as Ready without reading its source; it downloads a new one; it removes cache
// directories nobody wants and leaves alone what is not a cache; it refuses a root that is not
// allowed without writing there; and a cache that stops being whole is noticed.
func TestAgent(t *testing.T) {
	ctx, api := startAPI(t)
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	cacheRoot := filepath.Join(host, root, "prewarm")
	// The model, on a "mounted FSx".
	src := filepath.Join(host, "fsx", "model")
	files := map[string][]byte{"config.json": []byte(`{"a":1}`), "model.safetensors": gen.Bytes(7, 3<<20)}
	writeFiles(t, src, files)
	// What the node held before the agent (re)started: a whole cache whose source is gone now
	// (in the earlier layout, the model's files directly in <root>/prewarm/<uid>: the agent moves
	// it into <uid>/model without fetching anything), two leftovers of removed caches, and
	// something that is not a cache.
	fsrc, err := fs.New(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.New().Fetch(ctx, engine.Request{Source: fsrc, Dest: filepath.Join(cacheRoot, uidWarm)}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{uidStale, "." + uidStale2 + ".prewarm-partial", "not-a-cache"} {
		if err := os.MkdirAll(filepath.Join(cacheRoot, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	askNode(t, ctx, api, "node-1",
		prewarmv1alpha1.CacheRequest{UID: uidWarm, Namespace: "default", Name: "warm", Root: root, Source: fsxSource("gone")},
		prewarmv1alpha1.CacheRequest{UID: uidNew, Namespace: "default", Name: "new", Root: root, Source: fsxSource("model")},
		prewarmv1alpha1.CacheRequest{UID: uidOutside, Namespace: "default", Name: "outside", Root: "/etc", Source: fsxSource("model")},
		// A namespace the configuration does not let name this file system.
		prewarmv1alpha1.CacheRequest{UID: uidDenied, Namespace: "other-team", Name: "denied", Root: root, Source: fsxSource("model")},
	)

	runAgent(t, ctx, api, "node-1", agent.Options{
		Config: testConfig(root), HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status, wait := watchStatus(t, ctx, api, "node-1", uidWarm, uidNew, uidOutside, uidDenied)

	wait("all four settled", func() bool {
		return status(uidWarm).State == inferencev1.CacheReady && status(uidNew).State == inferencev1.CacheReady &&
			status(uidOutside).State == inferencev1.CacheFailed && status(uidDenied).State == inferencev1.CacheFailed
	})
	if st := status(uidDenied); st.Reason != prewarmv1alpha1.ReasonSourceNotAllowed || !strings.Contains(st.Message, "namespace other-team") {
		t.Errorf("an FSx source of a namespace the configuration does not allow: %+v; want SourceNotAllowed naming the namespace", st)
	}
	if _, err := os.Stat(filepath.Join(cacheRoot, uidDenied)); !os.IsNotExist(err) {
		t.Errorf("the agent made a directory for a source it may not read: %v", err)
	}
	if st := status(uidWarm); st.BytesTotal != int64(len(files["config.json"])+len(files["model.safetensors"])) || st.Files != 2 {
		t.Errorf("the warm cache reports %+v, want 2 files and their size (taken from the manifest, its source being gone)", st)
	}
	if st := status(uidOutside); st.Reason != prewarmv1alpha1.ReasonHostPathNotAllowed {
		t.Errorf("a cache under /etc: %+v, want HostPathNotAllowed", st)
	}
	if _, err := os.Stat(filepath.Join(host, "etc")); !os.IsNotExist(err) {
		t.Errorf("the agent wrote under /etc: %v", err)
	}
	for p, data := range files {
		if got, err := os.ReadFile(filepath.Join(cacheRoot, uidNew, "model", p)); err != nil || string(got) != string(data) {
			t.Errorf("new cache %s differs from its source (%v)", p, err)
		}
		if got, err := os.ReadFile(filepath.Join(cacheRoot, uidWarm, "model", p)); err != nil || string(got) != string(data) {
			t.Errorf("the earlier layout's cache was not moved into place: %s (%v)", p, err)
		}
	}
	wait("leftovers removed, the rest kept", func() bool {
		entries, _ := os.ReadDir(cacheRoot)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return slices.Equal(sorted(names), sorted([]string{uidWarm, uidNew, "not-a-cache"}))
	})
	got := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-1"}, got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Roots) != 1 || got.Status.Roots[0].Path != root || got.Status.Roots[0].CapacityBytes <= 0 || got.Status.HeartbeatTime == nil {
		t.Errorf("roots %+v heartbeat %v; want the root's filesystem and a heartbeat", got.Status.Roots, got.Status.HeartbeatTime)
	}

	// A file of the warm cache is truncated: the re-check notices, and since its source is gone
	// the cache ends Failed, saying so, instead of Ready.
	if err := os.Truncate(filepath.Join(cacheRoot, uidWarm, "model", "model.safetensors"), 10); err != nil {
		t.Fatal(err)
	}
	wait("the damaged cache is no longer Ready", func() bool {
		st := status(uidWarm)
		return st.State == inferencev1.CacheFailed && st.Reason == prewarmv1alpha1.ReasonSourceNotFound
	})

	// A pod on the node mounts the warm cache. The NodeCache stops listing it: it stays while
	// the pod runs, and says why; then its directory goes, and so does its status entry.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "reader"},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "c", Image: "img"}},
			Volumes: []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: prewarmv1alpha1.CacheDir(root, uidWarm)},
			}}},
		},
	}
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(got.DeepCopy())
	got.Spec.Caches = got.Spec.Caches[1:2]
	if err := api.Client.Patch(ctx, got, patch); err != nil {
		t.Fatal(err)
	}
	wait("an unlisted cache kept while a pod uses it", func() bool {
		st := status(uidWarm)
		return st.Reason == prewarmv1alpha1.ReasonInUse && strings.Contains(st.Message, "default/reader")
	})
	if _, err := os.Stat(filepath.Join(cacheRoot, uidWarm, "model")); err != nil {
		t.Errorf("the cache a pod uses was removed: %v", err)
	}
	if err := api.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	wait("an unlisted cache removed", func() bool {
		_, err := os.Stat(filepath.Join(cacheRoot, uidWarm))
		return os.IsNotExist(err) && status(uidWarm).UID == "" && status(uidOutside).UID == "" && status(uidNew).State == inferencev1.CacheReady
	})
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// testFSx is the FSx file system the agent tests read, mounted at /fsx on the test "node".
const testFSx = "fs-0123456789abcdef0"

func fsxSource(path string) prewarmv1alpha1.CacheSource {
	return prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: testFSx, Path: path}
}

func testConfig(roots ...string) config.OperatorConfiguration {
	return config.OperatorConfiguration{Kind: config.Kind, CacheRoots: testutil.DirRoots(roots...), FSx: []config.FSxMount{{FileSystemID: testFSx, MountPath: "/fsx"}},
		SourceAccess: []config.SourceRule{{Namespaces: []string{"default", "a", "b", "c"}, FSx: &config.FSxRule{FileSystemID: testFSx}}},
		// The tests' roots and kubelet directories on this machine's disk are beside no kubelet;
		// those that test the kubelet's thresholds set their own.
		Agent: config.Agent{Kubelet: testutil.NoKubelet()}}
}
