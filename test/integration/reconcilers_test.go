package integration

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/controller/weightscache"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/harness"
)

// reconcilers are the controller's reconcilers on the test API server, called directly (no
// manager, no informer cache), with operatorNS as the operator namespace.
type reconcilers struct {
	cfg controller.Config
	ep  *serving.Reconciler
	wc  *weightscache.Reconciler
}

// newReconcilers creates the operator namespace and namespaces, and the reconcilers.
func newReconcilers(t *testing.T, ctx context.Context, operatorNS string, namespaces ...string) *reconcilers {
	t.Helper()
	c := server.Client
	cfg := controller.Config{OperatorConfiguration: config.OperatorConfiguration{OperatorNamespace: operatorNS}}
	cfg.Defaults()
	// The test models' bucket is read with prewarm's own identity, for every namespace.
	cfg.SourceAccess = []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: "example-bucket"}}}
	for _, ns := range append([]string{operatorNS}, namespaces...) {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	return reconcilersFor(cfg)
}

// reconcilersFor returns the reconcilers of configuration cfg.
func reconcilersFor(cfg controller.Config) *reconcilers {
	c := server.Client
	return &reconcilers{
		cfg: cfg,
		ep:  &serving.Reconciler{Client: c, APIReader: c, Config: cfg, Now: time.Now},
		wc:  &weightscache.Reconciler{Client: harness.IndexedClient(c, append(weightscache.Indexes, controller.NodeIndexes...)...), APIReader: c, Config: cfg, Now: time.Now},
	}
}

// with is rc with the configuration changed.
func (rc *reconcilers) with(change func(*controller.Config)) *reconcilers {
	cfg := rc.cfg
	change(&cfg)
	return reconcilersFor(cfg)
}

// upNode creates a node of an instance type without the not-ready taint the API server puts on
// a new node: a node whose kubelet is up.
func upNode(t *testing.T, ctx context.Context, name, instanceType string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{inferencev1.InstanceTypeLabel: instanceType}}}
	if err := server.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if err := server.Client.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// madeBy makes m a cache that parent made: its reference and its controller owner.
func madeBy(m *inferencev1.ModelDataCacheConfig, parent *inferencev1.InferenceEndpointConfig) {
	m.Spec.ParentReference.Name, m.Spec.ParentReference.UID = parent.Name, string(parent.UID)
	m.Labels = map[string]string{controller.ParentUIDLabel: string(parent.UID)}
	m.OwnerReferences = []metav1.OwnerReference{{APIVersion: inferencev1.GroupVersion.String(), Kind: "InferenceEndpointConfig",
		Name: parent.Name, UID: parent.UID, Controller: ptr.To(true)}}
}

// servedCache creates an InferenceEndpointConfig ns/name of instanceType and the weights cache
// it would make (name-cache, placed on instanceType), and returns the cache as created.
func servedCache(t *testing.T, ctx context.Context, ns, name, instanceType string) *inferencev1.ModelDataCacheConfig {
	t.Helper()
	parent := builders.MakeInferenceEndpointConfig(ns, name).Obj()
	parent.Spec.InstanceType = instanceType
	if err := server.Client.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	m := builders.MakeModelDataCacheConfig(ns, name+"-cache")
	madeBy(m, parent)
	m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{instanceType}}
	if err := server.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// cache reconciles a weights cache twice (the first pass adds its finalizer) and returns it as
// stored.
func (rc *reconcilers) cache(t *testing.T, ctx context.Context, m *inferencev1.ModelDataCacheConfig) *inferencev1.ModelDataCacheConfig {
	t.Helper()
	for range 2 {
		if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
			t.Fatal(err)
		}
	}
	got := &inferencev1.ModelDataCacheConfig{}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// settle runs a parent's reconcile, then the weights cache reconciler on every cache of its
// namespace, four times: the finalizers, the cache, its status, the Deployment.
func (rc *reconcilers) settle(t *testing.T, ctx context.Context, ns string, reconcileParent func() error) {
	t.Helper()
	for range 4 {
		if err := reconcileParent(); err != nil {
			t.Fatalf("reconcile returned %v; want what blocks the parent in its status", err)
		}
		caches := &inferencev1.ModelDataCacheConfigList{}
		if err := server.Client.List(ctx, caches, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, m := range caches.Items {
			if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&m)}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// reportCaches writes a node's NodeCache status as its agent would: a heartbeat at stamp and
// these caches.
func reportCaches(t *testing.T, ctx context.Context, node string, stamp *metav1.Time, cs ...prewarmv1alpha1.CacheStatus) {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := server.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Status.HeartbeatTime = stamp
	nc.Status.Caches = cs
	if err := server.Client.Status().Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
}

// endpoint settles an InferenceEndpointConfig (see settle) and returns it as stored.
func (rc *reconcilers) endpoint(t *testing.T, ctx context.Context, key client.ObjectKey) *inferencev1.InferenceEndpointConfig {
	t.Helper()
	rc.settle(t, ctx, key.Namespace, func() error {
		_, err := rc.ep.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		return err
	})
	got := &inferencev1.InferenceEndpointConfig{}
	if err := server.Client.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	return got
}
