package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/scheme"
)

func TestTargetCheckAdmitsOnlyTheCachesNodes(t *testing.T) {
	var gets atomic.Int64
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(
		&prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
			Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{{UID: "cache-1"}}}},
		&prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "node-b"},
			Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{{UID: "cache-2"}}}},
	).WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		gets.Add(1)
		return c.Get(ctx, key, obj, opts...)
	}}).Build()
	tc := &TargetCheck{Reader: c}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for _, x := range []struct {
		who, uid string
		ok       bool
	}{
		{"node-a", "cache-1", true},
		{"node-b", "cache-1", false}, // an agent of another cache's node
		{"node-c", "cache-1", false}, // a node with no NodeCache
		{"system:serviceaccount:hyperpod-inference-system:prewarm-agent", "cache-1", false}, // bound to no node
		{"pod/prewarm-agent-x", "cache-1", false},
	} {
		if err := tc.Admit(r, x.who, x.uid); (err == nil) != x.ok {
			t.Errorf("Admit(%s, %s) = %v; want admitted %v", x.who, x.uid, err, x.ok)
		}
	}
	before := gets.Load()
	for range 20 {
		_ = tc.Admit(r, "node-a", "cache-1")
		_ = tc.Admit(r, "node-b", "cache-1")
	}
	if n := gets.Load() - before; n != 0 {
		t.Errorf("%d more reads for answers already known; want 0", n)
	}
}
