package secrets

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Bounds of the pull secrets copied from a namespace into the operator namespace for its image
// caches. A copy is made of what the tenant wrote, once per image cache of the namespace, and
// the controller keeps the operator namespace's Secrets in memory: the bounds keep what one
// namespace costs there small (at most 8 × 32 KiB per image cache).
const (
	// MaxPullSecrets is how many of the pull secrets a namespace's default service account
	// names are read and copied: the first 8. A docker config Secret can hold any number of
	// registries.
	MaxPullSecrets = 8
	// MaxPullSecretBytes is the most a copied pull secret may hold, its keys and values
	// together: 32 KiB, room for a docker config of a dozen registries (an ECR or GCR entry
	// takes about 3 KiB).
	MaxPullSecretBytes = 32 << 10
)

// PullSecrets are the pull secrets of a namespace, as its image caches use them.
type PullSecrets struct {
	// Usable are the Secrets that are copied: of a docker config type, within the bounds, in
	// the order the service account names them.
	Usable []*corev1.Secret
	// Refused says, for each Secret the service account names that is not copied, which and
	// why ("Secret team/x: ..."). A name whose Secret does not exist is skipped silently, as
	// the kubelet skips it.
	Refused []string
}

// pullSecretTypes are the Secret types the kubelet pulls with.
var pullSecretTypes = []corev1.SecretType{corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg}

// NamespacePullSecrets reads the pull secrets that namespace ns's default service account
// names (its pods pull with them), through r. Only Secrets of the kubelet's pull secret types
// (kubernetes.io/dockerconfigjson, kubernetes.io/dockercfg), of at most MaxPullSecretBytes, and
// only the first MaxPullSecrets names are used; the others are refused, each with why. A
// namespace without that service account has none.
func NamespacePullSecrets(ctx context.Context, r client.Reader, ns string) (PullSecrets, error) {
	var out PullSecrets
	sa := &corev1.ServiceAccount{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: "default"}, sa); err != nil {
		return out, client.IgnoreNotFound(err)
	}
	seen := map[string]bool{}
	var beyond []string // the names past MaxPullSecrets
	for _, ref := range sa.ImagePullSecrets {
		if ref.Name == "" || seen[ref.Name] {
			continue
		}
		seen[ref.Name] = true
		if len(seen) > MaxPullSecrets {
			beyond = append(beyond, ns+"/"+ref.Name)
			continue
		}
		s := &corev1.Secret{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, s); err != nil {
			if apierrors.IsNotFound(err) {
				continue // the kubelet would skip it too
			}
			return out, fmt.Errorf("reading pull secret %s/%s: %w", ns, ref.Name, err)
		}
		if why := refusal(s); why != "" {
			out.Refused = append(out.Refused, fmt.Sprintf("Secret %s/%s: %s", ns, ref.Name, why))
			continue
		}
		out.Usable = append(out.Usable, s)
	}
	if len(beyond) > 0 {
		shown := beyond[:min(len(beyond), 3)]
		more := ""
		if n := len(beyond) - len(shown); n > 0 {
			more = fmt.Sprintf(" and %d more", n)
		}
		out.Refused = append(out.Refused, fmt.Sprintf("Secret %s%s: the service account names %d pull secrets, and only the first %d are copied; put the registries in fewer Secrets (one docker config holds many)",
			strings.Join(shown, ", "), more, len(seen), MaxPullSecrets))
	}
	return out, nil
}

// refusal says why Secret s is not copied as a pull secret ("": it is).
func refusal(s *corev1.Secret) string {
	ok := false
	for _, t := range pullSecretTypes {
		ok = ok || s.Type == t
	}
	if !ok {
		return fmt.Sprintf("its type is %s, and only %s and %s Secrets are pull secrets; it is not copied", typeOf(s), corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg)
	}
	size := 0
	for k, v := range s.Data {
		size += len(k) + len(v)
	}
	if size > MaxPullSecretBytes {
		return fmt.Sprintf("it holds %d bytes, more than the %d a pull secret copied for image caches may; it is not copied (keep only the registries the namespace pulls from)", size, MaxPullSecretBytes)
	}
	return ""
}

func typeOf(s *corev1.Secret) corev1.SecretType {
	if s.Type == "" {
		return corev1.SecretTypeOpaque
	}
	return s.Type
}

// CopyName names the copy, for image cache cache, of pull secret name of namespace ns: the three
// names, shortened to fit, and a hash of all three, so that copies of different namespaces'
// Secrets never share a name (team's a-foo and team-a's foo), however long the names.
func CopyName(cache, ns, name string) string {
	sum := sha256.Sum256([]byte(cache + "/" + ns + "/" + name))
	hash := hex.EncodeToString(sum[:])[:16]
	base := cache + "-" + ns + "-" + name
	if room := 253 - len(hash) - 1; len(base) > room {
		base = base[:room]
	}
	return strings.TrimRight(base, "-.") + "-" + hash
}
