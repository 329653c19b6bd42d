package serving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/text"
)

// ModelImageCacheReconciler reconciles HyperPod's ModelImageCache (an InferenceImageCache, prewarm's
// own image cache, is imagecache.Reconciler's). One a user writes (standalone) is a parent of the shared InferenceImageCache of its image on its nodes, exactly as an
// InferenceEndpointConfig is: the image is pulled with the pull secrets of its namespace's
// default service account, and its status is that cache's under HyperPod's field names. For
// every InferenceImageCache an InferenceEndpointConfig or JumpStartModel uses it writes a view: a
// ModelImageCache of the same name in the operator namespace, owned by the cache.
type ModelImageCacheReconciler struct {
	*Reconciler
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelimagecaches,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelimagecaches/status;modelimagecaches/finalizers,verbs=get;update;patch

// SetupWithManager registers the reconciler with mgr.
func (r *ModelImageCacheReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("modelimagecache").
		// Not its own status writes: they change nothing the reconcile reads.
		For(&inferencev1.ModelImageCache{}, builder.WithPredicates(ownChanges)).
		Watches(&inferencev1.InferenceImageCache{}, controller.Coalesce(handler.EnqueueRequestsFromMapFunc(imageViewsOf), time.Second)).
		Complete(r)
}

// imageViewsOf maps an InferenceImageCache to the ModelImageCaches that show it: the standalone
// ones among its parents, and its view of the same name.
func imageViewsOf(_ context.Context, o client.Object) []reconcile.Request {
	c, ok := o.(*inferencev1.InferenceImageCache)
	if !ok {
		return nil
	}
	reqs := []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(c)}}
	for _, p := range c.Spec.ParentReferences {
		if p.Kind == KindModelImageCache {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
		}
	}
	return reqs
}

// Reconcile brings one ModelImageCache, standalone or a view, to what it should be.
func (r *ModelImageCacheReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return reconcileParent(ctx, r.Reconciler, req, parentKind[*inferencev1.ModelImageCache, inferencev1.ModelImageCacheStatus]{
		name: "modelimagecache", kind: KindModelImageCache,
		status: func(mic *inferencev1.ModelImageCache) *inferencev1.ModelImageCacheStatus { return &mic.Status },
		model: func(_ context.Context, mic *inferencev1.ModelImageCache) (*model, *problem, error) {
			_, bounded := r.imageNodes(mic)
			return &model{owner: mic, kind: KindModelImageCache, worker: inferencev1.Worker{Image: mic.Spec.Image}, placement: bounded.Placement, imageCache: true}, nil, nil
		},
		phases: r.imagePhases(),
		shown:  func(st *inferencev1.ModelImageCacheStatus) []metav1.Condition { return st.Conditions },
		report: r.imageReport,
		finalize: func(ctx context.Context, mic *inferencev1.ModelImageCache, _ *state) (bool, error) {
			if err := r.releaseImageCaches(ctx, string(mic.UID), ""); err != nil {
				return false, err
			}
			return true, controller.RemoveFinalizer(ctx, r.Client, mic, inferencev1.ParentFinalizer)
		},
		absent:   r.ensureImageView,
		viewOf:   "InferenceImageCache",
		syncView: r.syncImageView,
	})
}

// servesParents reports whether an image cache is used by an InferenceEndpointConfig or a
// JumpStartModel: those are the caches that get a view.
func servesParents(c *inferencev1.InferenceImageCache) bool {
	return slices.ContainsFunc(c.Spec.ParentReferences, func(p inferencev1.ParentReference) bool { return p.Kind != KindModelImageCache })
}

// ensureImageView creates the view of the image cache named key, if a parent uses one.
func (r *ModelImageCacheReconciler) ensureImageView(ctx context.Context, key types.NamespacedName) error {
	c := &inferencev1.InferenceImageCache{}
	if err := r.Client.Get(ctx, key, c); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !servesParents(c) || !c.DeletionTimestamp.IsZero() {
		return nil
	}
	mic := &inferencev1.ModelImageCache{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name},
		Spec:       imageViewSpec(c),
	}
	if made, err := r.createView(ctx, c, mic); !made || err != nil {
		return err
	}
	return r.syncImageView(ctx, mic, metav1.GetControllerOf(mic))
}

// imageViewSpec is what a view of cache c says in HyperPod's fields.
func imageViewSpec(c *inferencev1.InferenceImageCache) inferencev1.ModelImageCacheSpec {
	spec := inferencev1.ModelImageCacheSpec{Image: c.Spec.Image, Tolerations: slices.Clone(c.Spec.Placement.Tolerations)}
	spec.NodeSelector, spec.NodeAffinity = viewSelection(c.Spec.Placement)
	for _, p := range c.Spec.ParentReferences {
		spec.ParentReferences = append(spec.ParentReferences, inferencev1.ImageCacheParentReference(p))
	}
	return spec
}

// syncImageView keeps a view's spec and status those of its cache.
func (r *ModelImageCacheReconciler) syncImageView(ctx context.Context, mic *inferencev1.ModelImageCache, owner *metav1.OwnerReference) error {
	c := &inferencev1.InferenceImageCache{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: mic.Namespace, Name: owner.Name}, c); err != nil {
		return client.IgnoreNotFound(err)
	}
	if c.UID != owner.UID {
		return nil
	}
	if spec := imageViewSpec(c); !equality.Semantic.DeepEqual(mic.Spec, spec) {
		mic.Spec = spec
		if err := r.Client.Update(ctx, mic); err != nil {
			return err
		}
	}
	return controller.WriteStatus(ctx, r.Client, mic, &mic.Status, imageStatusOf(c, mic, r.Now()))
}

// imagePhases are the steps of a standalone ModelImageCache's reconcile, in order: its
// finalizer, its namespace's grant of nodes, the nodes the grant leaves out, and the shared image
// cache of its image on those nodes. Its status is that cache's (imageReport).
func (r *ModelImageCacheReconciler) imagePhases() []phase {
	return []phase{
		{r.finalizerPhase, 0},
		{r.grantPhase, 0},
		{r.leftOutPhase, 0},
		{r.sharedImagePhase, 0},
	}
}

// imageNodes are the nodes a standalone image cache asks for (p), and those within its
// namespace's grant. The image is pulled by prewarm's DaemonSet, not by pods of the namespace:
// on the nodes the operator configuration grants the namespace's standalone caches, with the
// tolerations it honours.
func (r *ModelImageCacheReconciler) imageNodes(mic *inferencev1.ModelImageCache) (inferencev1.Placement, placement.Bounded) {
	p := placement.FromSelector(mic.Spec.NodeSelector, mic.Spec.NodeAffinity, nil)
	p.Tolerations = r.Config.Rules().Tolerations(mic.Spec.Tolerations)
	return p, r.Config.Grant(mic.Namespace).Bound(p)
}

// finalizerPhase keeps the parent's finalizer: it outlives its references.
func (r *Reconciler) finalizerPhase(ctx context.Context, s *state) error {
	return controller.AddFinalizer(ctx, r.Client, s.m.owner, inferencev1.ParentFinalizer)
}

// grantPhase stops a standalone image cache whose namespace is granted no nodes; it lets go of
// its image cache.
func (r *ModelImageCacheReconciler) grantPhase(ctx context.Context, s *state) error {
	if why := r.Config.Grant(s.m.owner.GetNamespace()).Refusal(); why != "" {
		return r.dropImage(ctx, s, &problem{inferencev1.ReasonNodesNotGranted, why})
	}
	return nil
}

// leftOutPhase notes the nodes a standalone image cache asks for that its namespace's grant
// leaves out, and how the grant bounds it.
func (r *ModelImageCacheReconciler) leftOutPhase(ctx context.Context, s *state) error {
	p, bounded := r.imageNodes(s.m.owner.(*inferencev1.ModelImageCache))
	leftOut, err := r.leftOut(ctx, p, bounded)
	if err != nil {
		return err
	}
	s.notes = append(s.notes, leftOut, bounded.Note)
	return nil
}

// sharedImagePhase keeps the standalone image cache among the parents of the shared image cache
// of its image and nodes (s.image), and lets go of an earlier one.
func (r *ModelImageCacheReconciler) sharedImagePhase(ctx context.Context, s *state) error {
	ic, refused, err := r.ensureImageCache(ctx, s.m)
	var p *problem
	switch {
	case errors.As(err, &p):
		return r.dropImage(ctx, s, p)
	case err != nil:
		return err
	}
	// The image cache of an earlier image or placement lets this one go.
	if err := r.releaseImageCaches(ctx, s.m.uid(), ic.Name); err != nil {
		return err
	}
	s.image = ic
	if note := refusedNote(refused); note != "" {
		if !strings.Contains(s.m.owner.(*inferencev1.ModelImageCache).Status.Message, note) {
			s.events.Tell(corev1.EventTypeWarning, controller.EventPullSecretRefused, "CopyPullSecrets", note)
		}
		s.notes = append(s.notes, note)
	}
	return nil
}

// dropImage lets go of every image cache of a standalone one that p stops.
func (r *ModelImageCacheReconciler) dropImage(ctx context.Context, s *state, p *problem) error {
	if err := r.releaseImageCaches(ctx, s.m.uid(), ""); err != nil {
		return err
	}
	return p
}

// imageReport is a standalone ModelImageCache's status once its phases have run: its shared
// image cache's, with what the phases noted, or why it has none.
func (r *ModelImageCacheReconciler) imageReport(mic *inferencev1.ModelImageCache, s *state) inferencev1.ModelImageCacheStatus {
	switch {
	case s.problem != nil:
		return imageProblem(mic, s.problem, r.Now())
	case s.image == nil:
		return mic.Status // stopped by an error: as it was
	}
	st := imageStatusOf(s.image, mic, r.Now())
	for _, n := range s.notes {
		if n != "" {
			st.Message += "; " + n
		}
	}
	st.Message = text.Clip(st.Message, text.MaxConditionMessage)
	return st
}

// leftOut says which nodes a standalone image cache's own placement p would reach that its
// namespace's grant leaves out (b: p within the grant), and why ("": none).
func (r *ModelImageCacheReconciler) leftOut(ctx context.Context, p inferencev1.Placement, b placement.Bounded) (string, error) {
	rules := r.Config.Rules()
	nodes, err := controller.CandidateNodes(ctx, r.Client, nil, true)
	if err != nil {
		return "", err
	}
	var out placement.LeftOut
	for _, n := range nodes {
		if ok, _ := rules.Match(p, n); !ok {
			continue
		}
		if why := b.Excludes(n); why != "" {
			out.Add(why, n.Name)
		}
	}
	return out.Describe(placement.NotGrantedLead), nil
}

// imageProblem is the status of a standalone image cache that has no cache to show.
func imageProblem(mic *inferencev1.ModelImageCache, p *problem, now time.Time) inferencev1.ModelImageCacheStatus {
	msg := text.Clip(p.message, text.MaxConditionMessage)
	st := inferencev1.ModelImageCacheStatus{State: inferencev1.ModelImageFailed, Message: msg, ObservedGeneration: mic.Generation,
		LastTransitionTime: transitioned(mic.Status, inferencev1.ModelImageFailed, now), Conditions: slices.Clone(mic.Status.Conditions)}
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: inferencev1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: p.reason, Message: msg, ObservedGeneration: mic.Generation})
	return st
}

// imageState is an image cache's phase as HyperPod names its state: a cache that some nodes
// hold and others cannot pull is PartiallyReady.
func imageState(c *inferencev1.InferenceImageCache) inferencev1.ModelImageCacheState {
	st := &c.Status
	switch {
	case !c.DeletionTimestamp.IsZero() || st.Phase == inferencev1.ImageDeleting:
		return inferencev1.ModelImageDeleting
	case st.FailedNodes > 0 && st.CachedNodes > 0:
		return inferencev1.ModelImagePartiallyReady
	case st.Phase == inferencev1.ImageComplete:
		return inferencev1.ModelImageReady
	case st.Phase == inferencev1.ImageFailed:
		return inferencev1.ModelImageFailed
	case st.Phase == inferencev1.ImagePulling:
		return inferencev1.ModelImageDownloading
	}
	return inferencev1.ModelImagePending
}

// imageStatusOf is cache c's status under HyperPod's field names, for mic.
func imageStatusOf(c *inferencev1.InferenceImageCache, mic *inferencev1.ModelImageCache, now time.Time) inferencev1.ModelImageCacheStatus {
	state := imageState(c)
	st := inferencev1.ModelImageCacheStatus{
		State: state, TargetNodes: c.Status.TargetNodes, ReadyNodes: c.Status.CachedNodes, ResolvedDigest: c.Status.ImageDigest,
		ObservedGeneration: mic.Generation, CacheName: c.Name, LastTransitionTime: transitioned(mic.Status, state, now),
		Message: fmt.Sprintf("image cache %s/%s has not reported yet", c.Namespace, c.Name),
	}
	st.Conditions = observedAt(c.Status.Conditions, c.Status.ObservedGeneration == c.Generation, mic.Generation)
	if ready := apimeta.FindStatusCondition(c.Status.Conditions, inferencev1.ConditionReady); ready != nil {
		st.Message = ready.Message
	}
	return st
}

// transitioned is when the state became state: kept from the status while it stays.
func transitioned(prev inferencev1.ModelImageCacheStatus, state inferencev1.ModelImageCacheState, now time.Time) *metav1.Time {
	if prev.State == state && prev.LastTransitionTime != nil {
		return prev.LastTransitionTime
	}
	return &metav1.Time{Time: now.Truncate(time.Second)}
}
