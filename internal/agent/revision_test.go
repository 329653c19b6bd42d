package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source/fs"
)

// A cache pinned to a content revision holds exactly that: after the source is rewritten under
// the same location, a node asked for the pinned revision downloads nothing and says the source
// changed, and a node holding another revision does not serve it.
func TestAgentHoldsOnlyThePinnedRevision(t *testing.T) {
	ctx, api := startAPI(t)
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	src := filepath.Join(host, "fsx", "model")
	writeFiles(t, src, map[string][]byte{"config.json": []byte(`{"a":1}`), "model.safetensors": gen.Bytes(9, 1<<20)})
	fsrc, err := fs.New(src)
	if err != nil {
		t.Fatal(err)
	}
	// The revision the first nodes downloaded.
	first, err := engine.New().Fetch(ctx, engine.Request{Source: fsrc, Dest: filepath.Join(t.TempDir(), "first")})
	if err != nil {
		t.Fatal(err)
	}
	pinned := first.Revision
	if !strings.HasPrefix(pinned, "sha256:") {
		t.Fatalf("content revision %q", pinned)
	}
	// The objects are rewritten under the same location.
	later := time.Now().Add(time.Minute)
	if err := os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"a":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(src, "config.json"), later, later); err != nil {
		t.Fatal(err)
	}
	// This node downloaded after the rewrite, before the cache was pinned.
	const uidStaleRev, uidPinned = "77777777-7777-4777-8777-777777777777", "88888888-8888-4888-8888-888888888888"
	if _, err := engine.New().Fetch(ctx, engine.Request{Source: fsrc, Dest: prewarmv1alpha1.ModelDir(filepath.Join(host, root), uidStaleRev)}); err != nil {
		t.Fatal(err)
	}
	pin := func(s prewarmv1alpha1.CacheSource) prewarmv1alpha1.CacheSource { s.Revision = pinned; return s }
	nc := &prewarmv1alpha1.NodeCache{
		ObjectMeta: metav1.ObjectMeta{Name: "node-rev"},
		Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{
			{UID: uidStaleRev, Namespace: "default", Name: "held", Root: root, Source: pin(fsxSource("model"))},
			{UID: uidPinned, Namespace: "default", Name: "new", Root: root, Source: pin(fsxSource("model"))},
		}},
	}
	if err := api.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	runAgent(t, ctx, api, "node-rev", agent.Options{
		Config: testConfig(root), HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status, wait := watchStatus(t, ctx, api, "node-rev", uidStaleRev, uidPinned)
	wait("both refuse the rewritten source", func() bool {
		return status(uidStaleRev).Reason == prewarmv1alpha1.ReasonSourceChanged && status(uidPinned).Reason == prewarmv1alpha1.ReasonSourceChanged &&
			status(uidStaleRev).State == inferencev1.CacheFailed && status(uidPinned).State == inferencev1.CacheFailed
	})
	if st := status(uidPinned); !strings.Contains(st.Message, pinned) || !prewarmv1alpha1.Terminal(st.Reason) {
		t.Errorf("the pinned cache: %+v; want a terminal SourceChanged naming the pinned revision", st)
	}
	if _, err := os.Stat(prewarmv1alpha1.ModelDir(filepath.Join(host, root), uidPinned)); !os.IsNotExist(err) {
		t.Errorf("the rewritten content was written for a cache pinned to another: %v", err)
	}

	// The controller pins a Ready cache to the revision it holds: the job takes the pin on
	// without starting again (its Ready state does not flap, and the node keeps its label).
	const uidReady = "99999999-9999-4999-8999-999999999999"
	if err := os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"a":3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Get(ctx, client.ObjectKeyFromObject(nc), nc); err != nil {
		t.Fatal(err)
	}
	nc.Spec.Caches = append(nc.Spec.Caches, prewarmv1alpha1.CacheRequest{UID: uidReady, Namespace: "default", Name: "ready", Root: root, Source: fsxSource("model")})
	if err := api.Client.Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
	status, wait = watchStatus(t, ctx, api, "node-rev", uidReady)
	wait("the unpinned cache is Ready", func() bool { return status(uidReady).State == inferencev1.CacheReady })
	readySince := status(uidReady).LastTransitionTime
	held := status(uidReady).Revision
	if err := api.Client.Get(ctx, client.ObjectKeyFromObject(nc), nc); err != nil {
		t.Fatal(err)
	}
	for i := range nc.Spec.Caches {
		if nc.Spec.Caches[i].UID == uidReady {
			nc.Spec.Caches[i].Source.Revision = held
		}
	}
	if err := api.Client.Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
	// Several re-checks later, still the same Ready.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if st := status(uidReady); st.State != inferencev1.CacheReady || !st.LastTransitionTime.Equal(readySince) {
			t.Fatalf("pinning a Ready cache to what it holds restarted it: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
