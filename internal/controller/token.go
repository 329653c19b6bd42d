package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// HFToken reads the Hugging Face token a tokenSecretRef names, in namespace ns, for repository
// repo. A nil ref, or an optional one whose Secret or key is not there, is no token. A required
// one that is not there gives missing, which says what is absent and what to do; err is a
// failure to read.
func HFToken(ctx context.Context, r client.Reader, ns, repo string, ref *corev1.SecretKeySelector) (token, missing string, err error) {
	if ref == nil {
		return "", "", nil
	}
	key := ref.Key
	if key == "" {
		key = "token"
	}
	sec := &corev1.Secret{}
	err = r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, sec)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return "", "", fmt.Errorf("reading Secret %s/%s: %w", ns, ref.Name, err)
	case len(sec.Data[key]) > 0:
		return string(sec.Data[key]), "", nil
	case ptr.Deref(ref.Optional, false):
		return "", "", nil
	case err != nil:
		return "", fmt.Sprintf("Secret %s/%s (key %s), the Hugging Face token for %s, does not exist; create it: kubectl -n %s create secret generic %s --from-literal=%s=hf_...",
			ns, ref.Name, key, repo, ns, ref.Name, key), nil
	}
	return "", fmt.Sprintf("Secret %s/%s has no key %s holding a Hugging Face token for %s", ns, ref.Name, key, repo), nil
}
