package cacheref_test

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/cacheref"
	"github.com/prewarm/prewarm/internal/scheme"
)

func controlledBy(kind, name string, uid types.UID) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: inferencev1.GroupVersion.String(), Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}}
}

func weights(ns, name string, uid types.UID, cacheName string, owners []metav1.OwnerReference) *inferencev1.ModelWeightsCacheConfig {
	return &inferencev1.ModelWeightsCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid, OwnerReferences: owners},
		Status:     inferencev1.ModelWeightsCacheConfigStatus{CacheName: cacheName},
	}
}

func cache(ns, name string, uid types.UID, owners []metav1.OwnerReference) *inferencev1.ModelDataCacheConfig {
	return &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid, OwnerReferences: owners}}
}

// A name means a cache only in the pod's own namespace, and only through objects that really
// own each other there: a standalone ModelWeightsCacheConfig's cache, or the parent's cache a
// view shows. Neither an owner reference nor a status written to point elsewhere leads to
// another namespace's cache, or to a cache of the namespace that the object does not own.
func TestResolve(t *testing.T) {
	disabled := weights("team-a", "off", "mw-off", "", nil)
	disabled.Spec.Enabled = ptr.To(false)
	objs := []client.Object{
		// team-a's standalone cache, and the cache it controls.
		weights("team-a", "llama", "mw-llama", "llama-cache", nil),
		cache("team-a", "llama-cache", "uid-llama", controlledBy("ModelWeightsCacheConfig", "llama", "mw-llama")),
		// A parent's cache and its view, of the same name.
		cache("team-a", "serve-cache", "uid-serve", controlledBy("InferenceEndpointConfig", "serve", "iec-serve")),
		weights("team-a", "serve-cache", "mw-view", "serve-cache", controlledBy("ModelDataCacheConfig", "serve-cache", "uid-serve")),
		// Made, but its cache not yet; and disabled.
		weights("team-a", "new", "mw-new", "", nil),
		disabled,
		// A status naming a cache it does not control (the parent's).
		weights("team-a", "claims", "mw-claims", "serve-cache", nil),
		// team-b's forged views: one at team-a's cache by name and UID, one at its own cache of
		// another UID, the UID of team-a's.
		weights("team-b", "forged", "mw-forged", "", controlledBy("ModelDataCacheConfig", "llama-cache", "uid-llama")),
		cache("team-b", "b-cache", "uid-b", nil),
		weights("team-b", "forged-uid", "mw-forged-uid", "", controlledBy("ModelDataCacheConfig", "b-cache", "uid-llama")),
	}
	r := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).WithStatusSubresource(&inferencev1.ModelWeightsCacheConfig{}).Build()
	for _, tc := range []struct {
		ns, name string
		uid      types.UID
		err      error
	}{
		{"team-a", "llama", "uid-llama", nil},
		{"team-a", "serve-cache", "uid-serve", nil},
		{"team-b", "llama", "", cacheref.ErrNotFound},
		{"team-b", "serve-cache", "", cacheref.ErrNotFound},
		{"team-a", "llama-cache", "", cacheref.ErrNotFound}, // a ModelDataCacheConfig's name alone is no ModelWeightsCacheConfig
		{"team-a", "new", "", cacheref.ErrNotReady},
		{"team-a", "off", "", cacheref.ErrNotReady},
		{"team-a", "claims", "", cacheref.ErrNotReady},
		{"team-b", "forged", "", cacheref.ErrNotReady},
		{"team-b", "forged-uid", "", cacheref.ErrNotReady},
		{"team-a", "../llama", "", cacheref.ErrInvalid},
		{"team-a", "", "", cacheref.ErrInvalid},
	} {
		_, uid, err := cacheref.Resolve(context.Background(), r, tc.ns, tc.name)
		if uid != tc.uid || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("%s in namespace %s: %q, %v; want %q, %v", tc.name, tc.ns, uid, err, tc.uid, tc.err)
		}
	}
}
