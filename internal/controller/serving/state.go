package serving

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// state is one reconcile of a parent: the model it serves, the status it builds, what the
// phases read and decide on the way, and the events that wait for the status write. The phases
// (phases.go) take it in turn, each filling in what the next ones need.
type state struct {
	m      *model
	status *inferencev1.ParentStatus

	// image is the shared image cache the pods pull from (nil: none).
	image *inferencev1.InferenceImageCache
	// dep is the parent's Deployment as read (nil before it is created), and as written once
	// the deployment phase has run; owned are the parent's weights caches, oldest first.
	dep   *appsv1.Deployment
	owned []inferencev1.ModelDataCacheConfig
	// use is the weights cache the pods read (nil: none); tmpl is the pod template they run.
	use  *inferencev1.ModelDataCacheConfig
	tmpl corev1.PodTemplateSpec
	// rollout is set once the rollout phase has reported the Deployment: the status then
	// carries its rollup, written after any problem the rollout reported.
	rollout bool

	// scaling is the parent's autoscaling as the scaling phase found it.
	scaling scaling

	// hold ends the phases without a problem: the Deployment waits for the weights cache.
	hold   bool
	result ctrl.Result
	// events wait for the status write (a transition's are dropped if it fails).
	events controller.Pending
}

// phase is one step of a parent's reconcile. A *problem it returns stops the parent with that
// reason (reported on it, not retried in a loop); another error ends the reconcile to be retried.
type phase struct {
	run func(context.Context, *state) error
	// retry is how soon a parent stopped in this phase is looked at again: what blocks it may
	// be another object than the parent, which no watch reports.
	retry time.Duration
}

func (s *state) gen() int64 { return s.m.owner.GetGeneration() }

func (s *state) condition(typ string, status metav1.ConditionStatus, reason, msg string) {
	setCondition(s.status, s.gen(), typ, status, reason, msg)
}

// record queues a Normal event that tells of something done.
func (s *state) record(reason, action, note string) {
	s.events.Record(corev1.EventTypeNormal, reason, action, note)
}

// requeue asks for the parent to be looked at again within d (the earliest ask wins).
func (s *state) requeue(d time.Duration) {
	if d > 0 && (s.result.RequeueAfter == 0 || d < s.result.RequeueAfter) {
		s.result.RequeueAfter = d
	}
}

// scalingWarning sets the Autoscaling condition False for something the user must act on, with
// a Warning event when it is news.
func (s *state) scalingWarning(reason, msg string) {
	if prev := apimeta.FindStatusCondition(s.status.Conditions, inferencev1.ConditionAutoscaling); prev == nil || prev.Reason != reason || prev.Message != msg {
		s.events.Tell(corev1.EventTypeWarning, reason, "Autoscale", msg)
	}
	s.condition(inferencev1.ConditionAutoscaling, metav1.ConditionFalse, reason, msg)
}

// fail records a problem that stops the parent, with a Warning event when it is news.
func (s *state) fail(p *problem) {
	if prev := apimeta.FindStatusCondition(s.status.Conditions, inferencev1.ConditionReady); prev == nil || prev.Reason != p.reason || prev.Message != p.message {
		s.events.Tell(corev1.EventTypeWarning, p.reason, "Reconcile", p.message)
	}
	s.status.State = inferencev1.DeploymentFailed
	s.condition(inferencev1.ConditionReady, metav1.ConditionFalse, p.reason, p.message)
}

// run runs the phases over s in order, until one stops the parent or holds the Deployment back.
func (r *Reconciler) run(ctx context.Context, s *state) error {
	defer func() {
		if s.rollout {
			s.status.DeploymentStatus = deploymentRollup(s.dep, s.status.State, s.status.DeploymentStatus, r.Now())
		}
	}()
	for _, ph := range r.phases() {
		err := ph.run(ctx, s)
		var p *problem
		switch {
		case errors.As(err, &p):
			s.fail(p)
			s.requeue(ph.retry)
			return nil
		case err != nil:
			return err
		case s.hold:
			return nil
		}
	}
	return nil
}

// parentKind is what the shared reconcile needs of one parent kind: its status, and the model it
// asks to serve.
type parentKind[P client.Object] struct {
	// name names the kind's controller, in metrics.
	name string
	// kind is the parent's Kind.
	kind   string
	status func(P) *inferencev1.ParentStatus
	// model builds what the parent asks to serve; a problem says why it cannot be (the parent
	// stops with it until its spec, or what it names, changes).
	model func(context.Context, P) (*model, *problem, error)
}

// reconcileParent is the reconcile of every parent kind: read it, let it go when it is being
// deleted, run the phases over its model, write its status, then record the events.
func reconcileParent[T any, P interface {
	*T
	client.Object
}](ctx context.Context, r *Reconciler, req ctrl.Request, k parentKind[P]) (ctrl.Result, error) {
	obj := P(new(T))
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.ParentPods(k.kind, req.Namespace, req.Name, nil)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		// The weights cache, Deployment and Service are owned by the parent: the garbage
		// collector removes them, and the cache's finalizer removes its files from every node
		// first. Shared image caches are not owned: the parent lets go of its references.
		return ctrl.Result{}, r.finalize(ctx, obj)
	}
	stored := k.status(obj)
	s := &state{status: stored.DeepCopy()}
	s.status.ObservedGeneration = obj.GetGeneration()
	m, p, err := k.model(ctx, obj)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case p != nil:
		s.m = &model{owner: obj, kind: k.kind}
		s.fail(p) // a change of the spec or of what it names brings us back
		switch p.reason {
		case inferencev1.ReasonJumpStartUnavailable:
			s.requeue(time.Minute)
		case inferencev1.ReasonModelNotInCatalog, inferencev1.ReasonModelVersionNotFound:
			if r.JumpStart != nil {
				s.requeue(5 * time.Minute) // JumpStart may publish it
			}
		}
	default:
		s.m = m
		err = r.run(ctx, s)
	}
	werr := controller.WriteStatus(ctx, r.Client, obj, stored, *s.status)
	s.events.Emit(r.Recorder, s.m.owner, werr == nil)
	if err == nil {
		err = werr // the phases' error first, else the status write's
	}
	r.Metrics.ReconcileError(k.name, err)
	return s.result, err
}
