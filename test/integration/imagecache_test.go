package integration

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/testutil"
)

// The image cache reconciler, called directly against the real API server: it holds its
// finalizer and a DaemonSet pinning the image while a live parent references it; a reference to
// a parent that is gone (or recreated with another UID) does not keep it; with no reference
// left it deletes itself, and its finalization removes the DaemonSet, the node labels and the
// finalizer.
func TestImageCacheLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "images-operator", "images")
	r := &imagecache.Reconciler{Client: c, Config: rc.cfg, Now: time.Now}
	upNode(t, ctx, "images-node", "ml.p4d.24xlarge")

	parent := testutil.MakeInferenceEndpointConfig("images", "served").Obj()
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	ic := testutil.MakeInferenceImageCache(rc.cfg.OperatorNamespace, "iic-images")
	ic.Spec.ParentReferences = []inferencev1.ParentReference{
		{Kind: "InferenceEndpointConfig", Namespace: "images", Name: "served", UID: string(parent.UID)},
		{Kind: "InferenceEndpointConfig", Namespace: "images", Name: "gone", UID: "00000000-0000-4000-8000-00000000000a"},
	}
	if err := c.Create(ctx, ic); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(ic)
	reconcile := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
	}
	reconcile()
	if err := c.Get(ctx, key, ic); err != nil {
		t.Fatal(err)
	}
	if len(ic.Finalizers) != 1 || ic.Finalizers[0] != inferencev1.CacheFinalizer {
		t.Errorf("finalizers %v; want the cache finalizer", ic.Finalizers)
	}
	if len(ic.Spec.ParentReferences) != 1 || ic.Spec.ParentReferences[0].Name != "served" {
		t.Errorf("references %+v; want only the live parent's", ic.Spec.ParentReferences)
	}
	ds := &appsv1.DaemonSet{}
	if err := c.Get(ctx, key, ds); err != nil {
		t.Fatalf("no DaemonSet pinning the image: %v", err)
	}
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != ic.Spec.Image {
		t.Errorf("the DaemonSet pulls %s, want %s", got, ic.Spec.Image)
	}

	// A label a node got for the image; the parent goes.
	node := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: "images-node"}, node); err != nil {
		t.Fatal(err)
	}
	node.Labels[inferencev1.ImageCacheReadyLabel(string(ic.UID))] = inferencev1.LabelTrue
	if err := c.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, parent); err != nil {
		t.Fatal(err)
	}
	reconcile() // no reference left: the cache deletes itself
	reconcile() // finalization
	if err := c.Get(ctx, key, ic); !apierrors.IsNotFound(err) {
		t.Errorf("the image cache of no parent remains: %+v, %v", ic.ObjectMeta, err)
	}
	if err := c.Get(ctx, key, ds); err == nil && ds.DeletionTimestamp.IsZero() {
		t.Error("its DaemonSet remains")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "images-node"}, node); err != nil {
		t.Fatal(err)
	}
	for k := range node.Labels {
		if k == inferencev1.ImageCacheReadyLabel(string(ic.UID)) {
			t.Errorf("the node keeps the image cache's label %s", k)
		}
	}
}
