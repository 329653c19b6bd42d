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
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// state is one reconcile of a parent: the model it serves, the status it builds, what the
// phases read and decide on the way, and the events that wait for the status write. The phases
// (phases.go, and a standalone cache's in its own file) take it in turn, each filling in what the
// next ones need.
type state struct {
	m *model
	// status is the status a serving parent (InferenceEndpointConfig, JumpStartModel) builds;
	// nil for a standalone cache, whose status its kind makes of what the phases found
	// (parentKind.report).
	status *inferencev1.ParentStatus
	// shown are a standalone cache's conditions as stored: what a problem is news against.
	shown []metav1.Condition
	// problem is the one that stopped the parent (nil: none).
	problem *problem
	// off says why a standalone cache is on no node because its spec asks so (nil: it is on).
	off *problem
	// notes are added to a standalone cache's status message.
	notes []string

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
	s.problem = p
	conds := s.shown
	if s.status != nil {
		conds = s.status.Conditions
	}
	if prev := apimeta.FindStatusCondition(conds, inferencev1.ConditionReady); prev == nil || prev.Reason != p.reason || prev.Message != p.message {
		s.events.Tell(corev1.EventTypeWarning, p.reason, "Reconcile", p.message)
	}
	if s.status != nil {
		s.status.State = inferencev1.DeploymentFailed
		s.condition(inferencev1.ConditionReady, metav1.ConditionFalse, p.reason, p.message)
	}
}

// run runs phases over s in order, until one stops the parent or holds the rest back.
func (r *Reconciler) run(ctx context.Context, s *state, phases []phase) error {
	defer func() {
		if s.rollout {
			s.status.DeploymentStatus = deploymentRollup(s.dep, s.status.State, s.status.DeploymentStatus, r.Now())
		}
	}()
	for _, ph := range phases {
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

// parentKind is what the shared reconcile needs of one parent kind P, whose status is an S: where
// it keeps its status, the model it asks for, its phases and the status they make.
type parentKind[P client.Object, S any] struct {
	// name names the kind's controller, in metrics.
	name string
	// kind is the parent's Kind.
	kind   string
	status func(P) *S
	// model builds what the parent asks for; a problem says why it cannot be (the parent
	// stops with it until its spec, or what it names, changes, or retry has passed).
	model func(context.Context, P) (*model, *problem, error)
	retry time.Duration
	// phases are the kind's steps, in order.
	phases []phase
	// begin is the state of a reconcile of the parent, its status as stored; nil: a state whose
	// status the kind makes in report, with shown the stored conditions.
	begin func(P, *S) *state
	shown func(*S) []metav1.Condition
	// report is the status to write once the phases have run (or finalize has, and left the
	// parent in place).
	report func(P, *state) S
	// finalize lets a parent being deleted go; gone: its finalizer is off, no status to write.
	finalize func(context.Context, P, *state) (gone bool, err error)
	// Where the kind also has views of the serving parents' caches (objects of the kind that
	// are not parents): absent is what is done for a name with no object of the kind, and
	// syncView keeps an object that a cache of kind viewOf controls.
	absent   func(context.Context, types.NamespacedName) error
	viewOf   string
	syncView func(context.Context, P, *metav1.OwnerReference) error
}

// servingKind is a parent kind that serves a model (InferenceEndpointConfig, JumpStartModel):
// the serving phases, over a ParentStatus.
func servingKind[P client.Object](r *Reconciler, name, kind string, status func(P) *inferencev1.ParentStatus,
	build func(context.Context, P) (*model, *problem, error)) parentKind[P, inferencev1.ParentStatus] {
	return parentKind[P, inferencev1.ParentStatus]{
		name: name, kind: kind, status: status,
		model: func(ctx context.Context, p P) (*model, *problem, error) {
			m, prob, err := build(ctx, p)
			if err != nil || prob != nil {
				return m, prob, err
			}
			return m, nil, r.complete(ctx, m)
		},
		phases: r.phases(),
		begin: func(p P, stored *inferencev1.ParentStatus) *state {
			s := &state{status: stored.DeepCopy()}
			s.status.ObservedGeneration = p.GetGeneration()
			return s
		},
		report: func(_ P, s *state) inferencev1.ParentStatus { return *s.status },
		finalize: func(ctx context.Context, p P, _ *state) (bool, error) {
			// The weights cache, Deployment and Service are owned by the parent: the garbage
			// collector removes them, and the cache's finalizer removes its files from every
			// node first. Shared image caches are not owned: the parent lets go of its
			// references.
			return true, r.finalize(ctx, p)
		},
	}
}

// reconcileParent is the reconcile of every parent kind: read it, let it go when it is being
// deleted, run the kind's phases over its model, write its status, then record the events.
func reconcileParent[T any, P interface {
	*T
	client.Object
}, S any](ctx context.Context, r *Reconciler, req ctrl.Request, k parentKind[P, S]) (ctrl.Result, error) {
	obj := P(new(T))
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Metrics.ParentPods(k.kind, req.Namespace, req.Name, nil)
		if k.absent != nil {
			return ctrl.Result{}, k.absent(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, nil
	}
	if owner := metav1.GetControllerOf(obj); k.syncView != nil && owner != nil && owner.Kind == k.viewOf {
		return ctrl.Result{}, k.syncView(ctx, obj, owner)
	}
	stored := k.status(obj)
	s := &state{}
	if k.begin != nil {
		s = k.begin(obj, stored)
	} else {
		s.shown = k.shown(stored)
	}
	var err error
	if !obj.GetDeletionTimestamp().IsZero() {
		if gone, err := k.finalize(ctx, obj, s); gone || err != nil {
			return ctrl.Result{}, err
		}
	} else {
		err = runModel(ctx, r, s, obj, k)
	}
	werr := controller.WriteStatus(ctx, r.Client, obj, stored, k.report(obj, s))
	s.events.Emit(r.Recorder, obj, werr == nil)
	if err == nil {
		err = werr // the phases' error first, else the status write's
	}
	r.Metrics.ReconcileError(k.name, err)
	return s.result, err
}

// runModel builds the parent's model and runs the kind's phases over it; a problem with the
// model stops the parent as a phase's does.
func runModel[P client.Object, S any](ctx context.Context, r *Reconciler, s *state, obj P, k parentKind[P, S]) error {
	m, p, err := k.model(ctx, obj)
	switch {
	case err != nil:
		return err
	case p != nil:
		s.m = &model{owner: obj, kind: k.kind}
		s.fail(p) // a change of the spec or of what it names brings us back
		s.requeue(k.retry)
		switch p.reason {
		case inferencev1.ReasonJumpStartUnavailable:
			s.requeue(time.Minute)
		case inferencev1.ReasonModelNotInCatalog, inferencev1.ReasonModelVersionNotFound:
			if r.JumpStart != nil {
				s.requeue(5 * time.Minute) // JumpStart may publish it
			}
		}
		return nil
	}
	s.m = m
	return r.run(ctx, s, k.phases)
}
