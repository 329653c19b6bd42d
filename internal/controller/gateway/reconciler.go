// Package gateway reconciles the HyperPod inference add-on's InferenceGatewayConfig. Routing a
// model through a Gateway, an InferencePool and an endpoint picker is the job of a Gateway API
// inference extension (llm-d, the GIE endpoint picker), which a cluster runs or not: prewarm
// accepts the object, creates nothing for it, and says in its status how to point one at the
// Services prewarm serves models with.
package gateway

import (
	"context"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	inferencev1alpha1 "github.com/prewarm/prewarm/api/v1alpha1"
	"github.com/prewarm/prewarm/internal/controller"
)

// Reconciler reconciles InferenceGatewayConfig objects.
type Reconciler struct {
	Client client.Client
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferencegatewayconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=inferencegatewayconfigs/status,verbs=get;update;patch

// SetupWithManager registers the reconciler with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("gateway").
		For(&inferencev1alpha1.InferenceGatewayConfig{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// Message is what the Ready condition says.
const Message = "prewarm does not route: it creates no Gateway, InferencePool, endpoint picker or body-based router for this " +
	"configuration. Each model is served by the ClusterIP Service of its InferenceEndpointConfig's or JumpStartModel's name, " +
	"and its pods carry app.kubernetes.io/name=<that name>: point a Gateway API inference extension's InferencePool " +
	"(llm-d, the GIE endpoint picker) at those pods, with targetPort the model's invocation port"

// Reconcile writes the gateway's status: Accepted, and Ready False with what to run instead.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	gw := &inferencev1alpha1.InferenceGatewayConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, gw); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	st := gw.Status.DeepCopy()
	st.ObservedGeneration = gw.Generation
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: ConditionAccepted, Status: metav1.ConditionTrue, ObservedGeneration: gw.Generation,
		Reason: ReasonKept, Message: "kept as written; its schema is the HyperPod add-on's and is not checked here",
	})
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: inferencev1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: gw.Generation,
		Reason: ReasonRoutingNotProvided, Message: Message,
	})
	return ctrl.Result{}, controller.WriteStatus(ctx, r.Client, gw, &gw.Status, *st)
}

// The gateway's condition and reasons.
const (
	// ConditionAccepted: the object is kept.
	ConditionAccepted = "Accepted"
	// ReasonKept: accepted as written.
	ReasonKept = "Kept"
	// ReasonRoutingNotProvided: prewarm routes nothing; a Gateway API inference extension
	// of the cluster's must.
	ReasonRoutingNotProvided = "RoutingNotProvided"
)
