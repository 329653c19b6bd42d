// Package cacheref resolves the cache a pod's prewarm volume names by a stable name
// (volumeAttributes {cache: <name>}) to the ModelDataCacheConfig the nodes hold. The node agent
// resolves it to serve the pod; the controller resolves it again before it takes a node's word
// that a pod there asks for a cache. Both look only in the pod's own namespace.
package cacheref

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

var (
	// ErrInvalid: the name cannot be an object's name.
	ErrInvalid = errors.New("not a cache name")
	// ErrNotFound: the pod's namespace has no ModelWeightsCacheConfig of that name.
	ErrNotFound = errors.New("no such cache")
	// ErrNotReady: the ModelWeightsCacheConfig has no cache for the nodes to hold (yet, or while
	// it is disabled or being deleted).
	ErrNotReady = errors.New("no cache yet")
)

// Resolve returns the ModelDataCacheConfig (name and UID) that name means to a pod of namespace
// ns: the cache of the ModelWeightsCacheConfig ns/name. A user's standalone one's is the cache it
// controls (its status.cacheName); a view's, the parent's cache it shows (its controller, of the
// same name). Every object is read in ns and the ownership between the two checked, so that no
// name, owner reference or status a tenant writes leads to another namespace's cache.
func Resolve(ctx context.Context, r client.Reader, ns, name string) (types.NamespacedName, types.UID, error) {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return types.NamespacedName{}, "", fmt.Errorf("%w: %q is not a ModelWeightsCacheConfig name (%s)", ErrInvalid, name, strings.Join(errs, "; "))
	}
	mw := &inferencev1.ModelWeightsCacheConfig{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, mw); err != nil {
		if apierrors.IsNotFound(err) {
			return types.NamespacedName{}, "", fmt.Errorf("%w: namespace %s has no ModelWeightsCacheConfig %s; a pod mounts a cache by name only from its own namespace", ErrNotFound, ns, name)
		}
		return types.NamespacedName{}, "", fmt.Errorf("reading ModelWeightsCacheConfig %s/%s: %w", ns, name, err)
	}
	key := types.NamespacedName{Namespace: ns, Name: mw.Status.CacheName}
	owner := metav1.GetControllerOf(mw)
	view := owner != nil && owner.Kind == "ModelDataCacheConfig"
	switch {
	case view:
		key.Name = owner.Name
	case !mw.DeletionTimestamp.IsZero():
		return types.NamespacedName{}, "", fmt.Errorf("%w: ModelWeightsCacheConfig %s/%s is being deleted", ErrNotReady, ns, name)
	case !ptr.Deref(mw.Spec.Enabled, true):
		return types.NamespacedName{}, "", fmt.Errorf("%w: ModelWeightsCacheConfig %s/%s is disabled (spec.enabled: false), so no node holds it", ErrNotReady, ns, name)
	case key.Name == "":
		why := mw.Status.Message
		if why == "" {
			why = "the controller has not made its cache yet"
		}
		return types.NamespacedName{}, "", fmt.Errorf("%w: ModelWeightsCacheConfig %s/%s has no cache yet: %s", ErrNotReady, ns, name, why)
	}
	c := &inferencev1.ModelDataCacheConfig{}
	if err := r.Get(ctx, key, c); err != nil {
		if apierrors.IsNotFound(err) {
			return types.NamespacedName{}, "", fmt.Errorf("%w: the cache %s of ModelWeightsCacheConfig %s/%s is not there (yet)", ErrNotReady, key.Name, ns, name)
		}
		return types.NamespacedName{}, "", fmt.Errorf("reading ModelDataCacheConfig %s: %w", key, err)
	}
	if view && c.UID != owner.UID {
		return types.NamespacedName{}, "", fmt.Errorf("%w: ModelWeightsCacheConfig %s/%s shows a cache %s that is gone", ErrNotReady, ns, name, key.Name)
	}
	if ctl := metav1.GetControllerOf(c); !view && (ctl == nil || ctl.UID != mw.UID) {
		return types.NamespacedName{}, "", fmt.Errorf("%w: ModelDataCacheConfig %s is not ModelWeightsCacheConfig %s's cache", ErrNotReady, key, name)
	}
	return key, c.UID, nil
}
