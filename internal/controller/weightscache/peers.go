package weightscache

import (
	"cmp"
	"hash/fnv"
	"io"
	"slices"

	corev1 "k8s.io/api/core/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// DefaultPeerGroup is how many nodes share one reading of the source (operator configuration
// peerGroupSize).
const DefaultPeerGroup = 16

// assignPeers says which peers each target exchanges the cache's parts with, in swarms that
// read the source about once however many nodes there are:
//
//   - the targets whose agents serve peers are the members; a member whose request already
//     lists peers that are all still members, at the same addresses, keeps them (so a swarm
//     costs one write per node when it forms, not one per change elsewhere);
//   - the others (new targets, and those whose peers left) are ordered by a hash of the cache
//     and their names and cut into groups of groupSize: each part is read from upstream by one
//     node of the group and taken from it by the rest;
//   - the first group's upstream is up to groupSize of the members that already had peers,
//     Ready ones first (none: it reads the source); group g's is group (g−1)/2, a binary tree
//     whose root alone reads the source;
//   - except that members still downloading that fit in one group are one group: a node that
//     joins them is grouped with them (a scale-out of a few nodes at a time).
//
// addr is the peer address of each target whose agent serves peers, as checked (peerAddrsOf). A
// target without one is no one's peer; it takes its parts from the members that already had a
// swarm, or from the first group when none had.
func assignPeers(f *fleet, targets []*corev1.Node, addr map[string]string, groupSize int) map[string][]prewarmv1alpha1.CachePeer {
	if groupSize < 2 {
		return nil
	}
	uid := f.uid
	var members, silent []string
	for _, n := range targets {
		if rep := f.report(n.Name); rep != nil && rep.State == inferencev1.CacheFailed && rep.Reason == prewarmv1alpha1.ReasonNoLocalDisk {
			continue // keeps no cache: it would hold no part for its group
		}
		if addr[n.Name] != "" {
			members = append(members, n.Name)
		} else {
			silent = append(silent, n.Name)
		}
	}
	ready := func(name string) bool {
		rep := f.report(name)
		return rep != nil && rep.State == inferencev1.CacheReady
	}
	out := make(map[string][]prewarmv1alpha1.CachePeer, len(members))
	var fresh, settled []string
	for _, name := range members {
		asked := f.latest(name)
		current := asked != nil && peersCurrent(asked.Peers, addr)
		switch {
		case current && len(asked.Peers) > 0:
			out[name] = asked.Peers
			settled = append(settled, name)
		case ready(name):
			// It holds the cache: it needs no peers (those that left are dropped), and is one.
			if current {
				out[name] = asked.Peers
			}
			settled = append(settled, name)
		default:
			fresh = append(fresh, name)
		}
	}
	// Members still downloading that fit in one group are one group: a node that joins them (a
	// newcomer, or a node that was no one's peer until its address was borne out) joins their
	// group instead of taking its parts from it as its upstream, so that the members take parts
	// from it too (downstream of them it could give them none, and their uplinks would carry its
	// parts as well as each other's). That asks them again, at most a group's worth of writes per
	// join; a Ready member stays settled, upstream of the group.
	if growing := slices.DeleteFunc(slices.Clone(members), ready); len(growing) > 1 && len(growing) <= groupSize && !oneGroup(f, growing, addr, ready) {
		fresh = growing
		settled = slices.DeleteFunc(settled, func(name string) bool { return !ready(name) })
	}
	slices.SortFunc(fresh, func(a, b string) int { return cmp.Compare(score(uid, a), score(uid, b)) })
	// Upstreams are settled members, Ready ones first, then by a hash salted with who asks, so
	// that one node is not everyone's upstream.
	upstreamFor := func(salt string) []string {
		salt = uid + salt
		up := slices.Clone(settled)
		slices.SortFunc(up, func(a, b string) int {
			if ra, rb := ready(a), ready(b); ra != rb {
				if ra {
					return -1
				}
				return 1
			}
			return cmp.Compare(score(salt, a), score(salt, b))
		})
		return up[:min(len(up), groupSize)]
	}
	// A target whose agent has not said where it serves yet (a node that just joined, or whose
	// address is not borne out yet) is no one's peer, but takes its parts from upstream from its
	// first request on: the settled members, or, while there are none (the whole fleet starts
	// together), the first group of fresh members, which reads the source for it.
	firstGroup := fresh[:min(len(fresh), groupSize)]
	for _, name := range silent {
		if asked := f.latest(name); asked != nil && len(asked.Peers) > 0 && peersCurrent(asked.Peers, addr) {
			out[name] = asked.Peers
			continue
		}
		up := upstreamFor(name)
		if len(up) == 0 {
			up = firstGroup
		}
		var peers []prewarmv1alpha1.CachePeer
		for _, up := range up {
			peers = append(peers, prewarmv1alpha1.CachePeer{Node: up, Address: addr[up], Upstream: true})
		}
		out[name] = peers
	}
	if len(fresh) == 0 {
		return out
	}
	groupFresh(fresh, groupSize, addr, upstreamFor, out)
	return out
}

// oneGroup reports whether names are one group now: each lists the others as its peers, none
// upstream, at their current addresses; other peers it lists are upstream or Ready (a member of
// the group that finished: it keeps the group as it is).
func oneGroup(f *fleet, names []string, addr map[string]string, ready func(string) bool) bool {
	for _, name := range names {
		asked := f.latest(name)
		if asked == nil || !peersCurrent(asked.Peers, addr) {
			return false
		}
		n := 0
		for _, p := range asked.Peers {
			switch {
			case p.Upstream:
			case slices.Contains(names, p.Node):
				n++
			case !ready(p.Node):
				return false
			}
		}
		if n != len(names)-1 {
			return false
		}
	}
	return true
}

// groupFresh cuts the fresh members (ordered) into groups, each listing the rest of its group
// and its upstream: upstreamFor's for the first group, group (g−1)/2 for group g.
func groupFresh(fresh []string, groupSize int, addr map[string]string, upstreamFor func(salt string) []string, out map[string][]prewarmv1alpha1.CachePeer) {
	groups := slices.Collect(slices.Chunk(fresh, groupSize))
	for g, group := range groups {
		var upstream []string
		if g == 0 {
			upstream = upstreamFor(group[0])
		} else {
			upstream = groups[(g-1)/2]
		}
		for _, name := range group {
			var peers []prewarmv1alpha1.CachePeer
			for _, other := range group {
				if other != name {
					peers = append(peers, prewarmv1alpha1.CachePeer{Node: other, Address: addr[other]})
				}
			}
			for _, up := range upstream {
				peers = append(peers, prewarmv1alpha1.CachePeer{Node: up, Address: addr[up], Upstream: true})
			}
			out[name] = peers
		}
	}
}

// peersCurrent reports whether every peer is still a member, at the address listed.
func peersCurrent(peers []prewarmv1alpha1.CachePeer, addr map[string]string) bool {
	for _, p := range peers {
		if addr[p.Node] != p.Address {
			return false
		}
	}
	return true
}

func score(salt, name string) uint64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, salt)
	_, _ = io.WriteString(h, "/")
	_, _ = io.WriteString(h, name)
	return h.Sum64()
}
