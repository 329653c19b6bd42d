// Package secrets reads the credentials the parents name in their namespaces (a Hugging Face
// token; the version of a Secret, which says when credentials change) and writes prewarm's
// copies of Secrets in the operator namespace.
package secrets

import (
	"context"
	"fmt"
	"strings"

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
func HFToken(ctx context.Context, r client.Reader, ns, repo string, ref *corev1.SecretKeySelector) (token SecretValue, missing string, err error) {
	if ref == nil {
		return SecretValue{}, "", nil
	}
	key := ref.Key
	if key == "" {
		key = "token"
	}
	sec := &corev1.Secret{}
	err = r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, sec)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return SecretValue{}, "", fmt.Errorf("reading Secret %s/%s: %w", ns, ref.Name, err)
	case len(sec.Data[key]) > 0:
		return SecretValue{Value: string(sec.Data[key]), Version: SecretVersion(sec, key)}, "", nil
	case ptr.Deref(ref.Optional, false):
		return SecretValue{}, "", nil
	case err != nil:
		return SecretValue{}, fmt.Sprintf("Secret %s/%s (key %s), the Hugging Face token for %s, does not exist; create it: kubectl -n %s create secret generic %s --from-literal=%s=hf_...",
			ns, ref.Name, key, repo, ns, ref.Name, key), nil
	}
	return SecretValue{}, fmt.Sprintf("Secret %s/%s has no key %s holding a Hugging Face token for %s", ns, ref.Name, key, repo), nil
}

// SecretValue is a value read from a Secret, with the version of the Secret it was read from.
type SecretValue struct {
	Value string
	// Version identifies where the value came from (SecretVersion), not what it is.
	Version string
}

// SecretVersion identifies the keys of one version of a Secret: its UID, its resourceVersion
// and the keys read. Any change of the Secret (a rotation, a recreation) changes it; it reveals
// nothing of the Secret's content, so that what is compared to decide whether credentials must
// be sealed again is no oracle for guessing them.
func SecretVersion(s *corev1.Secret, keys ...string) string {
	return string(s.UID) + "/" + s.ResourceVersion + "/" + strings.Join(keys, ",")
}
