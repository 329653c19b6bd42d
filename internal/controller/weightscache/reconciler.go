// Package weightscache reconciles ModelDataCacheConfig: it asks every target node's agent to
// hold the cache (through the node's NodeCache), gathers what the agents report, labels the
// nodes that hold it, and removes it everywhere before the object goes.
package weightscache

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// uidIndex indexes ModelDataCacheConfigs by UID, to map NodeCache events to them.
const uidIndex = "metadata.uid"

// cacheIndex indexes NodeCaches by the caches they ask for, report on or demand, so that a
// cache's reconcile reads only the nodes it touches.
const cacheIndex = "prewarm.io/caches"

// Indexes are the informer indexes the reconciler reads through, besides controller.NodeIndexes.
var Indexes = []controller.Index{
	{Object: &inferencev1.ModelDataCacheConfig{}, Field: uidIndex, Func: func(o client.Object) []string { return []string{string(o.GetUID())} }},
	{Object: &prewarmv1alpha1.NodeCache{}, Field: cacheIndex, Func: func(o client.Object) []string { return cachesIn(o.(*prewarmv1alpha1.NodeCache)) }},
}

// cachesIn lists the caches a NodeCache names.
func cachesIn(nc *prewarmv1alpha1.NodeCache) []string {
	var uids []string
	add := func(uid string) {
		if !slices.Contains(uids, uid) {
			uids = append(uids, uid)
		}
	}
	for _, c := range nc.Spec.Caches {
		add(c.UID)
	}
	for _, c := range nc.Status.Caches {
		add(c.UID)
	}
	for _, d := range nc.Status.Demands {
		add(d.UID)
	}
	return uids
}

// Reconciler reconciles ModelDataCacheConfig objects.
type Reconciler struct {
	Client client.Client
	// APIReader reads token Secrets in users' namespaces, which the controller does not watch
	// (a RecentReader in the controller).
	APIReader client.Reader
	Config    controller.Config
	// Recorder records Events on caches; nil records none.
	Recorder events.EventRecorder
	// Metrics records the caches' counts; nil records none.
	Metrics *controller.Metrics
	// Sizer lists a cache's source to learn the model's size before any node downloads it;
	// nil: the size is known once a node lists it.
	Sizer Sizer
	Now   func() time.Time
	// Labels writes the nodes' ready labels, one patch per node for the changes of every
	// cache (nil: one patch per change).
	Labels *controller.Labeller
	// Requests writes the caches' requests into the nodes' NodeCaches, one write per node for
	// the changes of every cache (nil: each reconcile writes its own, at once).
	Requests *Requests
	// LivenessScan is how often the agents' Leases are checked for ones that expired or came
	// back (15 s when zero): the nodes' caches are reconciled then.
	LivenessScan time.Duration

	podIPs  podIPs
	sizes   sizes
	witness witnessSources
	quota   quotaLocks
	// deleting are, for each cache being deleted, the nodes asked for it since its deletion
	// began: the holders its deletion waits for.
	deleting askedAtDeletion
}

// askedAtDeletion remembers, for the caches being deleted, the nodes that were asked for them
// when this process saw their deletion (their requests are then withdrawn): a node that still
// reports such a cache is waited for only if it was asked. A process that starts during a
// deletion knows only the requests not withdrawn yet; the others' agents remove the files all
// the same (they remove what no request names), unwaited.
type askedAtDeletion struct {
	mu sync.Mutex
	by map[string]map[string]bool
}

// add records the nodes asked for cache uid now, and returns every node recorded.
func (d *askedAtDeletion) add(uid string, nodes []string) map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.by == nil {
		d.by = map[string]map[string]bool{}
	}
	if d.by[uid] == nil {
		d.by[uid] = map[string]bool{}
	}
	for _, n := range nodes {
		d.by[uid][n] = true
	}
	return maps.Clone(d.by[uid])
}

func (d *askedAtDeletion) forget(uid string) {
	d.mu.Lock()
	delete(d.by, uid)
	d.mu.Unlock()
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs/status;modeldatacacheconfigs/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelweightscacheconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches,verbs=get;list;watch;create;patch;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// liveness tells whether nodes' agents are alive, from the Leases in the informer.
func (r *Reconciler) liveness() controller.Liveness {
	return controller.Liveness{Reader: r.Client, Namespace: r.Config.OperatorNamespace, Now: r.Now}
}

// SetupWithManager registers the reconciler with mgr, whose cache must have Indexes and
// controller.NodeIndexes (controller.RegisterIndexes).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	// A node's agent whose Lease expires (or comes back) changes what its reports count for.
	flips := make(chan event.GenericEvent)
	if err := mgr.Add(&livenessScan{r: r, flips: flips, every: cmp.Or(r.LivenessScan, 15*time.Second)}); err != nil {
		return err
	}
	// A request the writer leaves out of a node's list is reported on its own cache.
	leftOut := make(chan event.GenericEvent)
	if r.Requests != nil {
		r.Requests.Slots, r.Requests.LeftOut = r.slots(), leftOut
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("weightscache").
		For(&inferencev1.ModelDataCacheConfig{}).
		Watches(&corev1.Node{}, controller.EnqueueAll(r.Client, func() client.ObjectList { return &inferencev1.ModelDataCacheConfigList{} }, nil),
			builder.WithPredicates(predicate.Or(controller.NodePlacementChanged, controller.NodeAddressesChanged))).
		Watches(&prewarmv1alpha1.NodeCache{}, nodeCacheEvents{r}).
		WatchesRawSource(source.Channel(flips, handler.EventHandler(nodeCacheEvents{r}))).
		WatchesRawSource(source.Channel(leftOut, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// state is one reconcile of a cache: the cache, its fleet as read, what it decides, and
// the status, labels and events it writes. The phases fill it in order.
type state struct {
	m        *inferencev1.ModelDataCacheConfig
	deleting bool
	fleet    *fleet
	decision decision
	// unasked are the nodes that could not be asked, and why: their request list has no room
	// for the cache, or would be refused with it.
	unasked map[string]refusal
	status  inferencev1.ModelDataCacheConfigStatus
	// ready are the nodes that hold the cache Ready, listed in status.nodes or not.
	ready map[string]bool
	// events tell of the nodes' transitions, once the status that shows them is written.
	events controller.Pending
}

// phases are the steps of a cache's reconcile, in order: read the fleet, decide the targets and
// the request, check the peers' addresses, ask the nodes, gather their reports into the status,
// label the nodes that hold it.
func (r *Reconciler) phases() []func(context.Context, *state) error {
	return []func(context.Context, *state) error{r.readPhase, r.decidePhase, r.peerPhase, r.askPhase, r.gatherPhase, r.labelPhase}
}

// Reconcile brings one cache's nodes, labels and status to what its spec asks.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	r.Metrics.ReconcileError("weightscache", err)
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	m := &inferencev1.ModelDataCacheConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	s := &state{m: m, deleting: !m.DeletionTimestamp.IsZero()}
	switch {
	case s.deleting && !controllerutil.ContainsFinalizer(m, inferencev1.CacheFinalizer):
		return ctrl.Result{}, nil
	case !s.deleting:
		if err := controller.AddFinalizer(ctx, r.Client, m, inferencev1.CacheFinalizer); err != nil {
			return ctrl.Result{}, err
		}
	}
	for _, phase := range r.phases() {
		if err := phase(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	if s.deleting {
		return r.finishDeletion(ctx, s)
	}
	if err := r.writeStatus(ctx, m, s.status); err != nil {
		return ctrl.Result{}, err
	}
	s.events.Emit(r.Recorder, s.m, true)
	r.Metrics.WeightsCache(m, false)
	return ctrl.Result{RequeueAfter: s.decision.requeue}, nil
}

// readPhase reads the cache's fleet.
func (r *Reconciler) readPhase(ctx context.Context, s *state) (err error) {
	s.fleet, err = r.readFleet(ctx, s.m)
	return err
}

// decidePhase decides the cache's request and targets, and reads the targets' NodeCaches.
func (r *Reconciler) decidePhase(ctx context.Context, s *state) (err error) {
	if s.decision, err = r.decide(ctx, s.m, s.fleet); err != nil {
		return err
	}
	return s.fleet.readTargets(ctx, r.Client, s.decision.targets)
}

// askPhase asks the nodes for the cache (ask), as many of them as the namespace's quota in the
// cluster leaves room for (applyQuota): the caches of one namespace with such a limit are
// decided and asked one at a time.
func (r *Reconciler) askPhase(ctx context.Context, s *state) (err error) {
	if _, limited := r.Config.ClusterLimit(s.m.Namespace); limited && !s.deleting {
		defer r.quota.lock(s.m.Namespace)()
		if err := r.applyQuota(ctx, s); err != nil {
			return err
		}
		if len(s.decision.quota.refused) > 0 && (s.decision.requeue == 0 || s.decision.requeue > quotaRecheck) {
			s.decision.requeue = quotaRecheck // room may come as other caches of the namespace go
		}
	}
	s.unasked, err = r.ask(ctx, s)
	if err == nil && s.decision.quota.cluster != nil {
		r.quota.remember(s.fleet.uid, s.decision.quota.cluster.copies, r.Now())
	}
	return err
}

// quotaRecheck is how often a cache that its namespace's quota keeps off some of its targets
// is looked at again.
const quotaRecheck = 30 * time.Second

// gatherPhase builds the cache's status from the nodes' reports, and the events that tell of
// each node's transitions.
func (r *Reconciler) gatherPhase(ctx context.Context, s *state) error {
	if err := r.gather(ctx, s); err != nil {
		return err
	}
	if s.deleting {
		// A cache being deleted asks no node for room: no forecast, no quota.
		apimeta.RemoveStatusCondition(&s.status.Conditions, inferencev1.ConditionCapacityAvailable)
		apimeta.RemoveStatusCondition(&s.status.Conditions, inferencev1.ConditionWithinBudget)
		s.status.Capacity = nil
	} else {
		r.capacityPhase(s)
		r.budgetPhase(s)
	}
	noteExcluded(&s.status, s.decision.excluded)
	noteGrant(&s.status, s.decision)
	r.nodeEvents(s)
	if p := s.decision.policyProblem; p != "" {
		// Recorded at each reconcile; the event recorder folds the repeats into one series.
		s.events.Record(corev1.EventTypeWarning, controller.EventEvictionPolicyLimited, "Decide", p)
	}
	if v := s.decision.verdict; v != nil {
		if v.failed {
			s.status.State = inferencev1.CacheFailed
		}
		setCondition(&s.status, s.m, metav1.ConditionFalse, v.reason, v.message)
	}
	return nil
}

// labelPhase puts the cache's label on exactly the nodes that hold it Ready (retained nodes too:
// new pods prefer them again once they are admitted), and on none while the cache is deleted.
// It looks at the targets, the retained nodes and the nodes that carry the label now (an index).
func (r *Reconciler) labelPhase(ctx context.Context, s *state) error {
	key := inferencev1.WeightsCacheReadyLabel(string(s.m.UID))
	labelled, err := controller.LabelledNodes(ctx, r.Client, key)
	if err != nil {
		return err
	}
	want := s.ready
	if s.deleting {
		want = nil
	}
	return r.Labels.Apply(ctx, r.Client, key, controller.LabelChanges(slices.Concat(s.decision.targets, s.decision.retainedNodes, labelled), key, want))
}

// finishDeletion reports the nodes that still hold the deleted cache, and once none does (or
// controller.deletionTimeout has passed), lets the cache go.
func (r *Reconciler) finishDeletion(ctx context.Context, s *state) (ctrl.Result, error) {
	m, st := s.m, &s.status
	st.State = inferencev1.CacheDeleting
	holders := s.fleet.holders(r.deleting.add(string(m.UID), slices.Concat(s.fleet.askedNodes(), r.Requests.pendingFor(string(m.UID)))))
	// A node's word that it still holds the cache is all there is to wait on; an agent that
	// never stops saying so (a forged entry) must not hold the cache, and so its namespace's
	// deletion, forever. Agents remove what no request names either way.
	left := r.Config.DeletionTimeout() - r.Now().Sub(m.DeletionTimestamp.Time)
	waiting := len(holders) > 0 && left > 0
	if len(holders) == 0 || waiting {
		if waiting {
			setCondition(st, m, metav1.ConditionFalse, "Deleting",
				fmt.Sprintf("waiting for %d node(s) to remove the cache's files: %s", len(holders), controller.Summarize(holders, 5)))
		} else {
			setCondition(st, m, metav1.ConditionFalse, "Deleted", "every node has removed the cache")
		}
		if err := r.writeStatus(ctx, m, *st); err != nil {
			return ctrl.Result{}, err
		}
	}
	s.events.Emit(r.Recorder, s.m, true)
	if waiting {
		return ctrl.Result{RequeueAfter: left}, nil // NodeCache events bring us back sooner
	}
	if len(holders) > 0 {
		ctrl.LoggerFrom(ctx).Info("deleting the cache while nodes still report it", "nodes", holders)
		controller.Event(r.Recorder, m, corev1.EventTypeWarning, controller.EventDeletionTimeout, "Delete",
			fmt.Sprintf("%d node(s) still report the cache %s after it was deleted (controller.deletionTimeout): %s; it goes, and their agents remove the files of caches no request names",
				len(holders), r.Config.DeletionTimeout(), controller.Summarize(holders, 5)))
	}
	if err := r.deleteLegacyToken(ctx, m); err != nil {
		return ctrl.Result{}, err
	}
	r.sizes.forget(string(m.UID))
	r.Requests.forget(string(m.UID))
	r.deleting.forget(string(m.UID))
	r.quota.forget(string(m.UID))
	if err := controller.RemoveFinalizer(ctx, r.Client, m, inferencev1.CacheFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("cache removed from every node")
	r.Metrics.WeightsCache(m, true)
	controller.Event(r.Recorder, m, corev1.EventTypeNormal, controller.EventCleanupDone, "Delete", "every node has removed the cache's files and labels")
	return ctrl.Result{}, nil
}

// parentWants reports whether the cache's parent reference resolves to a parent that exists
// with that UID and controls the cache: prewarm serves only the caches its parents made. A cache
// written by hand, or one whose parent is gone, is asked of no node.
func (r *Reconciler) parentWants(ctx context.Context, m *inferencev1.ModelDataCacheConfig) (bool, string, error) {
	ref := m.Spec.ParentReference
	var parent client.Object
	switch ref.Kind {
	case "InferenceEndpointConfig":
		parent = &inferencev1.InferenceEndpointConfig{}
	case "JumpStartModel":
		parent = &inferencev1.JumpStartModel{}
	case "ModelWeightsCacheConfig":
		parent = &inferencev1.ModelWeightsCacheConfig{}
	default:
		return false, fmt.Sprintf("spec.parentReference.kind %q: prewarm serves caches of InferenceEndpointConfigs, JumpStartModels and ModelWeightsCacheConfigs only", ref.Kind), nil
	}
	if ref.Namespace != "" && ref.Namespace != m.Namespace {
		return false, fmt.Sprintf("spec.parentReference names namespace %s; a cache serves a parent of its own namespace (%s)", ref.Namespace, m.Namespace), nil
	}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, parent)
	switch {
	case apierrors.IsNotFound(err):
		return false, fmt.Sprintf("%s %s/%s does not exist; prewarm serves only the caches its parents made, and none is asked of a node", ref.Kind, m.Namespace, ref.Name), nil
	case err != nil:
		return false, "", err
	}
	owner := metav1.GetControllerOf(m)
	if string(parent.GetUID()) != ref.UID || owner == nil || owner.UID != parent.GetUID() {
		return false, fmt.Sprintf("%s %s/%s (uid %s) did not make this cache (its reference names uid %s); prewarm serves only the caches its parents made, and none is asked of a node",
			ref.Kind, m.Namespace, ref.Name, parent.GetUID(), ref.UID), nil
	}
	return true, "", nil
}

// secretRecheck is how often a cache read with its namespace's credentials reads them again.
const secretRecheck = 30 * time.Second
