package weightscache

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/text"
)

// ask asks each target node for the cache and each retained node to keep it, and withdraws the
// request from every other node of the fleet that has it, through r.Requests. It returns the
// nodes it could not ask, and why: their list has no room for the cache, or would be refused
// with it.
func (r *Reconciler) ask(ctx context.Context, s *state) (map[string]refusal, error) {
	changes, unasked, err := r.asks(s)
	if err != nil {
		return nil, err
	}
	left, err := r.Requests.Put(ctx, r.Client, slices.Concat(changes, withdrawals(s, r.Requests.pendingFor(s.fleet.uid))))
	maps.Copy(unasked, left)
	if len(unasked) > 0 && (s.decision.requeue == 0 || s.decision.requeue > leftOutFor) {
		s.decision.requeue = leftOutFor // room may come on those nodes, which tell nothing of it
	}
	return unasked, err
}

// asks are the requests to write: each target's and retained node's that differs from what
// it has. unasked are the nodes whose list has no room for it, or would be refused with it.
func (r *Reconciler) asks(s *state) ([]change, map[string]refusal, error) {
	f, p := s.fleet, &s.decision
	var writes []change
	unasked := map[string]refusal{}
	// The targets the namespace's quota keeps the cache off hold no copy: they are no one's
	// peers, and only those whose pods ask for the cache are asked, to tell them why.
	held := slices.DeleteFunc(slices.Clone(p.targets), func(n *corev1.Node) bool { _, no := p.quota.refused[n.Name]; return no })
	var peers map[string][]prewarmv1alpha1.CachePeer
	if !r.Config.Peers.Disabled {
		f.newer = r.Requests.latest
		peers = assignPeers(f, held, p.peerAddrs, r.Config.Peers.GroupSize)
	}
	now := r.Now()
	for _, n := range slices.Concat(p.targets, p.retainedNodes) {
		want := p.entry
		asked := f.request(n.Name)
		if no, ok := p.quota.refused[n.Name]; ok {
			if no.reason != prewarmv1alpha1.ReasonBudgetExceeded || !demanded(f.nodeCache(n.Name), s.m) {
				continue
			}
			want.Refused = &prewarmv1alpha1.CacheRefusal{Reason: no.reason, Message: text.Clip(no.message, text.MaxMessage)}
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
		if why, left := r.Requests.leftOutOf(n.Name, want, now); left {
			unasked[n.Name] = why // told by the writer: not asked again for a while
			continue
		}
		if why, ok := r.fits(f.nodeCache(n.Name), asked, want); !ok {
			unasked[n.Name] = why
			continue
		}
		writes = append(writes, change{node: n.Name, nodeUID: n.UID, uid: f.uid, entry: &want})
	}
	return writes, unasked, nil
}

// fits says whether node's NodeCache nc, as the informer shows it, can take request want (asked:
// the node's request for the cache now), and why not: the writer checks again as it writes,
// with the changes of other caches, but a cache that cannot fit says so at once.
func (r *Reconciler) fits(nc *prewarmv1alpha1.NodeCache, asked *prewarmv1alpha1.CacheRequest, want prewarmv1alpha1.CacheRequest) (refusal, bool) {
	left := map[string]refusal{}
	if invalid(want, left) {
		return left[want.UID], false
	}
	if asked != nil || nc == nil {
		return refusal{}, true
	}
	held := 0
	for _, e := range nc.Spec.Caches {
		if e.Namespace == want.Namespace {
			held++
		}
	}
	return r.slots().room(want.Namespace, held, len(nc.Spec.Caches))
}

// slots is the share of a node's list each namespace may take, from the configuration.
func (r *Reconciler) slots() Slots { return r.Config.CacheSlots }

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
