package agent_test

import (
	"context"
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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// standaloneCache makes a user's ModelWeightsCacheConfig ns/name and the ModelDataCacheConfig
// the controller would make for it (controlled by it, named in its status), and returns the
// cache's UID.
func standaloneCache(t *testing.T, ctx context.Context, c client.Client, ns, name string) string {
	t.Helper()
	mw := &inferencev1.ModelWeightsCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{ModelSourceConfig: inferencev1.ModelSourceConfig{
			ModelSourceType: inferencev1.ModelSourceS3, S3Storage: &inferencev1.S3Storage{BucketName: "example-bucket", Region: "us-west-2"},
			ModelLocation: "models/" + name,
		}},
	}
	if err := c.Create(ctx, mw); err != nil {
		t.Fatal(err)
	}
	m := builders.MakeModelDataCacheConfig(ns, name+"-cache")
	m.Spec.ParentReference = inferencev1.ParentReference{Kind: "ModelWeightsCacheConfig", Namespace: ns, Name: name, UID: string(mw.UID)}
	m.OwnerReferences = []metav1.OwnerReference{{APIVersion: inferencev1.GroupVersion.String(), Kind: "ModelWeightsCacheConfig", Name: name, UID: mw.UID, Controller: ptr.To(true)}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	mw.Status.CacheName = m.Name
	if err := c.Status().Update(ctx, mw); err != nil {
		t.Fatal(err)
	}
	return string(m.UID)
}

// byNamePod is a pod on node-1 whose prewarm volume names its cache by name.
func byNamePod(ns, name, cache string) *corev1.Pod {
	p := csiPod(ns, name, "node-1", "")
	p.Spec.Volumes[0].CSI.VolumeAttributes = map[string]string{prewarmv1alpha1.VolumeAttributeCache: cache}
	return p
}

// A volume that names its cache by name is served as one that names its UID, once the agent has
// looked the name up in the pod's namespace (the kubelet's word for it) against the real API
// server: a pod of the cache's namespace mounts the model; a pod of another namespace finds no
// cache of that name there and is refused with a Warning that says so; a name that cannot be an
// object's is refused. Pods naming a cache by name are the node's demand for that cache, counted
// by the namespace the name resolves in, and keep the cache they use from removal.
func TestCacheByName(t *testing.T) {
	ctx, api := startAPI(t)
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	writeFiles(t, filepath.Join(host, "fsx", "model"), map[string][]byte{"config.json": []byte(`{}`), "w.bin": gen.Bytes(5, 1<<20)})
	if err := os.MkdirAll(filepath.Join(host, root), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"a", "b"} {
		if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	uidLlama := standaloneCache(t, ctx, api.Client, "a", "llama")
	uidOther := standaloneCache(t, ctx, api.Client, "a", "other") // never asked of the node
	askNode(t, ctx, api, "node-1", prewarmv1alpha1.CacheRequest{UID: uidLlama, Namespace: "a", Name: "llama-cache", Root: root, Source: fsxSource("model")})
	a := runAgent(t, ctx, api, "node-1", agent.Options{
		Config: testConfig(root), HostPrefix: host, MountWait: 300 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second, EventInterval: time.Hour,
	})
	status_, wait := watchStatus(t, ctx, api, "node-1", uidLlama)
	wait("llama Ready", func() bool { return status_(uidLlama).State == inferencev1.CacheReady })
	pod := func(ns, name, cache string) agent.MountRequest {
		return agent.MountRequest{CacheName: cache, PodNamespace: ns, PodName: name, PodUID: types.UID("uid-" + ns + "-" + name)}
	}

	req, err := a.CacheByName(ctx, pod("a", "server", "llama"))
	if err != nil || req.CacheUID != uidLlama {
		t.Fatalf("llama for a pod of namespace a: %+v %v, want cache %s", req, err, uidLlama)
	}
	dir, err := a.ModelToMount(ctx, req)
	if want := filepath.Join(host, root, "prewarm", uidLlama, "model"); err != nil || dir != want {
		t.Fatalf("mounting llama by name: %q %v, want %s", dir, err, want)
	}
	a.Mounted(req, dir, "/target", nil)

	for _, tc := range []struct {
		req  agent.MountRequest
		code codes.Code
		says string
	}{
		{pod("b", "intruder", "llama"), codes.NotFound, "namespace b has no ModelWeightsCacheConfig llama; a pod mounts a cache by name only from its own namespace"},
		{pod("a", "typo", "lama"), codes.NotFound, "namespace a has no ModelWeightsCacheConfig lama"},
		{pod("a", "odd", "../llama"), codes.InvalidArgument, "is not a ModelWeightsCacheConfig name"},
		{pod("a", "raw", "llama-cache"), codes.NotFound, "has no ModelWeightsCacheConfig llama-cache"},
	} {
		got, err := a.CacheByName(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) || got.CacheUID != "" {
			t.Errorf("%s in namespace %s: %+v %v, want %s saying %q", tc.req.CacheName, tc.req.PodNamespace, got, err, tc.code, tc.says)
		}
	}
	// The pod of namespace b is told, as a Warning.
	err = testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		evs := &eventsv1.EventList{}
		if err := api.Client.List(ctx, evs, client.InNamespace("b")); err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "intruder" && e.Reason == agent.EventCacheRefused && e.Type == corev1.EventTypeWarning &&
				strings.Contains(e.Note, "mounts a cache by name only from its own namespace")
		}), nil
	})
	if err != nil {
		t.Errorf("no CacheRefused Warning on b/intruder: %v", err)
	}

	// Demands: pods naming caches by name count for the cache the name means in their own
	// namespace; b has no llama, so its pod demands nothing.
	for _, p := range []*corev1.Pod{
		byNamePod("a", "p1", "other"), byNamePod("a", "p2", "other"),
		byNamePod("a", "p3", "llama"), byNamePod("b", "p4", "llama"),
	} {
		if err := api.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	want := []prewarmv1alpha1.CacheDemand{{UID: uidLlama, Namespace: "a", Pods: 1}, {UID: uidOther, Namespace: "a", Pods: 2}}
	slices.SortFunc(want, func(x, y prewarmv1alpha1.CacheDemand) int { return strings.Compare(x.UID, y.UID) })
	var last []prewarmv1alpha1.CacheDemand
	err = testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		got := &prewarmv1alpha1.NodeCache{}
		if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-1"}, got); err != nil {
			return false, err
		}
		last = got.Status.Demands
		return slices.Equal(last, want), nil
	})
	if err != nil {
		t.Errorf("demands %+v (%v), want %+v", last, err, want)
	}

	// llama withdrawn from the node while a pod there names it by name: kept, InUse, until the
	// pod goes.
	nc := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-1"}, nc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nc.DeepCopy())
	nc.Spec.Caches = nil
	if err := api.Client.Patch(ctx, nc, patch); err != nil {
		t.Fatal(err)
	}
	wait("llama kept for the pod that names it", func() bool { return status_(uidLlama).Reason == prewarmv1alpha1.ReasonInUse })
	if _, err := os.Stat(filepath.Join(host, root, "prewarm", uidLlama)); err != nil {
		t.Errorf("the cache a pod names by name was removed: %v", err)
	}
	if err := api.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p3"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	wait("llama removed once no pod names it", func() bool {
		_, err := os.Stat(filepath.Join(host, root, "prewarm", uidLlama))
		return os.IsNotExist(err)
	})
}
