package serving

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/secrets"
)

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// ImageCacheName names the shared image cache of an image on a placement, in the seed's style:
// iic-<image basename>-<instance type>-<hash>, e.g. iic-vllm-openai-ml-g5-24xlarge-a1b2; always
// a valid DNS label (at most 63 characters), whatever the image's length.
func ImageCacheName(image string, p inferencev1.Placement) string {
	key := struct {
		Image     string
		Placement inferencev1.Placement
	}{image, p}
	b, _ := json.Marshal(key)
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:])[:4]

	base := image
	if i := strings.Index(base, "@"); i >= 0 {
		base = base[:i]
	}
	if i := strings.LastIndex(base, "/"); i >= 0 {
		base = base[i+1:]
	}
	if i := strings.Index(base, ":"); i >= 0 {
		base = base[:i]
	}
	where := "any"
	switch {
	case len(p.InstanceTypes) == 1:
		where = p.InstanceTypes[0]
	case len(p.InstanceTypes) > 1:
		where = "multi"
	case p.NodeAffinity != nil:
		where = "affinity"
	}
	clean := func(s string) string { return strings.Trim(notDNS.ReplaceAllString(strings.ToLower(s), "-"), "-") }
	base, where = clean(base), clean(where)
	// iic- + base + - + where + - + hash <= 63
	room := 63 - len("iic-") - len(hash) - 2
	if len(where) > room/2 {
		where = strings.Trim(where[:room/2], "-")
	}
	if len(base) > room-len(where) {
		base = strings.Trim(base[:room-len(where)], "-")
	}
	parts := []string{"iic"}
	for _, s := range []string{base, where} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(append(parts, hash), "-")
}

// ensureImageCache returns the shared image cache for the parent's image and placement, created
// if missing, with the parent in its references and its pull secrets available.
func (r *Reconciler) ensureImageCache(ctx context.Context, m *model) (*inferencev1.InferenceImageCache, error) {
	ns := r.Config.OperatorNamespace
	name := ImageCacheName(m.worker.Image, m.placement)
	ref := inferencev1.ParentReference{Kind: m.kind, Namespace: m.owner.GetNamespace(), Name: m.owner.GetName(), UID: m.uid()}
	c := &inferencev1.InferenceImageCache{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, c)
	switch {
	case apierrors.IsNotFound(err):
		c = &inferencev1.InferenceImageCache{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{controller.ManagedByLabel: controller.ManagedBy}},
			Spec: inferencev1.InferenceImageCacheSpec{
				Image: m.worker.Image, Placement: m.placement, ParentReferences: []inferencev1.ParentReference{ref},
			},
		}
		if err := r.Client.Create(ctx, c); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case !c.DeletionTimestamp.IsZero():
		return nil, fmt.Errorf("image cache %s/%s is being deleted; waiting to create it anew", ns, name)
	case c.Spec.Image != m.worker.Image || !equality.Semantic.DeepEqual(c.Spec.Placement, m.placement):
		// Not what this parent asked for (an object made by hand, or a name collision): the
		// parent does not use it, and says so.
		return nil, &problem{inferencev1.ReasonImageCacheMismatch, fmt.Sprintf(
			"image cache %s/%s holds image %s for another placement or image, not %s: prewarm does not use it; delete it, and prewarm makes the cache this parent needs",
			ns, name, c.Spec.Image, m.worker.Image)}
	}
	secrets, err := r.copyPullSecrets(ctx, m, c)
	if err != nil {
		return nil, err
	}
	err = r.updateImageCache(ctx, c, func(c *inferencev1.InferenceImageCache) (bool, error) {
		changed := false
		if !slices.ContainsFunc(c.Spec.ParentReferences, func(p inferencev1.ParentReference) bool { return p.UID == ref.UID }) {
			c.Spec.ParentReferences = append(c.Spec.ParentReferences, ref)
			changed = true
		}
		for _, s := range secrets {
			if !slices.Contains(c.Spec.ImagePullSecrets, s) {
				c.Spec.ImagePullSecrets = append(c.Spec.ImagePullSecrets, s)
				changed = true
			}
		}
		return changed, nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// releaseImageCaches removes the parent from every image cache but keep (empty: all). The image
// cache reconciler deletes a cache that has no references left.
func (r *Reconciler) releaseImageCaches(ctx context.Context, uid, keep string) error {
	list := &inferencev1.InferenceImageCacheList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.Config.OperatorNamespace)); err != nil {
		return err
	}
	for i := range list.Items {
		c := &list.Items[i]
		if c.Name == keep {
			continue
		}
		err := r.updateImageCache(ctx, c, func(c *inferencev1.InferenceImageCache) (bool, error) {
			refs := slices.DeleteFunc(slices.Clone(c.Spec.ParentReferences), func(p inferencev1.ParentReference) bool { return p.UID == uid })
			if len(refs) == len(c.Spec.ParentReferences) {
				return false, nil
			}
			c.Spec.ParentReferences = refs
			return true, r.dropPullSecretCopies(ctx, c)
		})
		if client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// updateImageCache changes c with mutate and updates it, if mutate says it changed, with the
// resourceVersion read: parents that change a shared cache at once conflict, and the loser
// tries again instead of one parent's change being lost. It tries again at once, on the object
// read afresh from the API server: the informer's copy may still be the one that conflicted,
// and the reconcile's own backoff doubles with every conflict (parents created together that
// share an image cache would wait minutes).
func (r *Reconciler) updateImageCache(ctx context.Context, c *inferencev1.InferenceImageCache, mutate func(*inferencev1.InferenceImageCache) (bool, error)) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			if err := r.live().Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
				return err
			}
		}
		first = false
		changed, err := mutate(c)
		if err != nil || !changed {
			return err
		}
		return r.Client.Update(ctx, c)
	})
}

// dropPullSecretCopies deletes the pull secrets copied for c from namespaces none of its parents
// is in any more (a tenant's registry credentials do not outlive its use of a shared cache), and
// takes from c's spec the names of copies that are gone. Copies made before copies were labelled
// with their namespace are kept until the cache goes (they are owned by it).
func (r *Reconciler) dropPullSecretCopies(ctx context.Context, c *inferencev1.InferenceImageCache) error {
	if r.APIReader == nil {
		return nil
	}
	copies := &corev1.SecretList{}
	if err := r.APIReader.List(ctx, copies, client.InNamespace(c.Namespace), client.MatchingLabels{controller.ImageCacheLabel: c.Name}); err != nil {
		return err
	}
	used := map[string]bool{}
	for _, p := range c.Spec.ParentReferences {
		used[p.Namespace] = true
	}
	kept := map[string]bool{}
	for i := range copies.Items {
		s := &copies.Items[i]
		if ns, ok := s.Labels[controller.SourceNamespaceLabel]; ok && !used[ns] {
			if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting pull secret %s copied from namespace %s: %w", s.Name, ns, err)
			}
			continue
		}
		kept[s.Name] = true
	}
	c.Spec.ImagePullSecrets = slices.DeleteFunc(c.Spec.ImagePullSecrets, func(s corev1.LocalObjectReference) bool { return !kept[s.Name] })
	return nil
}

// copyPullSecrets copies the pull secrets of the parent's pods (its namespace's default service
// account) into the operator namespace, owned by the image cache, and returns their names there.
// The source Secrets are read through APIReader (not a cluster-wide watch of every Secret).
func (r *Reconciler) copyPullSecrets(ctx context.Context, m *model, c *inferencev1.InferenceImageCache) ([]corev1.LocalObjectReference, error) {
	if r.APIReader == nil {
		return nil, nil
	}
	sa := &corev1.ServiceAccount{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: m.owner.GetNamespace(), Name: "default"}, sa); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	var out []corev1.LocalObjectReference
	for _, ref := range sa.ImagePullSecrets {
		src := &corev1.Secret{}
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: m.owner.GetNamespace(), Name: ref.Name}, src); err != nil {
			if apierrors.IsNotFound(err) {
				continue // the kubelet would skip it too
			}
			return nil, err
		}
		name := truncate(fmt.Sprintf("%s-%s-%s", c.Name, m.owner.GetNamespace(), ref.Name), 253)
		dst := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: name,
				Labels: map[string]string{controller.ManagedByLabel: controller.ManagedBy, controller.ImageCacheLabel: c.Name,
					controller.SourceNamespaceLabel: m.owner.GetNamespace()}},
			Type: src.Type, Data: src.Data,
		}
		if err := controllerutil.SetOwnerReference(c, dst, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := secrets.Put(ctx, r.Client, dst); err != nil {
			return nil, fmt.Errorf("copying pull secret %s/%s: %w", m.owner.GetNamespace(), ref.Name, err)
		}
		out = append(out, corev1.LocalObjectReference{Name: name})
	}
	return out, nil
}
