package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
)

// A node the placement does not select becomes a target of a cache while pods of the cache's
// namespace there ask for it through prewarm's CSI volume (its agent reports their demand), so
// that they get their model; a demand from pods of another namespace makes nothing happen; when
// the pods are gone, the request is withdrawn. A pod naming the cache by name counts as one
// naming its UID, when the name gives the cache in the pod's namespace.
func TestPodsDemandMakesTheirNodeATarget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "dm-operator", "dm", "dm-other")
	const itype, otherType = "ml.dm-suite.xlarge", "ml.dm-other.xlarge"
	upNode(t, ctx, "dm-a", itype)
	upNode(t, ctx, "dm-x", otherType)
	m := servedCache(t, ctx, "dm", "served", itype)
	uid := string(m.UID)
	asked := func(node string) bool {
		t.Helper()
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			return false
		}
		return slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == uid })
	}
	demand := func(node string, d ...prewarmv1alpha1.CacheDemand) {
		t.Helper()
		reportCaches(t, ctx, node, &metav1.Time{Time: time.Now()})
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			t.Fatal(err)
		}
		nc.Status.Demands = d
		if err := c.Status().Update(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}

	got := rc.cache(t, ctx, m)
	if !asked("dm-a") || asked("dm-x") || got.Status.TargetNodes != 1 {
		t.Fatalf("before any demand: dm-a asked %v, dm-x asked %v, targets %d; want only dm-a", asked("dm-a"), asked("dm-x"), got.Status.TargetNodes)
	}
	// The agent of dm-x makes its NodeCache, with no spec, to report the demand.
	if err := agent.EnsureNodeCache(ctx, c, "dm-x"); err != nil {
		t.Fatal(err)
	}
	if err := agent.EnsureNodeCache(ctx, c, "dm-x"); err != nil {
		t.Fatalf("a second time: %v", err)
	}
	made := &prewarmv1alpha1.NodeCache{}
	if err := c.Get(ctx, types.NamespacedName{Name: "dm-x"}, made); err != nil || len(made.OwnerReferences) != 1 || made.OwnerReferences[0].Kind != "Node" {
		t.Errorf("the agent's NodeCache: %v, owners %+v; want it owned by its Node (it goes with the node)", err, made.OwnerReferences)
	}
	// An agent still running for a node that was deleted does not bring its NodeCache back.
	if err := agent.EnsureNodeCache(ctx, c, "dm-gone"); err == nil {
		t.Error("a NodeCache was made for a node that does not exist")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "dm-gone"}, &prewarmv1alpha1.NodeCache{}); !apierrors.IsNotFound(err) {
		t.Errorf("NodeCache of a node that does not exist: %v, want none", err)
	}

	// podWith makes a pod of ns bound to dm-x with prewarm's CSI volume of these attributes, as a
	// kubelet sees it; pod, one naming the cache's UID.
	podWith := func(ns, name string, attrs map[string]string) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
			NodeName: "dm-x", Containers: []corev1.Container{{Name: "w", Image: "x"}},
			Volumes: []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: prewarmv1alpha1.CSIDriverName, VolumeAttributes: attrs,
			}}}},
		}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod := func(ns, name string) *corev1.Pod {
		return podWith(ns, name, map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: uid})
	}

	// A demand no pod bears out (an agent's forged report) makes nothing happen.
	demand("dm-x", prewarmv1alpha1.CacheDemand{UID: uid, Namespace: "dm", Pods: 2})
	if rc.cache(t, ctx, m); asked("dm-x") {
		t.Error("a demand with no pod behind it made dm-x a target of the cache")
	}
	// Pods of another namespace there make nothing happen, whatever the agent says.
	other := pod("dm-other", "elsewhere")
	demand("dm-x", prewarmv1alpha1.CacheDemand{UID: uid, Namespace: "dm-other", Pods: 3})
	if rc.cache(t, ctx, m); asked("dm-x") {
		t.Error("pods of another namespace made dm-x a target of the cache")
	}
	demand("dm-x", prewarmv1alpha1.CacheDemand{UID: uid, Namespace: "dm", Pods: 2})
	if rc.cache(t, ctx, m); asked("dm-x") {
		t.Error("a pod of another namespace bore out a demand of the cache's namespace")
	}
	if err := c.Delete(ctx, other, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	// A pod of the cache's namespace there: the node is a target while it runs.
	mine := pod("dm", "pinned")
	if got = rc.cache(t, ctx, m); !asked("dm-x") || got.Status.TargetNodes != 2 {
		t.Errorf("a pod of the cache's namespace on dm-x: asked %v, targets %d; want dm-x asked, 2 targets", asked("dm-x"), got.Status.TargetNodes)
	}
	mine.Status.Phase = corev1.PodSucceeded
	if err := c.Status().Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if rc.cache(t, ctx, m); asked("dm-x") {
		t.Error("a finished pod kept dm-x a target")
	}
	demand("dm-x")
	if rc.cache(t, ctx, m); asked("dm-x") {
		t.Error("the request stayed on dm-x after its pods went")
	}

	// By name: a pod naming the cache by a ModelWeightsCacheConfig's name (here the view of the
	// parent's cache, of the cache's name, as prewarm writes it) bears the demand out as one
	// naming its UID, once the controller's own lookup of the name in the pod's namespace gives
	// this cache; a name that gives none there does not, whatever the agent reports.
	view := &inferencev1.ModelWeightsCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "dm", Name: m.Name, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: inferencev1.GroupVersion.String(), Kind: "ModelDataCacheConfig", Name: m.Name, UID: m.UID, Controller: ptr.To(true)}}},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{ModelSourceConfig: m.Spec.ModelSourceConfig},
	}
	if err := c.Create(ctx, view); err != nil {
		t.Fatal(err)
	}
	byName := func(ns, name, cache string) *corev1.Pod {
		return podWith(ns, name, map[string]string{prewarmv1alpha1.VolumeAttributeCache: cache})
	}
	demand("dm-x", prewarmv1alpha1.CacheDemand{UID: uid, Namespace: "dm", Pods: 1})
	stranger := byName("dm-other", "by-name-elsewhere", m.Name) // dm-other has no such cache
	wrong := byName("dm", "by-name-typo", m.Name+"-typo")
	if rc.cache(t, ctx, m); asked("dm-x") {
		t.Error("pods naming names that do not give this cache in their namespace made dm-x a target")
	}
	for _, p := range []*corev1.Pod{stranger, wrong} {
		if err := c.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	byName("dm", "by-name", m.Name)
	if got = rc.cache(t, ctx, m); !asked("dm-x") || got.Status.TargetNodes != 2 {
		t.Errorf("a pod of the cache's namespace naming it by name on dm-x: asked %v, targets %d; want dm-x asked, 2 targets", asked("dm-x"), got.Status.TargetNodes)
	}
}
