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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/secrets"
)

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// ImageCacheName names the image cache of an image on a placement, in the seed's style:
// iic-<image basename>-<instance type>-<hash>, e.g. iic-vllm-openai-ml-g5-24xlarge-0123456789abcdef;
// always a valid DNS label (at most 63 characters), whatever the image's length. namespace is
// the one namespace whose parents the cache serves, with its pull secrets ("" for a cache that
// pulls with no namespace's credentials, which every namespace shares). The hash, 64 bits of
// SHA-256 over the three, keeps one key's name out of another's reach: no one can choose an
// image or placement whose cache takes the name of another's.
func ImageCacheName(image string, p inferencev1.Placement, namespace string) string {
	return imageCacheName(image, p, namespace, 16)
}

// LegacyImageCacheName is the name earlier versions gave the shared cache of image on p, with a
// 16-bit hash: such a cache is adopted where it can serve (adoptable), or let go.
func LegacyImageCacheName(image string, p inferencev1.Placement) string {
	return imageCacheName(image, p, "", 4)
}

func imageCacheName(image string, p inferencev1.Placement, namespace string, hexDigits int) string {
	key := struct {
		Image     string
		Placement inferencev1.Placement
		Namespace string `json:",omitempty"`
	}{image, p, namespace}
	b, _ := json.Marshal(key)
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:])[:hexDigits]

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

// ensureImageCache returns the image cache for the parent's image and placement, created if
// missing, with the parent in its references, and the pull secrets of the parent's namespace
// that were not copied for it, each with why (for the parent to tell).
//
// An image that the namespace pulls with pull secrets gets a cache of the namespace's own,
// pulling with copies of exactly those secrets: another namespace never joins it, so no
// namespace has an image pulled with another's credentials, nor sees another's private image's
// status or digest. A namespace without pull secrets shares the cache of the image with every
// other such namespace: it pulls with no tenant's credentials (the image cache's pods pull
// Always, so that cache cannot start on an image a private cache left on the node).
func (r *Reconciler) ensureImageCache(ctx context.Context, m *model) (*inferencev1.InferenceImageCache, []string, error) {
	image, tenantNS := m.worker.Image, m.owner.GetNamespace()
	if ok, why := r.Config.ImageCaches.RegistryAllowed(image); !ok {
		return nil, nil, &problem{inferencev1.ReasonRegistryNotAllowed, why}
	}
	var pulls secrets.PullSecrets
	if r.APIReader != nil {
		var err error
		if pulls, err = secrets.NamespacePullSecrets(ctx, r.APIReader, tenantNS); err != nil {
			return nil, nil, err
		}
	}
	owner := "" // the namespace whose cache it is; "" shared
	if len(pulls.Usable) > 0 {
		owner = tenantNS
	}
	ref := inferencev1.ParentReference{Kind: m.kind, Namespace: tenantNS, Name: m.owner.GetName(), UID: m.uid()}
	c, name, err := r.findImageCache(ctx, m, owner)
	if err != nil {
		return nil, nil, err
	}
	if c == nil || !slices.ContainsFunc(c.Spec.ParentReferences, func(p inferencev1.ParentReference) bool { return p.UID == ref.UID }) {
		if err := r.checkImageQuota(ctx, m, name); err != nil {
			return nil, nil, err
		}
	}
	if c == nil {
		c = &inferencev1.InferenceImageCache{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.Config.OperatorNamespace, Name: name, Labels: map[string]string{controller.ManagedByLabel: controller.ManagedBy}},
			Spec:       inferencev1.InferenceImageCacheSpec{Image: image, Placement: m.placement, ParentReferences: []inferencev1.ParentReference{ref}},
		}
		if owner != "" {
			c.Labels[controller.SourceNamespaceLabel] = owner
		}
		if err := r.Client.Create(ctx, c); err != nil {
			return nil, nil, err
		}
	}
	var copies []corev1.LocalObjectReference
	if owner != "" {
		if copies, err = r.copyPullSecrets(ctx, c, owner, pulls.Usable); err != nil {
			return nil, nil, err
		}
	}
	err = r.updateImageCache(ctx, c, func(c *inferencev1.InferenceImageCache) (bool, error) {
		changed := false
		if !slices.ContainsFunc(c.Spec.ParentReferences, func(p inferencev1.ParentReference) bool { return p.UID == ref.UID }) {
			c.Spec.ParentReferences = append(c.Spec.ParentReferences, ref)
			changed = true
		}
		// A namespace's own cache pulls with exactly its pull secrets of now: one it no longer
		// names is let go, and the DaemonSet's pods, replaced, pull again with those left.
		if owner != "" && !equality.Semantic.DeepEqual(c.Spec.ImagePullSecrets, copies) {
			c.Spec.ImagePullSecrets = copies
			changed = true
		}
		return changed, nil
	})
	if err != nil {
		return nil, nil, err
	}
	if owner != "" {
		if err := r.dropPullSecretCopies(ctx, c, copies); err != nil {
			return nil, nil, err
		}
	}
	return c, pulls.Refused, nil
}

// findImageCache returns the image cache of the parent's image and placement for owner (the
// namespace whose cache it is; "" shared), or nil and the name to create it under. A cache made
// under the name earlier versions gave is used where it can serve as this one (adoptable).
func (r *Reconciler) findImageCache(ctx context.Context, m *model, owner string) (*inferencev1.InferenceImageCache, string, error) {
	ns, image := r.Config.OperatorNamespace, m.worker.Image
	name := ImageCacheName(image, m.placement, owner)
	c := &inferencev1.InferenceImageCache{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, c)
	switch {
	case err == nil:
		return c, name, usable(c, m, owner)
	case !apierrors.IsNotFound(err):
		return nil, name, err
	}
	legacy := &inferencev1.InferenceImageCache{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: LegacyImageCacheName(image, m.placement)}, legacy)
	switch {
	case apierrors.IsNotFound(err):
		return nil, name, nil
	case err != nil:
		return nil, name, err
	}
	ok, err := r.adoptable(ctx, legacy, m, owner)
	if !ok || err != nil {
		return nil, name, err
	}
	if owner != "" && legacy.Labels[controller.SourceNamespaceLabel] != owner {
		patch := client.MergeFrom(legacy.DeepCopy())
		if legacy.Labels == nil {
			legacy.Labels = map[string]string{}
		}
		legacy.Labels[controller.SourceNamespaceLabel] = owner
		if err := r.Client.Patch(ctx, legacy, patch); err != nil {
			return nil, name, err
		}
		ctrl.LoggerFrom(ctx).Info("adopted an image cache made under an earlier version's name as its namespace's own", "imageCache", legacy.Name, "namespace", owner)
	}
	return legacy, legacy.Name, nil
}

// usable says why the parent may not use image cache c of the name its key gives (nil: it may).
func usable(c *inferencev1.InferenceImageCache, m *model, owner string) error {
	switch {
	case !c.DeletionTimestamp.IsZero():
		return fmt.Errorf("image cache %s/%s is being deleted; waiting to create it anew", c.Namespace, c.Name)
	case c.Spec.Image != m.worker.Image || !equality.Semantic.DeepEqual(c.Spec.Placement, m.placement):
		// Not what this parent asked for (an object made by hand): the parent does not use it,
		// and says so.
		return &problem{inferencev1.ReasonImageCacheMismatch, fmt.Sprintf(
			"image cache %s/%s holds image %s for another placement or image, not %s: prewarm does not use it; delete it, and prewarm makes the cache this parent needs",
			c.Namespace, c.Name, c.Spec.Image, m.worker.Image)}
	case c.Labels[controller.SourceNamespaceLabel] != owner:
		// Made by hand for another namespace's credentials (or for none): not named here.
		return &problem{inferencev1.ReasonImageCacheMismatch, fmt.Sprintf(
			"image cache %s/%s holds image %s for another namespace's credentials than this parent's: prewarm does not use it; delete it, and prewarm makes the cache this parent needs",
			c.Namespace, c.Name, c.Spec.Image)}
	}
	return nil
}

// adoptable says whether legacy, an image cache made under an earlier version's name for the
// parent's image and placement, can serve as the cache of owner: a shared cache that pulls with
// no namespace's credentials, or one whose parents and pull secret copies are all owner's.
// Adopting it keeps its UID, and so its nodes' labels and the Deployments that prefer them; a
// cache that cannot serve is let go by its parents (releaseImageCaches) and goes with the last.
func (r *Reconciler) adoptable(ctx context.Context, legacy *inferencev1.InferenceImageCache, m *model, owner string) (bool, error) {
	if !legacy.DeletionTimestamp.IsZero() || legacy.Spec.Image != m.worker.Image || !equality.Semantic.DeepEqual(legacy.Spec.Placement, m.placement) {
		return false, nil
	}
	switch label := legacy.Labels[controller.SourceNamespaceLabel]; {
	case label != "":
		return label == owner, nil
	case owner == "":
		return len(legacy.Spec.ImagePullSecrets) == 0, nil
	}
	for _, p := range legacy.Spec.ParentReferences {
		if p.Namespace != owner {
			return false, nil
		}
	}
	if len(legacy.Spec.ImagePullSecrets) == 0 {
		return true, nil
	}
	if r.APIReader == nil {
		return false, nil
	}
	copies := &corev1.SecretList{}
	if err := r.APIReader.List(ctx, copies, client.InNamespace(legacy.Namespace), client.MatchingLabels{controller.ImageCacheLabel: legacy.Name}); err != nil {
		return false, err
	}
	theirs := map[string]bool{}
	for _, s := range copies.Items {
		if s.Labels[controller.SourceNamespaceLabel] != owner {
			return false, nil
		}
		theirs[s.Name] = true
	}
	for _, s := range legacy.Spec.ImagePullSecrets {
		if !theirs[s.Name] {
			return false, nil
		}
	}
	return true, nil
}

// checkImageQuota refuses the parent image cache name, which it is not in yet, when the parents
// of its namespace already use imageCaches.maxPerNamespace others. Caches in which the parent
// is its namespace's only one do not count: it is leaving them for this one.
func (r *Reconciler) checkImageQuota(ctx context.Context, m *model, name string) error {
	most := r.Config.ImageCaches.MaxPerNamespace
	if most <= 0 {
		most = config.DefaultImageCachesPerNamespace
	}
	list := &inferencev1.InferenceImageCacheList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.Config.OperatorNamespace)); err != nil {
		return err
	}
	ns := m.owner.GetNamespace()
	var used []string
	for _, c := range list.Items {
		if c.Name != name && slices.ContainsFunc(c.Spec.ParentReferences, func(p inferencev1.ParentReference) bool { return p.Namespace == ns && p.UID != m.uid() }) {
			used = append(used, c.Name)
		}
	}
	if len(used) < most {
		return nil
	}
	slices.Sort(used)
	return &problem{inferencev1.ReasonImageCacheQuotaExceeded, fmt.Sprintf(
		"namespace %s already uses %d image caches (%s), the most the operator configuration allows one namespace (imageCaches.maxPerNamespace: %d): image %s gets none here, and its pods pull it when they land; delete a parent or ModelImageCache of the namespace that uses another image, or ask the cluster admin to raise the limit",
		ns, len(used), controller.Summarize(used, 5), most, m.worker.Image)}
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

// dropPullSecretCopies deletes the pull secrets copied for c that it no longer pulls with: those
// of namespaces none of its parents is in any more (a tenant's registry credentials do not
// outlive its use of a cache), and, given keep (a namespace's own cache), every copy but those.
// It takes from c's spec the names of copies that are gone. Copies made before copies were
// labelled with their namespace are kept until the cache goes (they are owned by it).
func (r *Reconciler) dropPullSecretCopies(ctx context.Context, c *inferencev1.InferenceImageCache, keep ...[]corev1.LocalObjectReference) error {
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
		ns, labelled := s.Labels[controller.SourceNamespaceLabel]
		stale := labelled && !used[ns]
		if len(keep) > 0 {
			stale = !slices.ContainsFunc(keep[0], func(k corev1.LocalObjectReference) bool { return k.Name == s.Name })
		}
		if stale {
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

// copyPullSecrets copies pull secrets of namespace ns into the operator namespace, owned by
// image cache c, and returns their names there. The source Secrets are read through APIReader
// (not a cluster-wide watch of every Secret), and only those secrets.NamespacePullSecrets lets
// through.
func (r *Reconciler) copyPullSecrets(ctx context.Context, c *inferencev1.InferenceImageCache, ns string, pulls []*corev1.Secret) ([]corev1.LocalObjectReference, error) {
	var out []corev1.LocalObjectReference
	for _, src := range pulls {
		name := secrets.CopyName(c.Name, ns, src.Name)
		dst := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: name,
				Labels: map[string]string{controller.ManagedByLabel: controller.ManagedBy, controller.ImageCacheLabel: c.Name,
					controller.SourceNamespaceLabel: ns}},
			Type: src.Type, Data: src.Data,
		}
		if err := controllerutil.SetOwnerReference(c, dst, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := secrets.Put(ctx, r.Client, dst); err != nil {
			return nil, fmt.Errorf("copying pull secret %s/%s: %w", ns, src.Name, err)
		}
		out = append(out, corev1.LocalObjectReference{Name: name})
	}
	return out, nil
}

// refusedNote tells of the pull secrets not copied for an image cache ("": none).
func refusedNote(refused []string) string {
	if len(refused) == 0 {
		return ""
	}
	return "the image cache does not pull with " + strings.Join(refused, "; ")
}
