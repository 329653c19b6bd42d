package secrets

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Put creates want, or updates the Secret of that name to want's type and data when they
// differ. The controller keeps Secrets of the operator namespace in its cache, so the read is
// free; a Create that races the cache's view counts as done.
func Put(ctx context.Context, c client.Client, want *corev1.Secret) error {
	have := &corev1.Secret{}
	err := c.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	case err != nil:
		return err
	case have.Type == want.Type && equality.Semantic.DeepEqual(have.Data, want.Data) && hasLabels(have, want.Labels):
		return nil
	}
	have.Data = want.Data
	if have.Labels == nil {
		have.Labels = map[string]string{}
	}
	maps.Copy(have.Labels, want.Labels)
	return c.Update(ctx, have)
}

func hasLabels(o client.Object, labels map[string]string) bool {
	for k, v := range labels {
		if o.GetLabels()[k] != v {
			return false
		}
	}
	return true
}
