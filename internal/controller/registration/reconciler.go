// Package registration reconciles HyperPod's SageMakerEndpointRegistration. Registering an
// endpoint with SageMaker needs SageMaker, which a cluster off AWS does not have: prewarm accepts
// the object with HyperPod's schema, creates nothing, and says so in its status.
package registration

import (
	"context"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// Reconciler reconciles SageMakerEndpointRegistration objects.
type Reconciler struct {
	Client client.Client
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=sagemakerendpointregistrations,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=sagemakerendpointregistrations/status,verbs=get;update;patch

// SetupWithManager registers the reconciler with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("registration").
		For(&inferencev1.SageMakerEndpointRegistration{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// Message is what the Registered condition says.
const Message = "registering an endpoint with SageMaker needs SageMaker, which this cluster does not reach: prewarm creates " +
	"no SageMaker endpoint, model or endpoint configuration; the endpoint is served in the cluster by its " +
	"InferenceEndpointConfig or JumpStartModel"

// Reconcile writes the registration's status: CreationFailed, with a Registered condition that
// says why.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	reg := &inferencev1.SageMakerEndpointRegistration{}
	if err := r.Client.Get(ctx, req.NamespacedName, reg); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	st := reg.Status.DeepCopy()
	st.State = inferencev1.RegistrationCreationFailed
	st.ObservedGeneration = reg.Generation
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: inferencev1.ConditionRegistered, Status: metav1.ConditionFalse, ObservedGeneration: reg.Generation,
		Reason: inferencev1.ReasonNotAvailableOffSageMaker, Message: Message,
	})
	return ctrl.Result{}, controller.WriteStatus(ctx, r.Client, reg, &reg.Status, *st)
}
