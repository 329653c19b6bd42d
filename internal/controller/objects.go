package controller

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// WriteStatus sets obj's status (*status) to want and patches the status subresource, when it
// differs from what obj holds. An object gone meanwhile is not an error.
func WriteStatus[S any](ctx context.Context, c client.Client, obj client.Object, status *S, want S) error {
	if equality.Semantic.DeepEqual(*status, want) {
		return nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	*status = want
	return client.IgnoreNotFound(c.Status().Patch(ctx, obj, patch))
}

// AddFinalizer adds finalizer to obj with a patch, when it is missing. The patch carries obj's
// resourceVersion: a merge patch replaces the whole finalizer list, so a list another client
// changed since obj was read is not overwritten (the API server refuses it with a conflict, and
// the reconcile runs again on the new version).
func AddFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	if controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(obj, finalizer)
	return c.Patch(ctx, obj, patch)
}

// RemoveFinalizer removes finalizer from obj with a patch, when it is there, under obj's
// resourceVersion as AddFinalizer does. An object gone meanwhile is not an error.
func RemoveFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(obj, finalizer)
	return client.IgnoreNotFound(c.Patch(ctx, obj, patch))
}
