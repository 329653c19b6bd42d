// Package weightscache reconciles ModelDataCacheConfig: it asks every target node's agent to
// hold the cache (through the node's NodeCache), gathers what the agents report, labels the
// nodes that hold it, and removes it everywhere before the object goes.
package weightscache

import (
	"context"
	"fmt"
	"slices"
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
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
)

// uidIndex indexes ModelDataCacheConfigs by UID, to map NodeCache events to them.
const uidIndex = "metadata.uid"

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
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modeldatacacheconfigs/status;modeldatacacheconfigs/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches,verbs=get;list;watch;create;patch;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler with mgr.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &inferencev1.ModelDataCacheConfig{}, uidIndex,
		func(o client.Object) []string { return []string{string(o.GetUID())} }); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("weightscache").
		For(&inferencev1.ModelDataCacheConfig{}).
		Watches(&corev1.Node{}, controller.EnqueueAll(r.Client, func() client.ObjectList { return &inferencev1.ModelDataCacheConfigList{} }, nil),
			builder.WithPredicates(controller.NodePlacementChanged)).
		Watches(&prewarmv1alpha1.NodeCache{}, handler.EnqueueRequestsFromMapFunc(r.cachesOfNode)).
		Complete(r)
}

// cachesOfNode maps a NodeCache event to the caches it asks for or reports on.
func (r *Reconciler) cachesOfNode(ctx context.Context, o client.Object) []reconcile.Request {
	nc, ok := o.(*prewarmv1alpha1.NodeCache)
	if !ok {
		return nil
	}
	uids := map[string]bool{}
	for _, c := range nc.Spec.Caches {
		uids[c.UID] = true
	}
	for _, c := range nc.Status.Caches {
		uids[c.UID] = true
	}
	for _, d := range nc.Status.Demands {
		uids[d.UID] = true
	}
	var reqs []reconcile.Request
	for uid := range uids {
		list := &inferencev1.ModelDataCacheConfigList{}
		if err := r.Client.List(ctx, list, client.MatchingFields{uidIndex: uid}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing ModelDataCacheConfigs")
			continue
		}
		for _, m := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&m)})
		}
	}
	return reqs
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
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes); err != nil {
		return 0, err
	}
	nodeCaches := &prewarmv1alpha1.NodeCacheList{}
	if err := r.Client.List(ctx, nodeCaches); err != nil {
		return 0, err
	}
	byNode := map[string]*prewarmv1alpha1.NodeCache{}
	for i := range nodeCaches.Items {
		byNode[nodeCaches.Items[i].Name] = &nodeCaches.Items[i]
	}

	p, err := r.plan(ctx, m, nodes.Items, byNode)
	if err != nil {
		return 0, err
	}
	full, err := r.ask(ctx, m, p, nodes.Items, nodeCaches.Items, byNode)
	if err != nil {
		return 0, err
	}
	st := r.gather(m, p.targets, p.retained, byNode, full)
	recordNodeEvents := r.nodeEvents(m, st)
	if err := r.label(ctx, m, nodes.Items, st, deleting); err != nil {
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
	requeue  time.Duration
}

// verdict is a condition the cache's spec or surroundings impose; failed marks the cache Failed
// (and then no node is asked for it).
type verdict struct {
	reason, message string
	failed          bool
}

// plan decides the cache's request and its targets. A cache being deleted has no targets: every
// request is withdrawn.
func (r *Reconciler) plan(ctx context.Context, m *inferencev1.ModelDataCacheConfig, nodes []corev1.Node, byNode map[string]*prewarmv1alpha1.NodeCache) (plan, error) {
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
	for i := range nodes {
		n := &nodes[i]
		if ok, _ := placement.Selects(m.Spec.Placement, n); !ok {
			if demanded(byNode[n.Name], m) {
				// Pods of the cache's namespace on this node ask for it (their CSI volume),
				// though the placement does not select it: the node holds it for them while
				// they are there.
				p.targets = append(p.targets, n)
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
			continue // never asked here: nothing to keep
		}
		since := asked.RetainedSince
		t, err := time.Parse(time.RFC3339, since)
		if err != nil {
			since, t = now.UTC().Format(time.RFC3339), now
		}
		left := r.Config.Retention() - now.Sub(t)
		if left <= 0 {
			continue // kept long enough: withdrawn
		}
		p.retained[n.Name] = retention{since: since, until: t.Add(r.Config.Retention()), why: why}
		if p.requeue == 0 || left < p.requeue {
			p.requeue = left
		}
	}
	return p, nil
}

// demanded reports whether pods of m's namespace on nc's node ask for m through prewarm's CSI
// volume. Pods of another namespace naming m make nothing happen (their mount is refused).
func demanded(nc *prewarmv1alpha1.NodeCache, m *inferencev1.ModelDataCacheConfig) bool {
	if nc == nil {
		return false
	}
	return slices.ContainsFunc(nc.Status.Demands, func(d prewarmv1alpha1.CacheDemand) bool {
		return d.UID == string(m.UID) && d.Namespace == m.Namespace
	})
}

// ask asks each target node for the cache and each retained node to keep it, and withdraws the
// request from every other node. It returns the nodes it could not ask because they are already
// asked for MaxCachesPerNode other caches.
func (r *Reconciler) ask(ctx context.Context, m *inferencev1.ModelDataCacheConfig, p plan, nodes []corev1.Node, nodeCaches []prewarmv1alpha1.NodeCache, byNode map[string]*prewarmv1alpha1.NodeCache) (map[string]bool, error) {
	uid := string(m.UID)
	isTarget := map[string]bool{}
	for _, n := range p.targets {
		isTarget[n.Name] = true
	}
	full := map[string]bool{}
	for i := range nodes {
		n := &nodes[i]
		want := p.entry
		if keep, ok := p.retained[n.Name]; ok {
			want.RetainedSince = keep.since
		} else if !isTarget[n.Name] {
			continue
		}
		asked := requestFor(byNode[n.Name], uid)
		sealed, err := sealFor(byNode[n.Name], n.Name, uid, p.access, asked)
		if err != nil {
			return nil, fmt.Errorf("sealing the credentials for node %s: %w", n.Name, err)
		}
		want.Credentials = sealed
		if asked != nil && equality.Semantic.DeepEqual(*asked, want) {
			continue
		}
		if asked == nil && byNode[n.Name] != nil && len(byNode[n.Name].Spec.Caches) >= prewarmv1alpha1.MaxCachesPerNode {
			full[n.Name] = true
			continue
		}
		if err := applyEntry(ctx, r.Client, n, &want, uid); err != nil {
			if asked == nil && apierrors.IsInvalid(err) {
				// Another cache took the last place since the informer's view: the API server
				// refuses the list's growth past its maxItems.
				full[n.Name] = true
				continue
			}
			return nil, fmt.Errorf("asking node %s for the cache: %w", n.Name, err)
		}
	}
	for i := range nodeCaches {
		nc := &nodeCaches[i]
		if _, keep := p.retained[nc.Name]; isTarget[nc.Name] || keep || requestFor(nc, uid) == nil {
			continue
		}
		if err := withdrawEntry(ctx, r.Client, nc, uid); err != nil {
			return nil, fmt.Errorf("withdrawing the cache from node %s: %w", nc.Name, err)
		}
	}
	return full, nil
}

// label puts the cache's label on exactly the nodes that hold it Ready (retained nodes too: new
// pods prefer them again once they are admitted), and on none while the cache is deleted.
func (r *Reconciler) label(ctx context.Context, m *inferencev1.ModelDataCacheConfig, nodes []corev1.Node, st inferencev1.ModelDataCacheConfigStatus, deleting bool) error {
	label := inferencev1.WeightsCacheReadyLabel(string(m.UID))
	ready := map[string]bool{}
	for _, ns := range st.Nodes {
		if ns.State == inferencev1.CacheReady {
			ready[ns.Name] = true
		}
	}
	for i := range nodes {
		if err := controller.SetNodeLabel(ctx, r.Client, &nodes[i], label, ready[nodes[i].Name] && !deleting); err != nil {
			return err
		}
	}
	return nil
}

// finishDeletion reports the nodes that still hold the deleted cache, and once none does, lets
// the cache go.
func (r *Reconciler) finishDeletion(ctx context.Context, m *inferencev1.ModelDataCacheConfig, st inferencev1.ModelDataCacheConfigStatus, byNode map[string]*prewarmv1alpha1.NodeCache, recordNodeEvents func()) (time.Duration, error) {
	st.State = inferencev1.CacheDeleting
	holders := holdersOf(string(m.UID), byNode)
	if len(holders) == 0 {
		setCondition(&st, m, metav1.ConditionFalse, "Deleted", "every node has removed the cache")
	} else {
		setCondition(&st, m, metav1.ConditionFalse, "Deleting",
			fmt.Sprintf("waiting for %d node(s) to remove the cache's files: %s", len(holders), controller.Summarize(holders, 5)))
	}
	if err := r.writeStatus(ctx, m, st); err != nil {
		return 0, err
	}
	recordNodeEvents()
	if len(holders) > 0 {
		return 0, nil // NodeCache events bring us back
	}
	if err := r.deleteLegacyToken(ctx, m); err != nil {
		return 0, err
	}
	if err := controller.RemoveFinalizer(ctx, r.Client, m, inferencev1.CacheFinalizer); err != nil {
		return 0, err
	}
	ctrl.LoggerFrom(ctx).Info("cache removed from every node")
	r.Metrics.WeightsCache(m, true)
	controller.Event(r.Recorder, m, corev1.EventTypeNormal, "CleanupDone", "Delete", "every node has removed the cache's files and labels")
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
	for _, n := range st.Nodes {
		if b, ok := before[n.Name]; ok && b.State == n.State && b.Reason == n.Reason {
			continue
		}
		switch n.State {
		case inferencev1.CacheReady:
			event(corev1.EventTypeNormal, "NodeReady", fmt.Sprintf("node %s holds the cache: %s", n.Name, n.Message))
		case inferencev1.CacheFailed:
			event(corev1.EventTypeWarning, "NodeFailed", fmt.Sprintf("node %s: %s: %s", n.Name, n.Reason, n.Message))
		case inferencev1.CacheDownloading:
			if _, ok := before[n.Name]; !ok || before[n.Name].State != inferencev1.CacheDownloading {
				event(corev1.EventTypeNormal, "NodeDownloading", fmt.Sprintf("node %s started downloading", n.Name))
			}
		}
	}
	return func() {
		for _, f := range record {
			f()
		}
	}
}
