package weightscache

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// tokenSecretName is the copy of a cache's Hugging Face token in the operator namespace.
func tokenSecretName(m *inferencev1.ModelDataCacheConfig) string {
	return "prewarm-token-" + string(m.UID)
}

// copyToken copies the Hugging Face token a cache's source names into the operator namespace,
// where the agents may read it (they may read no Secret elsewhere), and returns the copy's
// name; or, when the token cannot be had, a problem for people.
func (r *Reconciler) copyToken(ctx context.Context, m *inferencev1.ModelDataCacheConfig) (string, string, error) {
	h := m.Spec.ModelSourceConfig.HuggingFaceModel
	if h == nil || h.TokenSecretRef == nil || r.APIReader == nil {
		return "", "", r.deleteToken(ctx, m) // a copy made for a reference since removed goes
	}
	key := h.TokenSecretRef.Key
	if key == "" {
		key = "token"
	}
	src := &corev1.Secret{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: h.TokenSecretRef.Name}, src)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && len(src.Data[key]) == 0):
		// The copy does not outlive what it copied.
		return "", fmt.Sprintf("Secret %s/%s (key %s), the Hugging Face token, is missing; the nodes download without it",
			m.Namespace, h.TokenSecretRef.Name, key), r.deleteToken(ctx, m)
	case err != nil:
		return "", "", err
	}
	name := tokenSecretName(m)
	return name, "", controller.PutSecret(ctx, r.Client, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Config.OperatorNamespace, Name: name,
			Labels:      map[string]string{controller.ManagedByLabel: controller.ManagedBy},
			Annotations: map[string]string{"prewarm.io/cache": m.Namespace + "/" + m.Name}},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"token": src.Data[key]},
	})
}

// deleteToken removes the cache's token copy.
func (r *Reconciler) deleteToken(ctx context.Context, m *inferencev1.ModelDataCacheConfig) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.Config.OperatorNamespace, Name: tokenSecretName(m)}}
	return client.IgnoreNotFound(r.Client.Delete(ctx, s))
}
