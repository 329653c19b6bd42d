package integration

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// A parent's eviction annotations reach its cache and then the nodes, bounded by what the
// operator configuration's quota grants its namespace: a priority above the grant is lowered to it, and a
// pin the namespace may not ask for is dropped; a namespace granted pins gets them.
func TestEvictionAnnotationsReachTheNodesWithinTheGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "evict-operator", "evict-a", "evict-b").with(func(cfg *controller.Config) {
		cfg.NamespaceQuotas = []config.NamespaceQuota{
			{Namespaces: []string{"evict-a"}, MaxPriority: 20, AllowPin: true, MaxBytesPerNode: resource.NewQuantity(1<<40, resource.BinarySI)},
			{Namespaces: []string{"*"}, MaxPriority: 5},
		}
	})
	upNode(t, ctx, "evict-node", "ml.g5.24xlarge")
	request := func(ns string) prewarmv1alpha1.CacheRequest {
		t.Helper()
		parent := builders.MakeInferenceEndpointConfig(ns, "example-model").Obj()
		parent.Annotations = map[string]string{config.PriorityAnnotation: "50", config.PinnedAnnotation: "true"}
		if err := c.Create(ctx, parent); err != nil {
			t.Fatal(err)
		}
		rc.endpoint(t, ctx, client.ObjectKeyFromObject(parent))
		caches := &inferencev1.ModelDataCacheConfigList{}
		if err := c.List(ctx, caches, client.InNamespace(ns)); err != nil || len(caches.Items) != 1 {
			t.Fatalf("the parent's caches: %d, %v", len(caches.Items), err)
		}
		m := &caches.Items[0]
		if m.Annotations[config.PriorityAnnotation] != "50" || m.Annotations[config.PinnedAnnotation] != "true" {
			t.Errorf("the cache made for the parent carries %v; want the parent's eviction annotations", m.Annotations)
		}
		for range 2 { // the first pass adds the finalizer
			if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
				t.Fatal(err)
			}
		}
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: "evict-node"}, nc); err != nil {
			t.Fatal(err)
		}
		for _, r := range nc.Spec.Caches {
			if r.UID == string(m.UID) {
				return r
			}
		}
		t.Fatalf("the node was not asked for %s's cache: %+v", ns, nc.Spec.Caches)
		return prewarmv1alpha1.CacheRequest{}
	}
	if r := request("evict-a"); r.Priority != 20 || !r.Pinned {
		t.Errorf("evict-a's request: priority %d pinned %v; want 20 (its grant's most) and pinned", r.Priority, r.Pinned)
	}
	if r := request("evict-b"); r.Priority != 5 || r.Pinned {
		t.Errorf("evict-b's request: priority %d pinned %v; want 5 (its grant's most) and not pinned", r.Priority, r.Pinned)
	}
}
