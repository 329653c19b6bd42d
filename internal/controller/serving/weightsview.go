package serving

import (
	"cmp"
	"context"
	"errors"
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

// WeightsCacheReconciler reconciles HyperPod's ModelWeightsCacheConfig. One a user writes
// (standalone) is a parent with nothing to serve: it gets a ModelDataCacheConfig, named
// <name>-cache, that its nodes hold with the namespace's own credentials, and the status of that
// cache under HyperPod's field names. For every ModelDataCacheConfig of an InferenceEndpointConfig
// or JumpStartModel it writes a view: a ModelWeightsCacheConfig of the same name, owned by the
// cache, whose spec says what the cache holds and whose status follows the cache's.
type WeightsCacheReconciler struct {
	*Reconciler
	// CatalogName is the JumpStart catalog ConfigMap in the operator namespace.
	CatalogName string
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelweightscacheconfigs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelweightscacheconfigs/status;modelweightscacheconfigs/finalizers,verbs=get;update;patch

// SetupWithManager registers the reconciler with mgr.
func (r *WeightsCacheReconciler) SetupWithManager(mgr ctrl.Manager) error {
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
func (r *WeightsCacheReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	mw := &inferencev1.ModelWeightsCacheConfig{}
	err := r.Client.Get(ctx, req.NamespacedName, mw)
	switch {
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, r.ensureWeightsView(ctx, req.NamespacedName)
	case err != nil:
		return ctrl.Result{}, err
	}
	if owner := metav1.GetControllerOf(mw); owner != nil && owner.Kind == "ModelDataCacheConfig" {
		return ctrl.Result{}, r.syncWeightsView(ctx, mw, owner)
	}
	return r.reconcileStandaloneWeights(ctx, mw)
}

// ensureWeightsView creates the view of a parent's ModelDataCacheConfig named key, if there is
// such a cache.
func (r *WeightsCacheReconciler) ensureWeightsView(ctx context.Context, key types.NamespacedName) error {
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
func (r *WeightsCacheReconciler) syncWeightsView(ctx context.Context, mw *inferencev1.ModelWeightsCacheConfig, owner *metav1.OwnerReference) error {
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

// reconcileStandaloneWeights keeps a user's ModelWeightsCacheConfig's cache and status.
func (r *WeightsCacheReconciler) reconcileStandaloneWeights(ctx context.Context, mw *inferencev1.ModelWeightsCacheConfig) (ctrl.Result, error) {
	m := r.weightsModel(mw)
	owned, err := r.ownedCaches(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !mw.DeletionTimestamp.IsZero() || !ptr.Deref(mw.Spec.Enabled, true) {
		// Every node lets the cache go (each cache's own finalizer sees to it) before the
		// object does.
		for i := range owned {
			if err := r.Client.Delete(ctx, &owned[i]); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
		if !mw.DeletionTimestamp.IsZero() {
			if len(owned) > 0 {
				st := mw.Status.DeepCopy()
				st.State = string(inferencev1.CacheDeleting)
				st.Message = fmt.Sprintf("removing the cache from every node (%d cache objects left)", len(owned))
				return ctrl.Result{RequeueAfter: 2 * time.Second}, controller.WriteStatus(ctx, r.Client, mw, &mw.Status, *st)
			}
			return ctrl.Result{}, controller.RemoveFinalizer(ctx, r.Client, mw, inferencev1.ParentFinalizer)
		}
		return ctrl.Result{}, controller.WriteStatus(ctx, r.Client, mw, &mw.Status, failedWeights(mw, inferencev1.CachePending, inferencev1.ReasonCacheDisabled,
			"spec.enabled is false: the cache is on no node"))
	}
	if err := controller.AddFinalizer(ctx, r.Client, mw, inferencev1.ParentFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	p, err := r.resolveWeights(ctx, mw, m, owned)
	if err != nil {
		return ctrl.Result{}, err
	}
	if p != nil {
		return ctrl.Result{RequeueAfter: time.Minute}, controller.WriteStatus(ctx, r.Client, mw, &mw.Status, failedWeights(mw, inferencev1.CacheFailed, p.reason, p.message))
	}
	cache, err := r.ensureCache(ctx, m, owned)
	var named *problem
	switch {
	case errors.As(err, &named):
		return ctrl.Result{}, controller.WriteStatus(ctx, r.Client, mw, &mw.Status, failedWeights(mw, inferencev1.CacheFailed, named.reason, named.message))
	case err != nil:
		return ctrl.Result{}, err
	}
	// A cache of an earlier source or node directory goes: nothing reads it.
	for i := range owned {
		if old := &owned[i]; old.UID != cache.UID && old.DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, old); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
	}
	return ctrl.Result{}, controller.WriteStatus(ctx, r.Client, mw, &mw.Status, weightsStatusOf(cache, mw.Generation))
}

// weightsModel is what a standalone ModelWeightsCacheConfig asks, as a parent's model: its
// source, its node directory, and its nodes (its tolerations with the configuration's).
func (r *WeightsCacheReconciler) weightsModel(mw *inferencev1.ModelWeightsCacheConfig) *model {
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

// resolveWeights turns a JumpStart model into its source, checks the node directory, and pins a
// Hugging Face source's revision (with the namespace's token), as for a parent.
func (r *WeightsCacheReconciler) resolveWeights(ctx context.Context, mw *inferencev1.ModelWeightsCacheConfig, m *model, owned []inferencev1.ModelDataCacheConfig) (*problem, error) {
	if js := mw.Spec.JumpStartModel; js != nil {
		entry, p, err := r.lookupJumpStart(ctx, r.CatalogName, "spec.jumpStartModel", *js, instanceTypeOf(mw.Spec.NodeSelector), false)
		if err != nil || p != nil {
			return p, err
		}
		m.source = *entry.Source.DeepCopy()
	}
	if ok, why := r.Config.CacheRootAllowed(m.weights.HostPath); !ok {
		return &problem{inferencev1.ReasonHostPathNotAllowed, why + "; nothing is cached until spec.hostPath is an allowed root"}, nil
	}
	return r.resolveHF(ctx, m, owned), nil
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
