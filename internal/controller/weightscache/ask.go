package weightscache

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// ask asks each target node for the cache and each retained node to keep it, and withdraws the
// request from every other node of the fleet that has it. It returns the nodes it could not ask
// because they are already asked for MaxCachesPerNode other caches. The writes go out in
// parallel.
func (r *Reconciler) ask(ctx context.Context, s *state) (map[string]bool, error) {
	writes, full, err := r.requests(s)
	if err != nil {
		return nil, err
	}
	if err := r.applyRequests(ctx, s.fleet.uid, writes, full); err != nil {
		return nil, err
	}
	return full, r.withdraw(ctx, s)
}

// requestWrite is a node's request for the cache, as it is to be written.
type requestWrite struct {
	node  *corev1.Node
	want  prewarmv1alpha1.CacheRequest
	fresh bool // the node has no request for the cache yet
}

// requests are the requests to write: each target's and retained node's that differs from what
// it has. full are the nodes that cannot take another cache.
func (r *Reconciler) requests(s *state) ([]requestWrite, map[string]bool, error) {
	f, p := s.fleet, &s.decision
	var writes []requestWrite
	full := map[string]bool{}
	// The targets the namespace's quota keeps the cache off hold no copy: they are no one's
	// peers, and only those whose pods ask for the cache are asked, to tell them why.
	held := slices.DeleteFunc(slices.Clone(p.targets), func(n *corev1.Node) bool { _, no := p.quota.refused[n.Name]; return no })
	var peers map[string][]prewarmv1alpha1.CachePeer
	if !r.Config.Peers.Disabled {
		peers = assignPeers(f, held, p.peerAddrs, r.Config.Peers.GroupSize)
	}
	for _, n := range slices.Concat(p.targets, p.retainedNodes) {
		want := p.entry
		asked := f.request(n.Name)
		if no, ok := p.quota.refused[n.Name]; ok {
			if no.reason != prewarmv1alpha1.ReasonBudgetExceeded || !demanded(f.nodeCache(n.Name), s.m) {
				continue
			}
			want.Refused = &prewarmv1alpha1.CacheRefusal{Reason: no.reason, Message: clip(no.message, 1024)}
		}
		if keep, ok := p.retained[n.Name]; ok {
			want.RetainedSince = keep.since
			if asked != nil {
				want.Peers = asked.Peers // downloads nothing: not worth a write
			}
		} else {
			want.Peers = peers[n.Name]
		}
		sealed, err := sealFor(f.nodeCache(n.Name), n.Name, f.uid, p.access, asked)
		if err != nil {
			return nil, nil, fmt.Errorf("sealing the credentials for node %s: %w", n.Name, err)
		}
		want.Credentials = sealed
		if asked != nil && (equality.Semantic.DeepEqual(*asked, want) || pinNotNeeded(*asked, want, f.report(n.Name))) {
			continue
		}
		if nc := f.nodeCache(n.Name); asked == nil && nc != nil && len(nc.Spec.Caches) >= prewarmv1alpha1.MaxCachesPerNode {
			full[n.Name] = true
			continue
		}
		writes = append(writes, requestWrite{node: n, want: want, fresh: asked == nil})
	}
	return writes, full, nil
}

// applyRequests writes the requests, in parallel; a node whose list is full by now joins full.
func (r *Reconciler) applyRequests(ctx context.Context, uid string, writes []requestWrite, full map[string]bool) error {
	var mu sync.Mutex
	return controller.ForEach(ctx, writes, func(ctx context.Context, w requestWrite) error {
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
}

// withdraw withdraws the cache from the nodes of the fleet that have a request for it and are
// neither targets nor retained.
func (r *Reconciler) withdraw(ctx context.Context, s *state) error {
	p, uid := &s.decision, s.fleet.uid
	isTarget := map[string]bool{}
	for _, n := range p.targets {
		isTarget[n.Name] = true
	}
	var withdraw []*prewarmv1alpha1.NodeCache
	for _, nc := range s.fleet.named {
		if _, keep := p.retained[nc.Name]; isTarget[nc.Name] || keep || requestFor(nc, uid) == nil {
			continue
		}
		withdraw = append(withdraw, nc)
	}
	return controller.ForEach(ctx, withdraw, func(ctx context.Context, nc *prewarmv1alpha1.NodeCache) error {
		if err := withdrawEntry(ctx, r.Client, nc, uid); err != nil {
			return fmt.Errorf("withdrawing the cache from node %s: %w", nc.Name, err)
		}
		return nil
	})
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
