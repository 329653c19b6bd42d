package agent_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// The agent reports what its caches take on the node's disk, measured from the files: each
// cache's blocks (a copy set aside while pods mount it counts to its cache), prewarm's total
// under the root, and the filesystem's own used and capacity figures.
func TestAgentReportsWhatItsCachesTakeOnDisk(t *testing.T) {
	ctx, api := startAPI(t)
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	cacheRoot := filepath.Join(host, root, "prewarm")
	src := filepath.Join(host, "fsx", "model")
	files := map[string][]byte{"config.json": []byte(`{"a":1}`), "model.safetensors": gen.Bytes(11, 5<<20)}
	writeFiles(t, src, files)
	// Not a cache: under prewarm's directory, but not prewarm's.
	writeFiles(t, filepath.Join(cacheRoot, "not-a-cache"), map[string][]byte{"big": gen.Bytes(3, 2<<20)})

	askNode(t, ctx, api, "node-du",
		prewarmv1alpha1.CacheRequest{UID: uidNew, Namespace: "default", Name: "new", Root: root, Source: fsxSource("model")},
	)
	runAgent(t, ctx, api, "node-du", agent.Options{
		Config: testConfig(root), HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, ProgressInterval: 200 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status, wait := watchStatus(t, ctx, api, "node-du", uidNew)
	size := int64(len(files["config.json"]) + len(files["model.safetensors"]))
	wait("the cache Ready and measured", func() bool {
		st := status(uidNew)
		return st.State == inferencev1.CacheReady && st.DiskBytes >= size
	})
	// A copy set aside while a pod mounts it is the cache's too.
	aside := filepath.Join(cacheRoot, uidNew, ".model.prewarm-set-aside-1")
	writeFiles(t, aside, map[string][]byte{"model.safetensors": gen.Bytes(12, 4<<20)})
	wait("the copy set aside counted", func() bool { return status(uidNew).DiskBytes >= size+4<<20 })

	got := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-du"}, got); err != nil {
		t.Fatal(err)
	}
	disk := status(uidNew).DiskBytes
	// Blocks, not lengths: at least the bytes, and not more than a few blocks per file and
	// directory besides.
	if slack := int64(64 << 10); disk > size+4<<20+slack {
		t.Errorf("the cache takes %d bytes on disk by the report; its files are %d bytes (+%d set aside)", disk, size, 4<<20)
	}
	if len(got.Status.Roots) != 1 {
		t.Fatalf("roots %+v", got.Status.Roots)
	}
	r := got.Status.Roots[0]
	if r.CachedBytes != disk {
		t.Errorf("root %s: prewarm's bytes %d, want the one cache's %d (what is not a cache is not prewarm's)", r.Path, r.CachedBytes, disk)
	}
	if r.UsedBytes <= 0 || r.UsedBytes > r.CapacityBytes || r.FreeBytes > r.CapacityBytes-r.UsedBytes {
		t.Errorf("root %s: used %d, free %d, capacity %d: want 0 < used <= capacity and free <= capacity - used", r.Path, r.UsedBytes, r.FreeBytes, r.CapacityBytes)
	}
	if err := os.RemoveAll(aside); err != nil {
		t.Fatal(err)
	}
	wait("the copy set aside no longer counted", func() bool { return status(uidNew).DiskBytes < size+4<<20 })
}
