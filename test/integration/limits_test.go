package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// A node already asked for the most caches a NodeCache holds is not asked for one more, and the
// cache says so for that node, with the reason and what to do, instead of failing in the
// controller's log: checked against the real API server and its maxItems.
func TestNodeCacheLimitIsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	ns := "limits"
	rc := newReconcilers(t, ctx, "limits-operator", ns)
	upNode(t, ctx, "limits-full", "ml.g5.24xlarge")
	upNode(t, ctx, "limits-free", "ml.g5.24xlarge")
	full := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "limits-full"}}
	for i := range prewarmv1alpha1.MaxCachesPerNode {
		full.Spec.Caches = append(full.Spec.Caches, prewarmv1alpha1.CacheRequest{
			UID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i), Namespace: "other", Name: fmt.Sprintf("c%d", i),
			Root:   inferencev1.DefaultWeightsCacheHostPath,
			Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "b", Prefix: fmt.Sprint(i)},
		})
	}
	if err := c.Create(ctx, full); err != nil {
		t.Fatal(err)
	}

	parent := testutil.MakeInferenceEndpointConfig(ns, "example-model").Obj()
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	m := testutil.MakeModelDataCacheConfig(ns, "example-model-cache")
	madeBy(m, parent)
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first pass adds the finalizer
		if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	byName := map[string]inferencev1.NodeCacheStatus{}
	for _, n := range m.Status.Nodes {
		byName[n.Name] = n
	}
	if n := byName["limits-full"]; n.State != inferencev1.CacheFailed || n.Reason != prewarmv1alpha1.ReasonNodeCacheFull || n.Message == "" {
		t.Errorf("the full node's entry: %+v; want Failed NodeCacheFull with a message", n)
	}
	if n := byName["limits-free"]; n.Reason == prewarmv1alpha1.ReasonNodeCacheFull {
		t.Errorf("the free node's entry: %+v", n)
	}
	nc := &prewarmv1alpha1.NodeCache{}
	if err := c.Get(ctx, types.NamespacedName{Name: "limits-free"}, nc); err != nil || len(nc.Spec.Caches) != 1 || nc.Spec.Caches[0].UID != string(m.UID) {
		t.Errorf("the free node's NodeCache: %+v, %v; want it asked for the cache", nc.Spec, err)
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "limits-full"}, nc); err != nil || len(nc.Spec.Caches) != prewarmv1alpha1.MaxCachesPerNode {
		t.Errorf("the full node's NodeCache has %d caches, %v", len(nc.Spec.Caches), err)
	}
}
