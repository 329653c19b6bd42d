// Package imagecache reconciles InferenceImageCache: a DaemonSet that pulls and pins one image on
// every target node, per-node pull status, image-cache-ready node labels, and the cache's life
// by reference count (it goes when its last parent lets go).
package imagecache

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// Reconciler reconciles InferenceImageCache objects.
type Reconciler struct {
	Client client.Client
	Config controller.Config
	// Metrics records the caches' counts; nil records none.
	Metrics *controller.Metrics
	// Labels writes the nodes' ready labels, one patch per node for the changes of every
	// cache (nil: one patch per change).
	Labels *controller.Labeller
	Now    func() time.Time
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferenceimagecaches,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferenceimagecaches/status;inferenceimagecaches/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=jumpstartmodels,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelimagecaches,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,namespace=hyperpod-inference-system,resources=daemonsets,verbs=list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=pods,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=scheduling.k8s.io,resources=priorityclasses,verbs=get;list;watch

// SetupWithManager registers the reconciler with mgr, whose cache must have
// controller.NodeIndexes (controller.RegisterIndexes).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("imagecache").
		For(&inferencev1.InferenceImageCache{}).
		Owns(&appsv1.DaemonSet{}).
		// The DaemonSet's pods, gathered for a second: a fleet's pods starting cost one
		// reconcile (and status write) per second, not one each.
		Watches(&corev1.Pod{}, controller.Coalesce(handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			name, ok := o.GetLabels()[controller.ImageCacheLabel]
			if !ok || o.GetNamespace() != r.Config.OperatorNamespace {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
		}), time.Second)).
		Watches(&corev1.Node{}, controller.EnqueueAll(r.Client, func() client.ObjectList { return &inferencev1.InferenceImageCacheList{} }, nil),
			builder.WithPredicates(controller.NodePlacementChanged)).
		Complete(r)
}

// state is one reconcile of an image cache: the cache, what the phases read and decide, and
// the status they build.
type state struct {
	c *inferencev1.InferenceImageCache
	// gone ends the phases: no parent uses the cache any more, and it has been deleted.
	gone    bool
	ds      *appsv1.DaemonSet
	targets []*corev1.Node
	pods    []corev1.Pod
	status  inferencev1.InferenceImageCacheStatus
	// cached are the nodes that hold the image.
	cached map[string]bool
}

// phases are the steps of an image cache's reconcile, in order: its parents, its DaemonSet, its
// nodes and pods, its status, its labels.
func (r *Reconciler) phases() []func(context.Context, *state) error {
	return []func(context.Context, *state) error{r.parentsPhase, r.daemonSetPhase, r.readPhase, r.gatherPhase, r.labelPhase}
}

// Reconcile brings one image cache's DaemonSet, labels and status to what its spec asks, and
// removes it when no parent uses it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	err := r.reconcile(ctx, req)
	r.Metrics.ReconcileError("imagecache", err)
	return ctrl.Result{}, err // the cache's pods and nodes bring it back: nothing waits on time
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) error {
	c := &inferencev1.InferenceImageCache{}
	if err := r.Client.Get(ctx, req.NamespacedName, c); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, c)
	}
	if c.Namespace != r.Config.OperatorNamespace {
		// prewarm makes image caches in the operator namespace only, where its Role lets it
		// keep their DaemonSets; one written elsewhere gets none, and says so.
		return r.writeStatus(ctx, c, notInOperatorNamespace(c, r.Config.OperatorNamespace))
	}
	if err := controller.AddFinalizer(ctx, r.Client, c, inferencev1.CacheFinalizer); err != nil {
		return err
	}
	s := &state{c: c}
	for _, phase := range r.phases() {
		if err := phase(ctx, s); err != nil || s.gone {
			return err
		}
	}
	if err := r.writeStatus(ctx, c, s.status); err != nil {
		return err
	}
	r.Metrics.ImageCache(c, false)
	return nil
}

// parentsPhase drops the references to parents that are gone (deleted without releasing, or
// recreated with a new UID): they do not keep the cache. A cache no parent uses is deleted.
func (r *Reconciler) parentsPhase(ctx context.Context, s *state) error {
	c := s.c
	live, err := r.liveReferences(ctx, c)
	if err != nil {
		return err
	}
	if len(live) != len(c.Spec.ParentReferences) {
		c.Spec.ParentReferences = live
		if err := r.Client.Update(ctx, c); err != nil {
			return err
		}
	}
	if len(c.Spec.ParentReferences) == 0 {
		ctrl.LoggerFrom(ctx).Info("no parent uses the image cache any more; deleting it", "image", c.Spec.Image)
		s.gone = true
		return client.IgnoreNotFound(r.Client.Delete(ctx, c))
	}
	return nil
}

// daemonSetPhase keeps the cache's DaemonSet, once its PriorityClass is there.
func (r *Reconciler) daemonSetPhase(ctx context.Context, s *state) (err error) {
	if err := r.checkPriorityClass(ctx); err != nil {
		return err
	}
	s.ds, err = r.ensureDaemonSet(ctx, s.c)
	return err
}

// readPhase reads, from the informer cache and without copies, the nodes of the placement's
// instance types (an index) that it selects, and the cache's own pods.
func (r *Reconciler) readPhase(ctx context.Context, s *state) error {
	rules := r.Config.Rules()
	values, all := rules.Candidates(s.c.Spec.Placement)
	nodes, err := controller.CandidateNodes(ctx, r.Client, values, all)
	if err != nil {
		return err
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(s.c.Namespace), client.MatchingLabels{controller.ImageCacheLabel: s.c.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	s.pods = pods.Items
	for _, n := range nodes {
		if ok, _ := rules.Match(s.c.Spec.Placement, n); ok {
			s.targets = append(s.targets, n)
		}
	}
	return nil
}

// gatherPhase builds the status from the DaemonSet's pods.
func (r *Reconciler) gatherPhase(_ context.Context, s *state) error {
	s.status, s.cached = r.gather(s.c, s.ds, s.targets, s.pods)
	return nil
}

// labelPhase puts the cache's label on exactly the nodes that hold the image (looking at the
// targets and the nodes that carry the label now, an index).
func (r *Reconciler) labelPhase(ctx context.Context, s *state) error {
	label := inferencev1.ImageCacheReadyLabel(string(s.c.UID))
	labelled, err := controller.LabelledNodes(ctx, r.Client, label)
	if err != nil {
		return err
	}
	return r.Labels.Apply(ctx, r.Client, label, controller.LabelChanges(append(s.targets, labelled...), label, s.cached))
}

// liveReferences returns the parent references whose parent still exists with that UID. A cache
// of one namespace (it pulls with that namespace's pull secrets) keeps only that namespace's.
func (r *Reconciler) liveReferences(ctx context.Context, c *inferencev1.InferenceImageCache) ([]inferencev1.ParentReference, error) {
	var live []inferencev1.ParentReference
	owner := c.Labels[controller.SourceNamespaceLabel]
	for _, ref := range c.Spec.ParentReferences {
		if owner != "" && ref.Namespace != owner {
			continue
		}
		var obj client.Object
		switch ref.Kind {
		case "JumpStartModel":
			obj = &inferencev1.JumpStartModel{}
		case "ModelImageCache":
			obj = &inferencev1.ModelImageCache{}
		default:
			obj = &inferencev1.InferenceEndpointConfig{}
		}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, obj)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, err
		case string(obj.GetUID()) != ref.UID:
			continue
		}
		live = append(live, ref)
	}
	return live, nil
}

// finalize removes the DaemonSet and the labels, then lets the object go.
func (r *Reconciler) finalize(ctx context.Context, c *inferencev1.InferenceImageCache) error {
	if !controllerutil.ContainsFinalizer(c, inferencev1.CacheFinalizer) {
		return nil
	}
	st := c.Status.DeepCopy()
	st.Phase = inferencev1.ImageDeleting
	if err := r.writeStatus(ctx, c, *st); err != nil {
		return err
	}
	// A cache outside the operator namespace has no DaemonSet of prewarm's (one made before
	// prewarm kept to that namespace is the cache's, and goes with it).
	if c.Namespace == r.Config.OperatorNamespace {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}}
		if err := r.Client.Delete(ctx, ds, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	label := inferencev1.ImageCacheReadyLabel(string(c.UID))
	labelled, err := controller.LabelledNodes(ctx, r.Client, label)
	if err != nil {
		return err
	}
	if err := r.Labels.Apply(ctx, r.Client, label, controller.LabelChanges(labelled, label, nil)); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("image cache removed", "image", c.Spec.Image)
	r.Metrics.ImageCache(c, true)
	return controller.RemoveFinalizer(ctx, r.Client, c, inferencev1.CacheFinalizer)
}

// checkPriorityClass makes sure the image cache pods' PriorityClass exists (the chart and
// config/ install it; the controller does not, so that nothing of prewarm's outlives an
// uninstall): without it, the DaemonSet could create no pod.
func (r *Reconciler) checkPriorityClass(ctx context.Context) error {
	name := r.Config.Controller.ImageCachePriorityClass
	err := r.Client.Get(ctx, types.NamespacedName{Name: name}, &schedulingv1.PriorityClass{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("the image cache pods' PriorityClass %s does not exist: prewarm's chart (or config/agent/priorityclasses.yaml) installs it", name)
	}
	return err
}

func (r *Reconciler) ensureDaemonSet(ctx context.Context, c *inferencev1.InferenceImageCache) (*appsv1.DaemonSet, error) {
	want := r.daemonSet(c)
	ds := &appsv1.DaemonSet{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), ds)
	if apierrors.IsNotFound(err) {
		if err := controllerutil.SetControllerReference(c, want, r.Client.Scheme()); err != nil {
			return nil, err
		}
		return want, r.Client.Create(ctx, want)
	}
	if err != nil {
		return nil, err
	}
	if !metav1.IsControlledBy(ds, c) {
		return nil, fmt.Errorf("the DaemonSet %s/%s exists and is not this image cache's", ds.Namespace, ds.Name)
	}
	if ds.Annotations[controller.TemplateHashAnnotation] == want.Annotations[controller.TemplateHashAnnotation] {
		return ds, nil
	}
	patch := client.MergeFrom(ds.DeepCopy())
	if ds.Annotations == nil {
		ds.Annotations = map[string]string{}
	}
	ds.Annotations[controller.TemplateHashAnnotation] = want.Annotations[controller.TemplateHashAnnotation]
	ds.Spec.Template = want.Spec.Template
	return ds, r.Client.Patch(ctx, ds, patch)
}

func (r *Reconciler) writeStatus(ctx context.Context, c *inferencev1.InferenceImageCache, st inferencev1.InferenceImageCacheStatus) error {
	return controller.WriteStatus(ctx, r.Client, c, &c.Status, st)
}
