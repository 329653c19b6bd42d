// Package serving reconciles the objects that ask for a model to be served, InferenceEndpointConfig
// and JumpStartModel (the parents): their weights and image caches, the gate that holds the
// Deployment back until the weights cache settles, the Deployment and Service that serve the
// model, and the parent's status. Both kinds share one code path once the JumpStart catalog has
// been read (state.go, phases.go). HyperPod's standalone caches, ModelWeightsCacheConfig and
// ModelImageCache, are parents too, each with its own phases over the same runner
// (reconcileParent): a parent of a weights cache, and of a shared image cache.
package serving

import (
	"context"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/hub"
	"github.com/prewarm/prewarm/internal/jumpstart"
	"github.com/prewarm/prewarm/internal/text"
)

// Reconciler reconciles InferenceEndpointConfig objects.
type Reconciler struct {
	Client client.Client
	// APIReader reads what the controller does not watch cluster-wide: service accounts, pull
	// secrets and token Secrets in users' namespaces (a RecentReader in the controller).
	APIReader client.Reader
	// Live reads objects afresh from the API server, after a write conflicted with the
	// informer's copy (nil: Client).
	Live   client.Reader
	Config controller.Config
	// Hub checks Hugging Face tokens and pins revisions; nil skips the checks.
	Hub *hub.Checker
	// JumpStart resolves JumpStart models the catalog does not list from JumpStart's own
	// manifest; nil: the catalog only.
	JumpStart *jumpstart.Resolver
	// Recorder records Events on parents; nil records none.
	Recorder events.EventRecorder
	// Metrics records gate waits and errors; nil records none.
	Metrics *controller.Metrics
	Now     func() time.Time

	// kedaSeen: the API server has been seen serving KEDA's ScaledObject (kedaServed).
	kedaSeen atomic.Bool
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferenceendpointconfigs,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferenceendpointconfigs/status;inferenceendpointconfigs/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch;create;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferenceimagecaches,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=secrets,verbs=get;list;watch;create;update

// ownChanges lets through a parent's changes of spec (its generation, which its deletion moves
// too), labels and annotations.
var ownChanges = predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{})

// SetupWithManager registers the reconciler with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("endpoint").
		// Not its own status writes: they change nothing the reconcile reads.
		For(&inferencev1.InferenceEndpointConfig{}, builder.WithPredicates(ownChanges)).
		// A cache's status moves with every node's progress: its parent gathers it once a second.
		Watches(&inferencev1.ModelDataCacheConfig{}, controller.Coalesce(
			handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &inferencev1.InferenceEndpointConfig{}, handler.OnlyControllerOwner()), time.Second)).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Watches(&inferencev1.InferenceImageCache{}, controller.Coalesce(handler.EnqueueRequestsFromMapFunc(parentsOf), time.Second))
	if err := r.ownScaledObjects(b); err != nil {
		return err
	}
	return b.Complete(r)
}

// Reconcile brings one InferenceEndpointConfig's cache, Deployment, Service and status to what
// its spec asks.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return reconcileParent(ctx, r, req, servingKind(r, "endpoint", "InferenceEndpointConfig",
		func(iec *inferencev1.InferenceEndpointConfig) *inferencev1.ParentStatus { return &iec.Status },
		func(_ context.Context, iec *inferencev1.InferenceEndpointConfig) (*model, *problem, error) {
			return fromEndpoint(iec), nil, nil
		}))
}

// live is the reader of objects as the API server has them now.
func (r *Reconciler) live() client.Reader {
	if r.Live != nil {
		return r.Live
	}
	return r.Client
}

func setCondition(st *inferencev1.ParentStatus, gen int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: text.Clip(msg, text.MaxConditionMessage), ObservedGeneration: gen,
	})
}

// finalize releases the parent's image cache references, then lets the parent go.
func (r *Reconciler) finalize(ctx context.Context, obj client.Object) error {
	if !controllerutil.ContainsFinalizer(obj, inferencev1.ParentFinalizer) {
		return nil
	}
	if err := r.releaseImageCaches(ctx, string(obj.GetUID()), ""); err != nil {
		return err
	}
	return controller.RemoveFinalizer(ctx, r.Client, obj, inferencev1.ParentFinalizer)
}

// parentsOf maps an image cache to the InferenceEndpointConfigs that use it.
func parentsOf(_ context.Context, o client.Object) []reconcile.Request {
	c, ok := o.(*inferencev1.InferenceImageCache)
	if !ok {
		return nil
	}
	var reqs []reconcile.Request
	for _, p := range c.Spec.ParentReferences {
		if p.Kind == "InferenceEndpointConfig" {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
		}
	}
	return reqs
}
