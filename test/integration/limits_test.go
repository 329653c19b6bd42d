package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
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

	parent := builders.MakeInferenceEndpointConfig(ns, "example-model").Obj()
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	m := builders.MakeModelDataCacheConfig(ns, "example-model-cache")
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

// A namespace whose caches already take its share of a node's cache slots is not asked for one
// more there, and its cache says so at once, naming the setting; another namespace's cache on
// the same node is asked.
func TestANamespacesShareOfANodesSlotsIsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "share-operator", "share-greedy", "share-other").with(func(cfg *controller.Config) {
		cfg.NamespaceQuotas = []config.NamespaceQuota{{Namespaces: []string{"share-greedy"}, MaxCachesPerNode: ptr.To[int32](2)}}
	})
	upNode(t, ctx, "share-node", "ml.g6e.2xlarge")
	held := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "share-node"}}
	for i := range 2 {
		held.Spec.Caches = append(held.Spec.Caches, prewarmv1alpha1.CacheRequest{
			UID: fmt.Sprintf("00000000-0000-4000-8000-%012d", 500+i), Namespace: "share-greedy", Name: fmt.Sprintf("c%d", i),
			Root:   inferencev1.DefaultWeightsCacheHostPath,
			Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "b", Prefix: fmt.Sprint(i)},
		})
	}
	if err := c.Create(ctx, held); err != nil {
		t.Fatal(err)
	}
	greedy := rc.cache(t, ctx, servedCache(t, ctx, "share-greedy", "third", "ml.g6e.2xlarge"))
	other := rc.cache(t, ctx, servedCache(t, ctx, "share-other", "first", "ml.g6e.2xlarge"))
	if len(greedy.Status.Nodes) != 1 || greedy.Status.Nodes[0].Reason != prewarmv1alpha1.ReasonNodeCacheFull ||
		!strings.Contains(greedy.Status.Nodes[0].Message, "namespaceQuotas[0].maxCachesPerNode") {
		t.Errorf("the greedy namespace's third cache: %+v; want NodeCacheFull naming its share's setting", greedy.Status.Nodes)
	}
	if r := requestOn(t, ctx, "share-node", string(other.UID)); r == nil {
		t.Error("the other namespace's cache was not asked of the node")
	}
	if r := requestOn(t, ctx, "share-node", string(greedy.UID)); r != nil {
		t.Errorf("the greedy namespace's third cache was asked: %+v", r)
	}
}

// A model source with a value longer than a node's request holds (HyperPod's schema caps none
// of these) is refused on its own object, naming the field and the limit: the parent deploys
// nothing and says InvalidSpec, its cache is Failed InvalidSpec and asked of no node, and
// another namespace's cache on the same node is asked as usual.
func TestValuesPastARequestsLimitsAreRefusedOnTheirObject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "long-operator", "long-careless", "long-other")
	upNode(t, ctx, "long-node", "ml.g6e.4xlarge")

	longID := "org/" + strings.Repeat("x", 296)
	parent := builders.MakeInferenceEndpointConfig("long-careless", "model").Obj()
	parent.Spec.InstanceType = "ml.g6e.4xlarge"
	parent.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceHuggingFace,
		HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: longID, CommitSHA: strings.Repeat("a", 40)}}
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	got := rc.endpoint(t, ctx, client.ObjectKeyFromObject(parent))
	ready := meta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady)
	if ready == nil || ready.Reason != inferencev1.ReasonInvalidSpec || !strings.Contains(ready.Message, "modelSourceConfig.huggingFaceModel.modelId is too long") ||
		!strings.Contains(ready.Message, "256") {
		t.Errorf("the parent's Ready condition: %+v; want InvalidSpec naming the field and its limit", ready)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "long-careless", Name: "model"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("the parent's Deployment: %v; want none", err)
	}

	// Its cache, as a standalone ModelWeightsCacheConfig or a hand-made parent would make it.
	m := builders.MakeModelDataCacheConfig("long-careless", "long-cache")
	madeBy(m, parent)
	m.Spec.ModelSourceConfig = parent.Spec.ModelSourceConfig
	m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.g6e.4xlarge"}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m = rc.cache(t, ctx, m)
	if m.Status.State != inferencev1.CacheFailed || !strings.Contains(fmt.Sprint(m.Status.Conditions), "modelSourceConfig.huggingFaceModel.modelId is too long") {
		t.Errorf("the cache: %s %+v; want Failed naming the field", m.Status.State, m.Status.Conditions)
	}
	if cond := meta.FindStatusCondition(m.Status.Conditions, inferencev1.ConditionReady); cond == nil || cond.Reason != inferencev1.ReasonInvalidSpec {
		t.Errorf("the cache's Ready condition: %+v; want InvalidSpec", cond)
	}
	other := rc.cache(t, ctx, servedCache(t, ctx, "long-other", "ok", "ml.g6e.4xlarge"))
	if r := requestOn(t, ctx, "long-node", string(other.UID)); r == nil {
		t.Error("the other namespace's cache was not asked of the node")
	}
	if r := requestOn(t, ctx, "long-node", string(m.UID)); r != nil {
		t.Errorf("the cache was asked of the node: %+v", r)
	}
}
