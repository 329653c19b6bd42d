// Package weightscache reconciles ModelDataCacheConfig: it asks every target node's agent to
// hold the cache (through the node's NodeCache), gathers what the agents report, labels the
// nodes that hold it, and removes it everywhere before the object goes.
package weightscache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
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
	Now     func() time.Time

	podIPs podIPs
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs/status;modeldatacacheconfigs/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches,verbs=get;list;watch;create;patch;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler with mgr, whose cache must have Indexes and
// controller.NodeIndexes (controller.RegisterIndexes).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("weightscache").
		For(&inferencev1.ModelDataCacheConfig{}).
		Watches(&corev1.Node{}, controller.EnqueueAll(r.Client, func() client.ObjectList { return &inferencev1.ModelDataCacheConfigList{} }, nil),
			builder.WithPredicates(predicate.Or(controller.NodePlacementChanged, controller.NodeAddressesChanged))).
		Watches(&prewarmv1alpha1.NodeCache{}, nodeCacheEvents{r}).
		Complete(r)
}

// Reconcile brings one cache's nodes, labels and status to what its spec asks.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	requeue, err := r.reconcile(ctx, req)
	r.Metrics.ReconcileError("weightscache", err)
	return ctrl.Result{RequeueAfter: requeue}, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (time.Duration, error) {
	m := &inferencev1.ModelDataCacheConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		return 0, client.IgnoreNotFound(err)
	}
	deleting := !m.DeletionTimestamp.IsZero()
	switch {
	case deleting && !controllerutil.ContainsFinalizer(m, inferencev1.CacheFinalizer):
		return 0, nil
	case !deleting:
		if err := controller.AddFinalizer(ctx, r.Client, m, inferencev1.CacheFinalizer); err != nil {
			return 0, err
		}
	}
	nodes, related, byNode, err := r.fleet(ctx, m)
	if err != nil {
		return 0, err
	}
	p, err := r.plan(ctx, m, nodes, byNode)
	if err != nil {
		return 0, err
	}
	if err := r.readTargets(ctx, p.targets, byNode); err != nil {
		return 0, err
	}
	if err := r.checkPeerAddrs(ctx, &p, byNode); err != nil {
		return 0, err
	}
	full, err := r.ask(ctx, m, p, related, byNode)
	if err != nil {
		return 0, err
	}
	st, ready := r.gather(m, p.targets, p.retained, byNode, full)
	noteExcluded(&st, p.excluded)
	recordNodeEvents := r.nodeEvents(m, st)
	if err := r.label(ctx, m, p, ready, deleting); err != nil {
		return 0, err
	}
	if v := p.verdict; v != nil {
		if v.failed {
			st.State = inferencev1.CacheFailed
		}
		setCondition(&st, m, metav1.ConditionFalse, v.reason, v.message)
	}
	if deleting {
		return r.finishDeletion(ctx, m, st, byNode, recordNodeEvents)
	}
	if err := r.writeStatus(ctx, m, st); err != nil {
		return 0, err
	}
	recordNodeEvents()
	r.Metrics.WeightsCache(m, false)
	return p.requeue, nil
}

// plan is what one reconcile decides for a cache: the request nodes get, how they read the
// source, the targets and the nodes that keep their copy for now, or why no node is asked.
type plan struct {
	entry    prewarmv1alpha1.CacheRequest
	access   access
	verdict  *verdict
	targets  []*corev1.Node
	retained map[string]retention
	// retainedNodes are the nodes of retained.
	retainedNodes []*corev1.Node
	// excluded are the nodes the placement selects that are neither targets nor retained: the
	// pods could not run there (a taint they do not tolerate, a cordon).
	excluded excluded
	// peerAddrs are the targets' peer addresses that other agents may be sent (peerAddrsOf).
	peerAddrs map[string]string
	requeue   time.Duration
}

// excluded counts nodes left out of a cache's targets, by why.
type excluded struct {
	count int
	// nodes are the first few nodes left out for each reason.
	nodes map[string][]string
	// whys are the reasons in the order first seen.
	whys []string
}

// maxExcludedNamed is how many nodes left out for one reason a message names.
const maxExcludedNamed = 5

func (e *excluded) add(why, node string) {
	if e.nodes == nil {
		e.nodes = map[string][]string{}
	}
	if _, ok := e.nodes[why]; !ok {
		e.whys = append(e.whys, why)
	}
	e.count++
	if len(e.nodes[why]) < maxExcludedNamed {
		e.nodes[why] = append(e.nodes[why], node)
	}
}

// String says which nodes are left out and why ("": none), for the Ready condition.
func (e excluded) String() string {
	if e.count == 0 {
		return ""
	}
	parts := make([]string, len(e.whys))
	for i, why := range e.whys {
		parts[i] = fmt.Sprintf("%s (%s)", why, strings.Join(e.nodes[why], ", "))
	}
	return fmt.Sprintf("%d node(s) the placement selects are left out, the pods could not run there: %s", e.count, strings.Join(parts, "; "))
}

// verdict is a condition the cache's spec or surroundings impose; failed marks the cache Failed
// (and then no node is asked for it).
type verdict struct {
	reason, message string
	failed          bool
}

// plan decides the cache's request and its targets. A cache being deleted has no targets: every
// request is withdrawn.
func (r *Reconciler) plan(ctx context.Context, m *inferencev1.ModelDataCacheConfig, nodes []*corev1.Node, byNode map[string]*prewarmv1alpha1.NodeCache) (plan, error) {
	p := plan{retained: map[string]retention{}}
	src, srcErr := r.Config.CacheSource(m.Spec.ModelSourceConfig)
	if src.Type != inferencev1.ModelSourceHuggingFace && m.Status.ResolvedRevision != "" {
		// Pinned to the content the first node holds: objects rewritten under the same location
		// are not fetched by any other node (nor by a cold pod), and say so.
		src.Revision = m.Status.ResolvedRevision
	}
	p.entry = prewarmv1alpha1.CacheRequest{UID: string(m.UID), Namespace: m.Namespace, Name: m.Name, Root: m.Spec.HostPath, Source: src}
	if !m.DeletionTimestamp.IsZero() {
		return p, nil
	}
	ok, why, err := r.parentWants(ctx, m)
	if err != nil {
		return p, err
	}
	if !ok {
		p.verdict = &verdict{inferencev1.ReasonParentNotFound, why, true}
		return p, nil
	}
	if allowed, why := r.Config.CacheRootAllowed(m.Spec.HostPath); !allowed {
		p.verdict = &verdict{inferencev1.ReasonHostPathNotAllowed, why, true}
		return p, nil
	}
	if srcErr != nil {
		p.verdict = &verdict{inferencev1.ReasonSourceNotAllowed, srcErr.Error(), true}
		return p, nil
	}
	if p.access, err = r.sourceAccess(ctx, m, src); err != nil {
		return p, err
	}
	if !p.access.creds.Empty() || p.access.tokenProblem != "" || p.access.refused != "" {
		// The namespace's Secrets are read, not watched: look again, so that a replaced or
		// revoked token reaches the nodes (and a fixed one the cache) without waiting for
		// another change.
		p.requeue = secretRecheck
	}
	switch {
	case p.access.refused != "":
		p.verdict = &verdict{inferencev1.ReasonSourceNotAllowed, p.access.refused, true}
		return p, nil
	case p.access.tokenProblem != "":
		p.verdict = &verdict{reason: inferencev1.ReasonTokenSecretProblem, message: p.access.tokenProblem} // the nodes try without it
	}

	// Targets: the nodes the parent's pods may run on. A node the placement selects but whose
	// scheduling state keeps the pods off for now (cordoned, tainted, unreachable) is not a
	// target, but keeps what it was asked for until the retention passes: that state passes,
	// and the model will be wanted there again.
	now := r.Now()
	rules := r.Config.Rules()
	for _, n := range nodes {
		if ok, _ := rules.Selects(m.Spec.Placement, n); !ok {
			// Pods of the cache's namespace on this node ask for it (their CSI volume),
			// though the placement does not select it: the node holds it for them while they
			// are there. The agent's word for it is not enough (it would get the namespace's
			// credentials and its pods' preference): the pods must be there.
			if demanded(byNode[n.Name], m) {
				there, err := r.podsDemand(ctx, n.Name, m)
				if err != nil {
					return p, err
				}
				if there {
					p.targets = append(p.targets, n)
				}
			}
			continue
		}
		ok, why := placement.Admits(m.Spec.Placement, n)
		if ok {
			p.targets = append(p.targets, n)
			continue
		}
		asked := requestFor(byNode[n.Name], string(m.UID))
		if asked == nil {
			p.excluded.add(why, n.Name) // never asked here: nothing to keep
			continue
		}
		since := asked.RetainedSince
		t, err := time.Parse(time.RFC3339, since)
		if err != nil {
			since, t = now.UTC().Format(time.RFC3339), now
		}
		left := r.Config.Retention() - now.Sub(t)
		if left <= 0 {
			p.excluded.add(why, n.Name) // kept long enough: withdrawn
			continue
		}
		p.retained[n.Name] = retention{since: since, until: t.Add(r.Config.Retention()), why: why}
		p.retainedNodes = append(p.retainedNodes, n)
		if p.requeue == 0 || left < p.requeue {
			p.requeue = left
		}
	}
	return p, nil
}

// podsDemand reports whether a pod of m's namespace that has not finished runs on node (is
// bound to it) with prewarm's CSI volume naming m: what a node's reported demand must be borne
// out by. It asks the API server (pods bound to one node, of one namespace), not the agent.
func (r *Reconciler) podsDemand(ctx context.Context, node string, m *inferencev1.ModelDataCacheConfig) (bool, error) {
	if r.APIReader == nil {
		return false, nil
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(m.Namespace), client.MatchingFields{"spec.nodeName": node}); err != nil {
		return false, fmt.Errorf("listing namespace %s's pods on node %s, to check its demand: %w", m.Namespace, node, err)
	}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName != node || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if prewarmv1alpha1.VolumeCacheUID(v) == string(m.UID) {
				return true, nil
			}
		}
	}
	return false, nil
}

// demanded reports whether pods of m's namespace on nc's node ask for m through prewarm's CSI
// volume, as nc's agent reports it. Pods of another namespace naming m make nothing happen
// (their mount is refused).
func demanded(nc *prewarmv1alpha1.NodeCache, m *inferencev1.ModelDataCacheConfig) bool {
	if nc == nil {
		return false
	}
	return slices.ContainsFunc(nc.Status.Demands, func(d prewarmv1alpha1.CacheDemand) bool {
		return d.UID == string(m.UID) && d.Namespace == m.Namespace
	})
}

// ask asks each target node for the cache and each retained node to keep it, and withdraws the
// request from every other node that has it (related: the NodeCaches that name the cache). It
// returns the nodes it could not ask because they are already asked for MaxCachesPerNode other
// caches. The writes go out in parallel.
func (r *Reconciler) ask(ctx context.Context, m *inferencev1.ModelDataCacheConfig, p plan, related []*prewarmv1alpha1.NodeCache, byNode map[string]*prewarmv1alpha1.NodeCache) (map[string]bool, error) {
	uid := string(m.UID)
	isTarget := map[string]bool{}
	for _, n := range p.targets {
		isTarget[n.Name] = true
	}
	type write struct {
		node  *corev1.Node
		want  prewarmv1alpha1.CacheRequest
		fresh bool // the node has no request for the cache yet
	}
	var writes []write
	full := map[string]bool{}
	var peers map[string][]prewarmv1alpha1.CachePeer
	if !r.Config.Peers.Disabled {
		peers = assignPeers(uid, p.targets, byNode, p.peerAddrs, r.Config.Peers.GroupSize)
	}
	for _, n := range slices.Concat(p.targets, p.retainedNodes) {
		want := p.entry
		asked := requestFor(byNode[n.Name], uid)
		if keep, ok := p.retained[n.Name]; ok {
			want.RetainedSince = keep.since
			if asked != nil {
				want.Peers = asked.Peers // downloads nothing: not worth a write
			}
		} else {
			want.Peers = peers[n.Name]
		}
		sealed, err := sealFor(byNode[n.Name], n.Name, uid, p.access, asked)
		if err != nil {
			return nil, fmt.Errorf("sealing the credentials for node %s: %w", n.Name, err)
		}
		want.Credentials = sealed
		if asked != nil && (equality.Semantic.DeepEqual(*asked, want) || pinNotNeeded(*asked, want, reportFor(byNode[n.Name], uid))) {
			continue
		}
		if asked == nil && byNode[n.Name] != nil && len(byNode[n.Name].Spec.Caches) >= prewarmv1alpha1.MaxCachesPerNode {
			full[n.Name] = true
			continue
		}
		writes = append(writes, write{node: n, want: want, fresh: asked == nil})
	}
	var mu sync.Mutex
	err := controller.ForEach(ctx, writes, func(ctx context.Context, w write) error {
		if err := applyEntry(ctx, r.Client, w.node, &w.want, uid); err != nil {
			if w.fresh && apierrors.IsInvalid(err) {
				// Another cache took the last place since the informer's view: the API server
				// refuses the list's growth past its maxItems.
				mu.Lock()
				full[w.node.Name] = true
				mu.Unlock()
				return nil
			}
			return fmt.Errorf("asking node %s for the cache: %w", w.node.Name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var withdraw []*prewarmv1alpha1.NodeCache
	for _, nc := range related {
		if _, keep := p.retained[nc.Name]; isTarget[nc.Name] || keep || requestFor(nc, uid) == nil {
			continue
		}
		withdraw = append(withdraw, nc)
	}
	err = controller.ForEach(ctx, withdraw, func(ctx context.Context, nc *prewarmv1alpha1.NodeCache) error {
		if err := withdrawEntry(ctx, r.Client, nc, uid); err != nil {
			return fmt.Errorf("withdrawing the cache from node %s: %w", nc.Name, err)
		}
		return nil
	})
	return full, err
}

// pinNotNeeded reports whether a node's request differs from want only by the revision the
// cache was pinned to since, and the node needs no new request for it: it is downloading (what
// it lists now is what it reports at the end; a node that ends with another revision is not
// counted Ready, and is asked again with the pin), or it holds that revision. Re-asking every
// node of a fleet when the first one is Ready would cost one write per node.
func pinNotNeeded(asked, want prewarmv1alpha1.CacheRequest, rep *prewarmv1alpha1.CacheStatus) bool {
	pin := want.Source.Revision
	if asked.Source.Revision != "" || pin == "" || rep == nil {
		return false
	}
	asked.Source.Revision = pin
	if !equality.Semantic.DeepEqual(asked, want) {
		return false
	}
	switch rep.State {
	case inferencev1.CacheDownloading:
		return rep.Revision == "" || rep.Revision == pin
	case inferencev1.CacheReady:
		return rep.Revision == pin
	}
	return false
}

// fleet reads, from the informer cache and without copying, what one reconcile of m needs: the
// nodes its placement may select (through the instance-type index when it names types) and
// the nodes whose NodeCache names the cache (through the cache index), with those NodeCaches.
func (r *Reconciler) fleet(ctx context.Context, m *inferencev1.ModelDataCacheConfig) ([]*corev1.Node, []*prewarmv1alpha1.NodeCache, map[string]*prewarmv1alpha1.NodeCache, error) {
	values, all := r.Config.Rules().Candidates(m.Spec.Placement)
	nodes, err := controller.CandidateNodes(ctx, r.Client, values, all)
	if err != nil {
		return nil, nil, nil, err
	}
	list := &prewarmv1alpha1.NodeCacheList{}
	if err := r.Client.List(ctx, list, client.MatchingFields{cacheIndex: string(m.UID)}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, nil, err
	}
	related := make([]*prewarmv1alpha1.NodeCache, len(list.Items))
	byNode := make(map[string]*prewarmv1alpha1.NodeCache, len(list.Items))
	for i := range list.Items {
		related[i] = &list.Items[i]
		byNode[list.Items[i].Name] = &list.Items[i]
	}
	have := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		have[n.Name] = true
	}
	for _, nc := range related {
		if have[nc.Name] {
			continue
		}
		// Not of the placement's instance types, but its NodeCache names the cache: pods there
		// ask for it, or it was asked before the placement changed.
		n := &corev1.Node{}
		switch err := r.Client.Get(ctx, types.NamespacedName{Name: nc.Name}, n, client.UnsafeDisableDeepCopy); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, nil, nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, related, byNode, nil
}

// readTargets adds to byNode the NodeCaches of the targets that do not name the cache yet: what
// their agents report (the key credentials are sealed to, how many caches they hold).
func (r *Reconciler) readTargets(ctx context.Context, targets []*corev1.Node, byNode map[string]*prewarmv1alpha1.NodeCache) error {
	for _, n := range targets {
		if byNode[n.Name] != nil {
			continue
		}
		nc := &prewarmv1alpha1.NodeCache{}
		switch err := r.Client.Get(ctx, types.NamespacedName{Name: n.Name}, nc, client.UnsafeDisableDeepCopy); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			byNode[n.Name] = nc
		}
	}
	return nil
}

// label puts the cache's label on exactly the nodes that hold it Ready (retained nodes too: new
// pods prefer them again once they are admitted), and on none while the cache is deleted. It
// looks at the targets, the retained nodes and the nodes that carry the label now (an index).
func (r *Reconciler) label(ctx context.Context, m *inferencev1.ModelDataCacheConfig, p plan, ready map[string]bool, deleting bool) error {
	key := inferencev1.WeightsCacheReadyLabel(string(m.UID))
	labelled, err := controller.LabelledNodes(ctx, r.Client, key)
	if err != nil {
		return err
	}
	want := ready
	if deleting {
		want = nil
	}
	return controller.ApplyLabels(ctx, r.Client, key, controller.LabelChanges(slices.Concat(p.targets, p.retainedNodes, labelled), key, want))
}

// finishDeletion reports the nodes that still hold the deleted cache, and once none does (or
// controller.deletionTimeout has passed), lets the cache go.
func (r *Reconciler) finishDeletion(ctx context.Context, m *inferencev1.ModelDataCacheConfig, st inferencev1.ModelDataCacheConfigStatus, byNode map[string]*prewarmv1alpha1.NodeCache, recordNodeEvents func()) (time.Duration, error) {
	st.State = inferencev1.CacheDeleting
	holders := holdersOf(string(m.UID), byNode)
	// A node's word that it still holds the cache is all there is to wait on; an agent that
	// never stops saying so (a forged entry) must not hold the cache, and so its namespace's
	// deletion, forever. Agents remove what no request names either way.
	left := r.Config.DeletionTimeout() - r.Now().Sub(m.DeletionTimestamp.Time)
	waiting := len(holders) > 0 && left > 0
	if len(holders) == 0 || waiting {
		if waiting {
			setCondition(&st, m, metav1.ConditionFalse, "Deleting",
				fmt.Sprintf("waiting for %d node(s) to remove the cache's files: %s", len(holders), controller.Summarize(holders, 5)))
		} else {
			setCondition(&st, m, metav1.ConditionFalse, "Deleted", "every node has removed the cache")
		}
		if err := r.writeStatus(ctx, m, st); err != nil {
			return 0, err
		}
	}
	recordNodeEvents()
	if waiting {
		return left, nil // NodeCache events bring us back sooner
	}
	if len(holders) > 0 {
		ctrl.LoggerFrom(ctx).Info("deleting the cache while nodes still report it", "nodes", holders)
		controller.Event(r.Recorder, m, corev1.EventTypeWarning, controller.EventDeletionTimeout, "Delete",
			fmt.Sprintf("%d node(s) still report the cache %s after it was deleted (controller.deletionTimeout): %s; it goes, and their agents remove the files of caches no request names",
				len(holders), r.Config.DeletionTimeout(), controller.Summarize(holders, 5)))
	}
	if err := r.deleteLegacyToken(ctx, m); err != nil {
		return 0, err
	}
	if err := controller.RemoveFinalizer(ctx, r.Client, m, inferencev1.CacheFinalizer); err != nil {
		return 0, err
	}
	ctrl.LoggerFrom(ctx).Info("cache removed from every node")
	r.Metrics.WeightsCache(m, true)
	controller.Event(r.Recorder, m, corev1.EventTypeNormal, controller.EventCleanupDone, "Delete", "every node has removed the cache's files and labels")
	return 0, nil
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
	default:
		return false, fmt.Sprintf("spec.parentReference.kind %q: prewarm serves caches of InferenceEndpointConfigs and JumpStartModels only", ref.Kind), nil
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

// holdersOf lists the nodes whose NodeCache still asks for or reports cache uid.
func holdersOf(uid string, byNode map[string]*prewarmv1alpha1.NodeCache) []string {
	var out []string
	for name, nc := range byNode {
		if requestFor(nc, uid) != nil || reportFor(nc, uid) != nil {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// applyEntry puts the cache into the node's NodeCache, creating it if needed. Each cache is its
// own server-side apply field manager, so caches never overwrite each other's entries.
func applyEntry(ctx context.Context, c client.Client, n *corev1.Node, entry *prewarmv1alpha1.CacheRequest, uid string) error {
	caches := []any{} // empty, not null: this cache's manager then owns no entry
	if entry != nil {
		e, err := runtime.DefaultUnstructuredConverter.ToUnstructured(entry)
		if err != nil {
			return err
		}
		caches = append(caches, e)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": prewarmv1alpha1.GroupVersion.String(),
		"kind":       "NodeCache",
		"metadata": map[string]any{
			"name": n.Name,
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Node", "name": n.Name, "uid": string(n.UID),
			}},
		},
		"spec": map[string]any{"caches": caches},
	}}
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(fieldManager(uid)), client.ForceOwnership)
}

// withdrawEntry removes the cache from a NodeCache: the cache's field manager applies nothing.
func withdrawEntry(ctx context.Context, c client.Client, nc *prewarmv1alpha1.NodeCache, uid string) error {
	n := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: nc.Name}, n); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		n.Name = nc.Name // the node is gone; the NodeCache follows it (owner reference)
		for _, ref := range nc.OwnerReferences {
			if ref.Kind == "Node" {
				n.UID = ref.UID
			}
		}
	}
	return applyEntry(ctx, c, n, nil, uid)
}

func fieldManager(uid string) string { return "prewarm-cache-" + uid }

// reportFor returns the agent's report on cache uid in nc's status, or nil.
func reportFor(nc *prewarmv1alpha1.NodeCache, uid string) *prewarmv1alpha1.CacheStatus {
	if nc == nil {
		return nil
	}
	if i := slices.IndexFunc(nc.Status.Caches, func(c prewarmv1alpha1.CacheStatus) bool { return c.UID == uid }); i >= 0 {
		return &nc.Status.Caches[i]
	}
	return nil
}

// retention is why and how long a node that is not a target keeps a cache.
type retention struct {
	since string // RFC 3339, as in the NodeCache request
	until time.Time
	why   string
}

// requestFor returns nc's request for cache uid, or nil.
func requestFor(nc *prewarmv1alpha1.NodeCache, uid string) *prewarmv1alpha1.CacheRequest {
	if nc == nil {
		return nil
	}
	if i := slices.IndexFunc(nc.Spec.Caches, func(c prewarmv1alpha1.CacheRequest) bool { return c.UID == uid }); i >= 0 {
		return &nc.Spec.Caches[i]
	}
	return nil
}

// secretRecheck is how often a cache read with its namespace's credentials reads them again.
const secretRecheck = 30 * time.Second

// maxNodeEventTargets is the most target nodes a cache may have for its nodes' every transition
// to be an event (on more, only their failures are): an event is a write, and a fleet's caches
// would write one per node and transition.
const maxNodeEventTargets = 16

// nodeEvents returns what records each node's cache becoming Ready, Failed or Downloading: to
// be called once st is written, so that a status write that conflicts (and is retried from the
// stored status) does not tell of a transition twice.
func (r *Reconciler) nodeEvents(m *inferencev1.ModelDataCacheConfig, st inferencev1.ModelDataCacheConfigStatus) func() {
	var record []func()
	event := func(eventType, reason, note string) {
		record = append(record, func() { controller.Event(r.Recorder, m, eventType, reason, "Download", note) })
	}
	before := map[string]inferencev1.NodeCacheStatus{}
	for _, n := range m.Status.Nodes {
		before[n.Name] = n
	}
	// On a fleet larger than status.nodes holds, a node missing from either list says nothing
	// of its transitions: only the failures of listed nodes are told (the counts, the Ready
	// condition and each node's NodeCache tell the rest), not one event per node.
	small := int(st.TargetNodes) <= maxNodeEventTargets && len(m.Status.Nodes) < inferencev1.MaxStatusNodes && len(st.Nodes) < inferencev1.MaxStatusNodes
	for _, n := range st.Nodes {
		b, ok := before[n.Name]
		if ok && b.State == n.State && b.Reason == n.Reason {
			continue
		}
		if !small && (!ok || n.State != inferencev1.CacheFailed) {
			continue
		}
		switch n.State {
		case inferencev1.CacheReady:
			event(corev1.EventTypeNormal, controller.EventNodeReady, fmt.Sprintf("node %s holds the cache: %s", n.Name, n.Message))
		case inferencev1.CacheFailed:
			event(corev1.EventTypeWarning, controller.EventNodeFailed, fmt.Sprintf("node %s: %s: %s", n.Name, n.Reason, n.Message))
		case inferencev1.CacheDownloading:
			if _, ok := before[n.Name]; !ok || before[n.Name].State != inferencev1.CacheDownloading {
				event(corev1.EventTypeNormal, controller.EventNodeDownloading, fmt.Sprintf("node %s started downloading", n.Name))
			}
		}
	}
	return func() {
		for _, f := range record {
			f()
		}
	}
}
