package weightscache

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// ask asks each target node for the cache and each retained node to keep it, and withdraws the
// request from every other node of the fleet that has it, through r.Requests. It returns the
// nodes it could not ask because they are already asked for MaxCachesPerNode other caches.
func (r *Reconciler) ask(ctx context.Context, s *state) (map[string]bool, error) {
	changes, full, err := r.asks(s)
	if err != nil {
		return nil, err
	}
	noRoom, err := r.Requests.Put(ctx, r.Client, slices.Concat(changes, withdrawals(s, r.Requests.pendingFor(s.fleet.uid))))
	for node := range noRoom {
		full[node] = true
	}
	return full, err
}

// asks are the requests to write: each target's and retained node's that differs from what
// it has. full are the nodes that cannot take another cache.
func (r *Reconciler) asks(s *state) ([]change, map[string]bool, error) {
	f, p := s.fleet, &s.decision
	var writes []change
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
		writes = append(writes, change{node: n.Name, nodeUID: n.UID, uid: f.uid, entry: &want})
	}
	return writes, full, nil
}

// withdrawals withdraw the cache from the nodes that have a request for it, or one not written
// yet, and are neither targets nor retained.
func withdrawals(s *state, pending []string) []change {
	p, uid := &s.decision, s.fleet.uid
	keep := map[string]bool{}
	for _, n := range p.targets {
		keep[n.Name] = true
	}
	for name := range p.retained {
		keep[name] = true
	}
	var out []change
	for _, nc := range s.fleet.named {
		if !keep[nc.Name] && requestFor(nc, uid) != nil {
			keep[nc.Name] = true // withdrawn once
			out = append(out, change{node: nc.Name, uid: uid})
		}
	}
	for _, node := range pending {
		if !keep[node] {
			out = append(out, change{node: node, uid: uid})
		}
	}
	return out
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
