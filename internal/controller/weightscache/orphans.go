package weightscache

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// OrphanCollector withdraws, from each NodeCache, the requests of caches that no longer exist.
// A cache's own reconcile withdraws its requests before its finalizer goes, but it sees the
// NodeCaches through the informer: a request applied a moment before the deletion may not be in
// that view yet, and would then stay forever, with its files on the node. Judged per NodeCache,
// on every change of it, the requests converge whatever the interleaving.
type OrphanCollector struct {
	Client client.Client
	// APIReader confirms, past the informer, that a cache is gone before its request goes.
	APIReader client.Reader
	// Requests writes the withdrawals, with the caches' requests (nil: at once).
	Requests *Requests
}

// SetupWithManager registers the collector with mgr.
func (o *OrphanCollector) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodecache-orphans").
		For(&prewarmv1alpha1.NodeCache{}).
		Complete(o)
}

// Reconcile withdraws the NodeCache's requests whose cache is gone (or is another object of the
// same name now).
func (o *OrphanCollector) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	nc := &prewarmv1alpha1.NodeCache{}
	if err := o.Client.Get(ctx, req.NamespacedName, nc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	for _, e := range nc.Spec.Caches {
		gone, err := o.gone(ctx, e)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !gone {
			continue
		}
		ctrl.LoggerFrom(ctx).Info("withdrawing the request of a cache that no longer exists", "cache", e.Namespace+"/"+e.Name, "uid", e.UID)
		if _, err := o.Requests.Put(ctx, o.Client, []change{{node: nc.Name, uid: e.UID}}); err != nil {
			return ctrl.Result{}, fmt.Errorf("withdrawing cache %s from node %s: %w", e.UID, nc.Name, err)
		}
	}
	return ctrl.Result{}, nil
}

// gone reports whether the cache a request names no longer exists. The informer says so first;
// the API server confirms, so that a cache just created is never withdrawn.
func (o *OrphanCollector) gone(ctx context.Context, e prewarmv1alpha1.CacheRequest) (bool, error) {
	key := types.NamespacedName{Namespace: e.Namespace, Name: e.Name}
	m := &inferencev1.ModelDataCacheConfig{}
	if err := o.Client.Get(ctx, key, m); err == nil && string(m.UID) == e.UID {
		return false, nil
	} else if err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	err := o.APIReader.Get(ctx, key, m)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return string(m.UID) != e.UID, nil
}

var _ reconcile.Reconciler = &OrphanCollector{}
