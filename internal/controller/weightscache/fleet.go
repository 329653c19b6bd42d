package weightscache

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// fleet is one reconcile's picture of a cache's nodes, read once from the informer cache and
// without copying: the nodes its placement may select, and the NodeCaches that name the cache
// or belong to its targets. Every phase reads the nodes' requests and reports through it.
type fleet struct {
	uid   string
	nodes []*corev1.Node
	// named are the NodeCaches that name the cache: ask for it, report on it or demand it.
	named  []*prewarmv1alpha1.NodeCache
	byNode map[string]*prewarmv1alpha1.NodeCache
	// newer, when set, is the writer's request for a node that the informer does not show yet
	// (Requests.latest).
	newer func(node, uid string, gen int64, ncUID types.UID) (*prewarmv1alpha1.CacheRequest, bool)
}

// readFleet reads the nodes m's placement may select (through the instance-type index when it
// names types) and the nodes whose NodeCache names the cache (through the cache index), with
// those NodeCaches.
func (r *Reconciler) readFleet(ctx context.Context, m *inferencev1.ModelDataCacheConfig) (*fleet, error) {
	values, all := r.Config.Rules().Candidates(m.Spec.Placement)
	nodes, err := controller.CandidateNodes(ctx, r.Client, values, all)
	if err != nil {
		return nil, err
	}
	list := &prewarmv1alpha1.NodeCacheList{}
	if err := r.Client.List(ctx, list, client.MatchingFields{cacheIndex: string(m.UID)}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	f := &fleet{uid: string(m.UID), nodes: nodes,
		named: make([]*prewarmv1alpha1.NodeCache, len(list.Items)), byNode: make(map[string]*prewarmv1alpha1.NodeCache, len(list.Items))}
	for i := range list.Items {
		f.named[i] = &list.Items[i]
		f.byNode[list.Items[i].Name] = &list.Items[i]
	}
	have := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		have[n.Name] = true
	}
	for _, nc := range f.named {
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
			return nil, err
		}
		f.nodes = append(f.nodes, n)
	}
	return f, nil
}

// readTargets adds the NodeCaches of the targets that do not name the cache yet: what their
// agents report (the key credentials are sealed to, how many caches they hold).
func (f *fleet) readTargets(ctx context.Context, c client.Reader, targets []*corev1.Node) error {
	for _, n := range targets {
		if f.byNode[n.Name] != nil {
			continue
		}
		nc := &prewarmv1alpha1.NodeCache{}
		switch err := c.Get(ctx, types.NamespacedName{Name: n.Name}, nc, client.UnsafeDisableDeepCopy); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			f.byNode[n.Name] = nc
		}
	}
	return nil
}

// nodeCache is node's NodeCache, or nil.
func (f *fleet) nodeCache(node string) *prewarmv1alpha1.NodeCache { return f.byNode[node] }

// request is node's request for the cache, or nil.
func (f *fleet) request(node string) *prewarmv1alpha1.CacheRequest {
	return requestFor(f.byNode[node], f.uid)
}

// latest is node's request for the cache as the writer has it (fleet.newer), or as the informer
// shows it.
func (f *fleet) latest(node string) *prewarmv1alpha1.CacheRequest {
	if f.newer != nil {
		var gen int64
		var ncUID types.UID
		if nc := f.byNode[node]; nc != nil {
			gen, ncUID = nc.Generation, nc.UID
		}
		if e, ok := f.newer(node, f.uid, gen, ncUID); ok {
			return e
		}
	}
	return f.request(node)
}

// report is node's agent's report on the cache, or nil.
func (f *fleet) report(node string) *prewarmv1alpha1.CacheStatus {
	return reportFor(f.byNode[node], f.uid)
}

// holders lists the nodes whose NodeCache still asks for the cache, or reports it and was asked
// for it (asked): a node never asked is not waited for, whatever it reports.
func (f *fleet) holders(asked map[string]bool) []string {
	var out []string
	for name := range f.byNode {
		if f.request(name) != nil || asked[name] && f.report(name) != nil {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// askedNodes lists the nodes whose NodeCache asks for the cache.
func (f *fleet) askedNodes() []string {
	var out []string
	for name := range f.byNode {
		if f.request(name) != nil {
			out = append(out, name)
		}
	}
	return out
}

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
