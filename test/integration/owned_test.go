package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller/secrets"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/controller/weightscache"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// Objects prewarm owns cannot be bent by hand into something else: an image cache's image and
// placement are immutable, a cache whose parent did not make it is asked of no node, sealed
// credentials go when their original does, and a parent never uses an image cache that holds another
// image.
func TestOperatorOwnedObjectsResistEdits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "owned-operator", "owned")
	cfg := rc.cfg
	upNode(t, ctx, "owned-node", "ml.trn1.32xlarge")
	reconcileCache := func(m *inferencev1.ModelDataCacheConfig) *inferencev1.ModelDataCacheConfig {
		t.Helper()
		return rc.cache(t, ctx, m)
	}
	asked := func() []string {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: "owned-node"}, nc); err != nil {
			return nil
		}
		var names []string
		for _, e := range nc.Spec.Caches {
			names = append(names, e.Name)
		}
		return names
	}

	t.Run("an image cache's image and placement cannot be changed", func(t *testing.T) {
		ic := builders.MakeInferenceImageCache(cfg.OperatorNamespace, "owned-iic")
		if err := c.Create(ctx, ic); err != nil {
			t.Fatal(err)
		}
		ic.Spec.Image = "registry.example/miner:latest"
		if err := c.Update(ctx, ic); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.image is immutable") {
			t.Errorf("image edit: %v; want refused as immutable", err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(ic), ic); err != nil {
			t.Fatal(err)
		}
		ic.Spec.Placement.InstanceTypes = []string{"ml.p5.48xlarge"}
		if err := c.Update(ctx, ic); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.placement is immutable") {
			t.Errorf("placement edit: %v; want refused as immutable", err)
		}
	})

	t.Run("a cache its parent did not make is asked of no node", func(t *testing.T) {
		parent := builders.MakeInferenceEndpointConfig("owned", "real").Obj()
		parent.Spec.InstanceType = "ml.trn1.32xlarge"
		if err := c.Create(ctx, parent); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name   string
			mutate func(*inferencev1.ModelDataCacheConfig)
			says   string
		}{
			{"no-parent", func(m *inferencev1.ModelDataCacheConfig) { m.Spec.ParentReference.Name = "nobody" }, "does not exist"},
			{"no-owner", func(m *inferencev1.ModelDataCacheConfig) {}, "did not make this cache"},
			{"other-uid", func(m *inferencev1.ModelDataCacheConfig) {
				m.OwnerReferences = []metav1.OwnerReference{{APIVersion: inferencev1.GroupVersion.String(), Kind: "InferenceEndpointConfig",
					Name: parent.Name, UID: parent.UID, Controller: ptr.To(true)}}
				m.Spec.ParentReference.UID = "00000000-0000-4000-8000-000000000000"
			}, "did not make this cache"},
		} {
			m := builders.MakeModelDataCacheConfig("owned", "forged-"+tc.name)
			m.Spec.ParentReference.Name, m.Spec.ParentReference.UID = parent.Name, string(parent.UID)
			m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.trn1.32xlarge"}}
			tc.mutate(m)
			if err := c.Create(ctx, m); err != nil {
				t.Fatal(err)
			}
			got := reconcileCache(m)
			cond := meta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady)
			if got.Status.State != inferencev1.CacheFailed || cond == nil || cond.Reason != inferencev1.ReasonParentNotFound || !strings.Contains(cond.Message, tc.says) {
				t.Errorf("%s: state %s, condition %+v; want Failed, ParentNotFound saying %q", tc.name, got.Status.State, cond, tc.says)
			}
			if names := asked(); len(names) != 0 {
				t.Errorf("%s: the node is asked for %v", tc.name, names)
			}
		}
		// The same cache, made by its parent, is served.
		m := builders.MakeModelDataCacheConfig("owned", "made-by-parent")
		madeBy(m, parent)
		m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.trn1.32xlarge"}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		reconcileCache(m)
		if names := asked(); len(names) != 1 || names[0] != "made-by-parent" {
			t.Errorf("the node is asked for %v; want only the cache its parent made", names)
		}
	})

	t.Run("sealed credentials go when their original does", func(t *testing.T) {
		key, err := credentials.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: "owned-node"}, nc); err != nil {
			t.Fatal(err)
		}
		nc.Status.CredentialsKey = key.Public()
		if err := c.Status().Update(ctx, nc); err != nil {
			t.Fatal(err)
		}
		parent := builders.MakeInferenceEndpointConfig("owned", "gated").HuggingFace("meta-llama/Llama-3.1-8B-Instruct", strings.Repeat("a", 40)).Obj()
		parent.Spec.InstanceType = "ml.trn1.32xlarge"
		parent.Spec.ModelSourceConfig.HuggingFaceModel.TokenSecretRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}, Key: "token"}
		if err := c.Create(ctx, parent); err != nil {
			t.Fatal(err)
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "owned", Name: "hf-token"}, Data: map[string][]byte{"token": []byte("hf_secret")}}
		if err := c.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
		m := builders.MakeModelDataCacheConfig("owned", "gated-cache")
		m.Spec.ModelSourceConfig = parent.Spec.ModelSourceConfig
		madeBy(m, parent)
		m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.trn1.32xlarge"}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		m = reconcileCache(m)
		sealed := func() *prewarmv1alpha1.SealedCredentials {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := c.Get(ctx, types.NamespacedName{Name: "owned-node"}, nc); err != nil {
				t.Fatal(err)
			}
			for _, e := range nc.Spec.Caches {
				if e.UID == string(m.UID) {
					return e.Credentials
				}
			}
			t.Fatal("the node is not asked for the gated cache")
			return nil
		}
		if got, err := key.Open("owned-node", string(m.UID), sealed()); err != nil || got.HFToken != "hf_secret" {
			t.Fatalf("the node's agent opens %+v, %v; want the parent's token", got, err)
		}
		// A rotated token is sealed again; the digest every agent can read names the Secret's
		// version, not the token (no offline guessing against it).
		first := sealed()
		if strings.Contains(first.Digest, "hf_secret") || first.Digest != credentials.Digest(key.Public(), secrets.SecretVersion(secret, "token")) {
			t.Errorf("the digest %s is not the Secret version's", first.Digest)
		}
		secret.Data["token"] = []byte("hf_rotated")
		if err := c.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		reconcileCache(m)
		if got, err := key.Open("owned-node", string(m.UID), sealed()); err != nil || got.HFToken != "hf_rotated" {
			t.Fatalf("after the rotation the node's agent opens %+v, %v; want the new token", got, err)
		}
		if err := c.Delete(ctx, secret); err != nil {
			t.Fatal(err)
		}
		reconcileCache(m)
		if s := sealed(); s != nil {
			t.Errorf("the token outlives its deleted original, sealed in the node's request: %+v", s)
		}
		l := &corev1.SecretList{}
		if err := c.List(ctx, l, client.InNamespace(cfg.OperatorNamespace)); err != nil || len(l.Items) != 0 {
			t.Errorf("%d Secrets in the operator namespace (%v); want no copy of any credentials", len(l.Items), err)
		}
	})

	t.Run("a parent does not use an image cache that holds another image", func(t *testing.T) {
		parent := builders.MakeInferenceEndpointConfig("owned", "imaged").Obj()
		parent.Spec.InstanceType = "ml.p5.48xlarge"
		if err := c.Create(ctx, parent); err != nil {
			t.Fatal(err)
		}
		// An image cache of the very name this parent's image and placement give, made by hand
		// with another image.
		name := serving.ImageCacheName(parent.Spec.Worker.Image, placement.FromParent(parent.Spec.InstanceType, nil, nil, nil), "")
		squat := builders.MakeInferenceImageCache(cfg.OperatorNamespace, name)
		squat.Spec.Image = "registry.example/miner:latest"
		squat.Spec.Placement = placement.FromParent(parent.Spec.InstanceType, nil, nil, nil)
		if err := c.Create(ctx, squat); err != nil {
			t.Fatal(err)
		}
		rc.settle(t, ctx, "owned", func() error {
			_, err := rc.ep.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(parent)})
			return err
		})
		if err := c.Get(ctx, client.ObjectKeyFromObject(parent), parent); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(parent.Status.Conditions, inferencev1.ConditionImageCacheReady)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != inferencev1.ReasonImageCacheMismatch || !strings.Contains(cond.Message, "registry.example/miner:latest") {
			t.Errorf("ImageCacheReady = %+v; want False, ImageCacheMismatch naming the other image", cond)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(squat), squat); err != nil || len(squat.Spec.ParentReferences) != 0 {
			t.Errorf("the parent holds a reference to the other image's cache: %+v, %v", squat.Spec.ParentReferences, err)
		}
		dep := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(parent), dep); err != nil {
			t.Fatalf("the image cache holds the Deployment back: %v; parent conditions %+v", err, parent.Status.Conditions)
		}
		for _, ctr := range append(dep.Spec.Template.Spec.InitContainers, dep.Spec.Template.Spec.Containers...) {
			if ctr.Image == squat.Spec.Image {
				t.Errorf("the pods run the other image: %+v", ctr)
			}
		}
	})
}

// A cache that is gone while a NodeCache still asks for it (its own reconcile saw a stale view
// of the NodeCaches when its finalizer went) is withdrawn from the node by the orphan
// collector, and a cache that exists keeps its request.
func TestDeletedCachesAreWithdrawnWhateverTheInterleaving(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "orphans-operator", "orphans")
	upNode(t, ctx, "orphans-node", "ml.inf2.48xlarge")
	parent := builders.MakeInferenceEndpointConfig("orphans", "model").Obj()
	parent.Spec.InstanceType = "ml.inf2.48xlarge"
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	var caches []*inferencev1.ModelDataCacheConfig
	for _, name := range []string{"kept", "deleted"} {
		m := builders.MakeModelDataCacheConfig("orphans", name)
		madeBy(m, parent)
		m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.inf2.48xlarge"}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
				t.Fatal(err)
			}
		}
		caches = append(caches, m)
	}
	asked := func() []string {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: "orphans-node"}, nc); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range nc.Spec.Caches {
			names = append(names, e.Name)
		}
		slices.Sort(names)
		return names
	}
	if got := asked(); !slices.Equal(got, []string{"deleted", "kept"}) {
		t.Fatalf("the node is asked for %v", got)
	}
	// The interleaving of the race: the cache goes (its finalizer lifted on a stale view)
	// while the NodeCache still asks for it.
	gone := caches[1]
	if err := c.Get(ctx, client.ObjectKeyFromObject(gone), gone); err != nil {
		t.Fatal(err)
	}
	gone.Finalizers = nil
	if err := c.Update(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	collector := &weightscache.OrphanCollector{Client: c, APIReader: c}
	if _, err := collector.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "orphans-node"}}); err != nil {
		t.Fatal(err)
	}
	if got := asked(); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("after the collector the node is asked for %v; want only the cache that exists", got)
	}
}
