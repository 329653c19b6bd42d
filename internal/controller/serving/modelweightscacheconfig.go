package serving

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/text"
)

// Kinds of HyperPod's cache objects, as parent references name them.
const (
	KindModelWeightsCacheConfig = "ModelWeightsCacheConfig"
	KindModelImageCache         = "ModelImageCache"
)

// ModelWeightsCacheConfigReconciler reconciles HyperPod's ModelWeightsCacheConfig (a
// ModelDataCacheConfig, prewarm's own weights cache, is weightscache.Reconciler's). One a user
// writes (standalone) is a parent with nothing to serve: it gets a ModelDataCacheConfig, named
// <name>-cache, that its nodes hold with the namespace's own credentials, and the status of that
// cache under HyperPod's field names. For every ModelDataCacheConfig of an InferenceEndpointConfig
// or JumpStartModel it writes a view: a ModelWeightsCacheConfig of the same name, owned by the
// cache, whose spec says what the cache holds and whose status follows the cache's.
type ModelWeightsCacheConfigReconciler struct {
	*Reconciler
	// CatalogName is the JumpStart catalog ConfigMap in the operator namespace.
	CatalogName string
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelweightscacheconfigs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelweightscacheconfigs/status;modelweightscacheconfigs/finalizers,verbs=get;update;patch

// SetupWithManager registers the reconciler with mgr.
func (r *ModelWeightsCacheConfigReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("modelweightscacheconfig").
		// Not its own status writes: they change nothing the reconcile reads.
		For(&inferencev1.ModelWeightsCacheConfig{}, builder.WithPredicates(ownChanges)).
		// A cache's status moves with every node's progress: its view follows once a second.
		Watches(&inferencev1.ModelDataCacheConfig{}, controller.Coalesce(handler.EnqueueRequestsFromMapFunc(weightsViewOf), time.Second)).
		Complete(r)
}

// weightsViewOf maps a ModelDataCacheConfig to the ModelWeightsCacheConfig that shows it: the
// standalone one that controls it, or its view of the same name.
func weightsViewOf(_ context.Context, o client.Object) []reconcile.Request {
	c, ok := o.(*inferencev1.ModelDataCacheConfig)
	if !ok {
		return nil
	}
	if c.Spec.ParentReference.Kind == KindModelWeightsCacheConfig {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.ParentReference.Name}}}
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(c)}}
}

// Reconcile brings one ModelWeightsCacheConfig, standalone or a view, to what it should be.
func (r *ModelWeightsCacheConfigReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return reconcileParent(ctx, r.Reconciler, req, parentKind[*inferencev1.ModelWeightsCacheConfig, inferencev1.ModelWeightsCacheConfigStatus]{
		name: "modelweightscacheconfig", kind: KindModelWeightsCacheConfig,
		status: func(mw *inferencev1.ModelWeightsCacheConfig) *inferencev1.ModelWeightsCacheConfigStatus {
			return &mw.Status
		},
		model: func(_ context.Context, mw *inferencev1.ModelWeightsCacheConfig) (*model, *problem, error) {
			return r.weightsModel(mw), nil, nil
		},
		phases:   r.weightsPhases(),
		shown:    func(st *inferencev1.ModelWeightsCacheConfigStatus) []metav1.Condition { return st.Conditions },
		report:   weightsReport,
		finalize: r.releaseWeights,
		absent:   r.ensureWeightsView,
		viewOf:   "ModelDataCacheConfig",
		syncView: r.syncWeightsView,
	})
}

// ensureWeightsView creates the view of a parent's ModelDataCacheConfig named key, if there is
// such a cache.
func (r *ModelWeightsCacheConfigReconciler) ensureWeightsView(ctx context.Context, key types.NamespacedName) error {
	c := &inferencev1.ModelDataCacheConfig{}
	if err := r.Client.Get(ctx, key, c); err != nil {
		return client.IgnoreNotFound(err)
	}
	if c.Spec.ParentReference.Kind == KindModelWeightsCacheConfig || !c.DeletionTimestamp.IsZero() {
		return nil
	}
	mw := &inferencev1.ModelWeightsCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name},
		Spec:       weightsViewSpec(c),
	}
	if made, err := r.createView(ctx, c, mw); !made || err != nil {
		return err
	}
	return r.syncWeightsView(ctx, mw, metav1.GetControllerOf(mw))
}

// createView creates view, owned by cache, and reports whether it did: where an object of the
// view's kind and name exists (one a user wrote), the cache has no view, and kubectl prewarm
// status still shows it.
func (r *Reconciler) createView(ctx context.Context, cache, view client.Object) (bool, error) {
	view.SetLabels(map[string]string{controller.ManagedByLabel: controller.ManagedBy})
	if err := controllerutil.SetControllerReference(cache, view, r.Client.Scheme()); err != nil {
		return false, err
	}
	if err := r.Client.Create(ctx, view); err != nil {
		if apierrors.IsAlreadyExists(err) {
			ctrl.LoggerFrom(ctx).Info("not writing the view of a cache: its name is taken", "cache", cache.GetName())
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// weightsViewSpec is what a view of cache c says in HyperPod's fields: its source, its node
// directory and its placement's required affinity.
func weightsViewSpec(c *inferencev1.ModelDataCacheConfig) inferencev1.ModelWeightsCacheConfigSpec {
	spec := inferencev1.ModelWeightsCacheConfigSpec{
		Enabled:           ptr.To(true),
		HostPath:          c.Spec.HostPath,
		ModelSourceConfig: *c.Spec.ModelSourceConfig.DeepCopy(),
		Tolerations:       slices.Clone(c.Spec.Placement.Tolerations),
	}
	if spec.ModelSourceConfig.PrefetchEnabled == nil {
		spec.ModelSourceConfig.PrefetchEnabled = ptr.To(false)
	}
	spec.NodeSelector, spec.NodeAffinity = viewSelection(c.Spec.Placement)
	return spec
}

// viewSelection is a placement in HyperPod's fields: one instance type as a nodeSelector, more
// as a requirement of every required affinity term.
func viewSelection(p inferencev1.Placement) (map[string]string, *corev1.NodeAffinity) {
	var terms []corev1.NodeSelectorTerm
	if a := p.NodeAffinity; a != nil && a.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms = a.RequiredDuringSchedulingIgnoredDuringExecution.DeepCopy().NodeSelectorTerms
	}
	var selector map[string]string
	switch {
	case len(p.InstanceTypes) == 1:
		selector = map[string]string{corev1.LabelInstanceTypeStable: p.InstanceTypes[0]}
	case len(p.InstanceTypes) > 1:
		if len(terms) == 0 {
			terms = []corev1.NodeSelectorTerm{{}}
		}
		for i := range terms {
			terms[i].MatchExpressions = append(terms[i].MatchExpressions, corev1.NodeSelectorRequirement{
				Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpIn, Values: slices.Clone(p.InstanceTypes)})
		}
	}
	if len(terms) == 0 {
		return selector, nil
	}
	return selector, &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}
}

// syncWeightsView keeps a view's spec and status those of its cache.
func (r *ModelWeightsCacheConfigReconciler) syncWeightsView(ctx context.Context, mw *inferencev1.ModelWeightsCacheConfig, owner *metav1.OwnerReference) error {
	c := &inferencev1.ModelDataCacheConfig{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: mw.Namespace, Name: owner.Name}, c); err != nil {
		return client.IgnoreNotFound(err) // the garbage collector takes the view with its cache
	}
	if c.UID != owner.UID {
		return nil
	}
	if spec := weightsViewSpec(c); !equality.Semantic.DeepEqual(mw.Spec, spec) {
		// A view says what its cache holds: an edit of it is put back (the cache's parent is
		// what to edit).
		mw.Spec = spec
		if err := r.Client.Update(ctx, mw); err != nil {
			return err
		}
	}
	return controller.WriteStatus(ctx, r.Client, mw, &mw.Status, weightsStatusOf(c, mw.Generation))
}

// weightsPhases are the steps of a standalone ModelWeightsCacheConfig's reconcile, in order: its
// caches, whether it is on, its source (a JumpStart model's, its node directory, a pinned Hugging
// Face revision), its cache, and the caches of an earlier source. Its status is its cache's
// (weightsReport).
func (r *ModelWeightsCacheConfigReconciler) weightsPhases() []phase {
	return []phase{
		{r.enabledPhase, 0},
		{r.jumpStartPhase, time.Minute},
		{r.hostPathPhase, time.Minute},
		{r.pinPhase, time.Minute},
		{r.standaloneCachePhase, 0},
		{r.oldCachesPhase, 0},
	}
}

// enabledPhase reads the object's caches; one turned off (spec.enabled false) lets them all go,
// and one turned on keeps its finalizer, so that it outlives its cache on the nodes.
func (r *ModelWeightsCacheConfigReconciler) enabledPhase(ctx context.Context, s *state) error {
	owned, err := r.ownedCaches(ctx, s.m)
	if err != nil {
		return err
	}
	s.owned = owned
	mw := s.m.owner.(*inferencev1.ModelWeightsCacheConfig)
	if ptr.Deref(mw.Spec.Enabled, true) {
		return controller.AddFinalizer(ctx, r.Client, mw, inferencev1.ParentFinalizer)
	}
	if err := r.deleteCaches(ctx, owned); err != nil {
		return err
	}
	s.off = &problem{inferencev1.ReasonCacheDisabled, "spec.enabled is false: the cache is on no node"}
	s.hold = true
	return nil
}

// jumpStartPhase turns a JumpStart model into its source.
func (r *ModelWeightsCacheConfigReconciler) jumpStartPhase(ctx context.Context, s *state) error {
	mw := s.m.owner.(*inferencev1.ModelWeightsCacheConfig)
	js := mw.Spec.JumpStartModel
	if js == nil {
		return nil
	}
	entry, p, err := r.lookupJumpStart(ctx, r.CatalogName, "spec.jumpStartModel", *js, instanceTypeOf(mw.Spec.NodeSelector), false)
	switch {
	case err != nil:
		return err
	case p != nil:
		return p
	}
	s.m = s.m.withSource(*entry.Source.DeepCopy())
	return nil
}

// hostPathPhase refuses a node directory that is not an allowed cache root.
func (r *ModelWeightsCacheConfigReconciler) hostPathPhase(_ context.Context, s *state) error {
	if ok, why := r.Config.CacheRootAllowed(s.m.weights.HostPath); !ok {
		return &problem{inferencev1.ReasonHostPathNotAllowed, why + "; nothing is cached until spec.hostPath is an allowed root"}
	}
	return nil
}

// standaloneCachePhase keeps the cache of the object's source and node directory (s.use).
func (r *ModelWeightsCacheConfigReconciler) standaloneCachePhase(ctx context.Context, s *state) error {
	cache, err := r.ensureCache(ctx, s.m, s.owned)
	if err != nil {
		return err
	}
	s.use = cache
	return nil
}

// oldCachesPhase deletes a cache of an earlier source or node directory: nothing reads it.
func (r *ModelWeightsCacheConfigReconciler) oldCachesPhase(ctx context.Context, s *state) error {
	for i := range s.owned {
		old := &s.owned[i]
		if old.UID == s.use.UID || !old.DeletionTimestamp.IsZero() {
			continue
		}
		s.record(controller.EventOldCacheRemoved, "Delete",
			fmt.Sprintf("the source or node directory changed; removing weights cache %s from every node", old.Name))
		if err := r.Client.Delete(ctx, old); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// releaseWeights lets a standalone ModelWeightsCacheConfig that is being deleted go once every
// node has let its caches go (each cache's own finalizer sees to it); until then its status says
// how many are left.
func (r *ModelWeightsCacheConfigReconciler) releaseWeights(ctx context.Context, mw *inferencev1.ModelWeightsCacheConfig, s *state) (bool, error) {
	owned, err := r.ownedCaches(ctx, r.weightsModel(mw))
	if err != nil {
		return false, err
	}
	if err := r.deleteCaches(ctx, owned); err != nil {
		return false, err
	}
	if s.owned = owned; len(owned) > 0 {
		s.requeue(2 * time.Second)
		return false, nil
	}
	return true, controller.RemoveFinalizer(ctx, r.Client, mw, inferencev1.ParentFinalizer)
}

// deleteCaches deletes every cache of caches.
func (r *ModelWeightsCacheConfigReconciler) deleteCaches(ctx context.Context, caches []inferencev1.ModelDataCacheConfig) error {
	for i := range caches {
		if err := r.Client.Delete(ctx, &caches[i]); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// weightsReport is a standalone ModelWeightsCacheConfig's status once its phases have run: its
// cache's, or why it has none.
func weightsReport(mw *inferencev1.ModelWeightsCacheConfig, s *state) inferencev1.ModelWeightsCacheConfigStatus {
	switch {
	case !mw.DeletionTimestamp.IsZero():
		st := mw.Status.DeepCopy()
		st.State = string(inferencev1.CacheDeleting)
		st.Message = fmt.Sprintf("removing the cache from every node (%d cache objects left)", len(s.owned))
		return *st
	case s.problem != nil:
		return failedWeights(mw, inferencev1.CacheFailed, s.problem.reason, s.problem.message)
	case s.off != nil:
		return failedWeights(mw, inferencev1.CachePending, s.off.reason, s.off.message)
	case s.use != nil:
		return weightsStatusOf(s.use, mw.Generation)
	}
	return mw.Status // stopped by an error: as it was
}

// weightsModel is what a standalone ModelWeightsCacheConfig asks, as a parent's model: its
// source, its node directory, and its nodes (its tolerations with the configuration's).
func (r *ModelWeightsCacheConfigReconciler) weightsModel(mw *inferencev1.ModelWeightsCacheConfig) *model {
	s := &mw.Spec
	hostPath := cmp.Or(s.HostPath, inferencev1.DefaultWeightsCacheHostPath)
	p := placement.FromSelector(s.NodeSelector, s.NodeAffinity, nil)
	p.Tolerations = r.Config.Rules().Tolerations(s.Tolerations)
	return &model{
		owner: mw, kind: KindModelWeightsCacheConfig,
		source:    *s.ModelSourceConfig.DeepCopy(),
		weights:   &inferencev1.WeightsCacheConfig{Enabled: true, HostPath: hostPath},
		placement: p,
	}
}

// instanceTypeOf is the instance type a selector names, if it names one (a JumpStart spec's
// image and environment may depend on it).
func instanceTypeOf(selector map[string]string) string {
	return selector[corev1.LabelInstanceTypeStable]
}

// observedAt is a cache's conditions as a view of generation gen shows them: observed at gen
// when the cache has observed its own spec (current), else at no generation.
func observedAt(conds []metav1.Condition, current bool, gen int64) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range conds {
		c.ObservedGeneration = 0
		if current {
			c.ObservedGeneration = gen
		}
		out = append(out, c)
	}
	return out
}

// failedWeights is the status of a standalone cache that has no cache object to show.
func failedWeights(mw *inferencev1.ModelWeightsCacheConfig, state inferencev1.CacheState, reason, message string) inferencev1.ModelWeightsCacheConfigStatus {
	message = text.Clip(message, text.MaxConditionMessage)
	st := inferencev1.ModelWeightsCacheConfigStatus{State: string(state), Message: message, ObservedGeneration: mw.Generation,
		Conditions: slices.Clone(mw.Status.Conditions)}
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: inferencev1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: reason, Message: message, ObservedGeneration: mw.Generation})
	return st
}

// weightsStatusOf is cache c's status under HyperPod's field names, for an object of generation
// gen. Its conditions are the cache's, observed at gen once the cache has observed its own spec.
func weightsStatusOf(c *inferencev1.ModelDataCacheConfig, gen int64) inferencev1.ModelWeightsCacheConfigStatus {
	st := inferencev1.ModelWeightsCacheConfigStatus{
		State:       string(cmp.Or(c.Status.State, inferencev1.CachePending)),
		TargetNodes: c.Status.TargetNodes, ReadyNodes: c.Status.ReadyNodes,
		ObservedGeneration: gen, CacheName: c.Name,
		Message: fmt.Sprintf("weights cache %s has not reported yet", c.Name),
	}
	if !c.DeletionTimestamp.IsZero() {
		st.State = string(inferencev1.CacheDeleting)
	}
	st.Conditions = observedAt(c.Status.Conditions, c.Status.ObservedGeneration == c.Generation, gen)
	if ready := apimeta.FindStatusCondition(c.Status.Conditions, inferencev1.ConditionReady); ready != nil {
		st.Message = ready.Message
	}
	return st
}
