package weightscache

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// fleetOf is n target nodes whose agents serve peers, and their NodeCaches.
func fleetOf(n int) ([]*corev1.Node, map[string]*prewarmv1alpha1.NodeCache) {
	var nodes []*corev1.Node
	byNode := map[string]*prewarmv1alpha1.NodeCache{}
	for i := range n {
		name := fmt.Sprintf("node-%04d", i)
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		byNode[name] = &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: prewarmv1alpha1.NodeCacheStatus{PeerAddress: fmt.Sprintf("10.0.%d.%d:9444", i/250, i%250)}}
	}
	return nodes, byNode
}

// ask records the assignment as the nodes' requests for cache-1, as the reconciler's writes would.
func ask(byNode map[string]*prewarmv1alpha1.NodeCache, peers map[string][]prewarmv1alpha1.CachePeer) {
	for name, nc := range byNode {
		nc.Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: "cache-1", Peers: peers[name]}}
	}
}

func TestPeersFormGroupsInATreeWithBoundedRewrites(t *testing.T) {
	const uid, group = "cache-1", 4
	nodes, byNode := fleetOf(10)
	peers := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, reportedAddrs(nodes, byNode), group)
	// 10 fresh nodes: groups of 4, 4 and 2; every node lists the rest of its group, and groups
	// 1 and 2 list group 0 as their upstream; group 0 has none (it reads the source).
	groupOf := map[string]int{}
	var groups [][]string
	for _, n := range nodes {
		var members []string
		for _, p := range peers[n.Name] {
			if !p.Upstream {
				members = append(members, p.Node)
			}
		}
		members = append(members, n.Name)
		slices.Sort(members)
		g := slices.IndexFunc(groups, func(m []string) bool { return slices.Equal(m, members) })
		if g < 0 {
			groups, g = append(groups, members), len(groups)
		}
		groupOf[n.Name] = g
	}
	sizes := []int{}
	for _, g := range groups {
		sizes = append(sizes, len(g))
	}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{2, 4, 4}) {
		t.Fatalf("group sizes %v, want 2, 4, 4", sizes)
	}
	roots := 0
	for _, n := range nodes {
		var up []string
		for _, p := range peers[n.Name] {
			if p.Upstream {
				up = append(up, p.Node)
			}
			if p.Address != byNode[p.Node].Status.PeerAddress {
				t.Errorf("%s lists %s at %s, want its reported address", n.Name, p.Node, p.Address)
			}
		}
		if len(up) == 0 {
			roots++
			continue
		}
		// The upstream is a whole other group.
		slices.Sort(up)
		if g := slices.IndexFunc(groups, func(m []string) bool { return slices.Equal(m, up) }); g < 0 || g == groupOf[n.Name] {
			t.Errorf("%s's upstream %v is not another group", n.Name, up)
		}
	}
	if roots != 4 {
		t.Errorf("%d nodes read the source, want one group of 4", roots)
	}

	// Written, nothing changes: the next reconcile asks for the same peers (no writes).
	ask(byNode, peers)
	if again := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, reportedAddrs(nodes, byNode), group); !equalPeers(again, peers) {
		t.Error("a second assignment with nothing changed differs from the first")
	}

	// A node leaves: only the requests that named it change.
	gone := nodes[3].Name
	rest := slices.DeleteFunc(slices.Clone(nodes), func(n *corev1.Node) bool { return n.Name == gone })
	after := assignPeers(&fleet{uid: uid, byNode: byNode}, rest, reportedAddrs(rest, byNode), group)
	changed := 0
	for _, n := range rest {
		named := slices.ContainsFunc(peers[n.Name], func(p prewarmv1alpha1.CachePeer) bool { return p.Node == gone })
		same := slices.Equal(after[n.Name], peers[n.Name])
		if !named && !same {
			t.Errorf("%s did not name %s but was asked again", n.Name, gone)
		}
		if slices.ContainsFunc(after[n.Name], func(p prewarmv1alpha1.CachePeer) bool { return p.Node == gone }) {
			t.Errorf("%s still lists %s, which left", n.Name, gone)
		}
		if !same {
			changed++
		}
	}
	if changed > 3*group {
		t.Errorf("%d requests rewritten after one node left, want at most %d", changed, 3*group)
	}

	// A node that joins a swarm of Ready nodes takes its parts from them.
	for _, nc := range byNode {
		nc.Status.Caches = []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}}}
	}
	ask(byNode, after)
	more, moreByNode := fleetOf(11)
	newcomer := more[10]
	byNode[newcomer.Name] = moreByNode[newcomer.Name]
	joined := assignPeers(&fleet{uid: uid, byNode: byNode}, append(rest, newcomer), reportedAddrs(append(rest, newcomer), byNode), group)
	var up int
	for _, p := range joined[newcomer.Name] {
		if !p.Upstream {
			t.Errorf("the newcomer's peer %s is not upstream: it is alone in its group", p.Node)
		}
		up++
	}
	if up == 0 || up > group {
		t.Errorf("the newcomer has %d upstream peers, want 1 to %d", up, group)
	}
	for _, n := range rest {
		if !slices.Equal(joined[n.Name], after[n.Name]) {
			t.Errorf("%s was asked again when a node joined", n.Name)
		}
	}

	// A lone Ready node (no peers: it downloaded alone) is the upstream of one that joins, and is
	// not asked again.
	lone, loneByNode := fleetOf(2)
	loneByNode[lone[0].Name].Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: uid}}
	loneByNode[lone[0].Name].Status.Caches = []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}}}
	pair := assignPeers(&fleet{uid: uid, byNode: loneByNode}, lone, reportedAddrs(lone, loneByNode), group)
	if len(pair[lone[0].Name]) != 0 || len(pair[lone[1].Name]) != 1 || !pair[lone[1].Name][0].Upstream || pair[lone[1].Name][0].Node != lone[0].Name {
		t.Errorf("a node joining a lone Ready one: %v", pair)
	}

	// A node whose agent has not reported where it serves (it just joined) is no one's peer, but
	// takes its parts from the Ready nodes from its first request on; once it reports, its
	// request stays as it is.
	late, lateByNode := fleetOf(12)
	silent := late[11]
	byNode[silent.Name] = lateByNode[silent.Name]
	address := byNode[silent.Name].Status.PeerAddress
	byNode[silent.Name].Status.PeerAddress = ""
	first := assignPeers(&fleet{uid: uid, byNode: byNode}, append(rest, silent), reportedAddrs(append(rest, silent), byNode), group)
	if len(first[silent.Name]) == 0 || slices.ContainsFunc(first[silent.Name], func(p prewarmv1alpha1.CachePeer) bool { return !p.Upstream }) {
		t.Errorf("the silent node's peers %v, want Ready nodes upstream", first[silent.Name])
	}
	for name, ps := range first {
		if slices.ContainsFunc(ps, func(p prewarmv1alpha1.CachePeer) bool { return p.Node == silent.Name }) {
			t.Errorf("%s lists the silent node", name)
		}
	}
	byNode[silent.Name].Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: uid, Peers: first[silent.Name]}}
	byNode[silent.Name].Status.PeerAddress = address
	if reported := assignPeers(&fleet{uid: uid, byNode: byNode}, append(rest, silent), reportedAddrs(append(rest, silent), byNode), group); !slices.Equal(reported[silent.Name], first[silent.Name]) {
		t.Errorf("the node's request changed once it reported: %v, then %v", first[silent.Name], reported[silent.Name])
	}
}

func equalPeers(a, b map[string][]prewarmv1alpha1.CachePeer) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// When a whole fleet starts together and one node's address is not borne out yet, that node
// still takes its parts from the others (the first group, upstream) rather than reading the
// whole model from the source; it is no one's peer.
func TestASilentNodeOfAFleetStartingTogetherTakesFromTheFirstGroup(t *testing.T) {
	const uid = "cache-1"
	nodes, byNode := fleetOf(3)
	silent := nodes[2].Name
	addrs := reportedAddrs(nodes, byNode)
	delete(addrs, silent) // refused by peerAddrsOf
	peers := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16)
	var ups []string
	for _, p := range peers[silent] {
		if !p.Upstream || p.Address != addrs[p.Node] {
			t.Errorf("the silent node's peer %+v; want members upstream at their addresses", p)
		}
		ups = append(ups, p.Node)
	}
	slices.Sort(ups)
	if want := []string{nodes[0].Name, nodes[1].Name}; !slices.Equal(ups, want) {
		t.Errorf("the silent node takes from %v; want %v", ups, want)
	}
	for _, n := range nodes[:2] {
		if slices.ContainsFunc(peers[n.Name], func(p prewarmv1alpha1.CachePeer) bool { return p.Node == silent }) {
			t.Errorf("%s lists the silent node: %v", n.Name, peers[n.Name])
		}
		if slices.ContainsFunc(peers[n.Name], func(p prewarmv1alpha1.CachePeer) bool { return p.Upstream }) {
			t.Errorf("%s of the first group has an upstream %v; want it to read the source", n.Name, peers[n.Name])
		}
	}
}

// A node with no local disk for caches holds no part: it is nobody's peer, and has none.
func TestNodesWithoutADiskAreNoPeers(t *testing.T) {
	const uid = "cache-1"
	nodes, byNode := fleetOf(3)
	noDisk := nodes[1].Name
	byNode[noDisk].Status.Caches = []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheFailed, Reason: prewarmv1alpha1.ReasonNoLocalDisk}}}
	peers := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, reportedAddrs(nodes, byNode), 4)
	if len(peers[noDisk]) > 0 {
		t.Errorf("%s (NoLocalDisk) has peers %v", noDisk, peers[noDisk])
	}
	for _, n := range []string{nodes[0].Name, nodes[2].Name} {
		if len(peers[n]) != 1 || peers[n][0].Node == noDisk {
			t.Errorf("%s has peers %v; want the other node with a disk only", n, peers[n])
		}
	}
}

// reportedAddrs is the peer address each target's NodeCache reports, as peerAddrsOf passes them
// on when all are the nodes' own.
func reportedAddrs(targets []*corev1.Node, byNode map[string]*prewarmv1alpha1.NodeCache) map[string]string {
	out := map[string]string{}
	for _, n := range targets {
		if nc := byNode[n.Name]; nc != nil && nc.Status.PeerAddress != "" {
			out[n.Name] = nc.Status.PeerAddress
		}
	}
	return out
}

// A group whose members finish one by one is not asked again: a member that is Ready is still
// one of the group for the others.
func TestAGroupIsNotAskedAgainAsItsMembersFinish(t *testing.T) {
	const uid = "cache-1"
	nodes, byNode := fleetOf(5)
	addrs := reportedAddrs(nodes, byNode)
	first := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16)
	ask(byNode, first)
	for k, n := range nodes[:4] {
		byNode[n.Name].Status.Caches = []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}}}
		if again := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16); !equalPeers(again, first) {
			t.Fatalf("with %d of 5 Ready, the group was asked again:\n%v\nwas\n%v", k+1, again, first)
		}
	}
}

// A node that was no one's peer when its swarm formed (its address not borne out yet), and so
// took its parts from the swarm as its upstream, joins the group once its address is: the
// others then take parts from it too.
func TestANodeSilentWhenTheSwarmFormedJoinsItsGroupOnceItReports(t *testing.T) {
	const uid = "cache-1"
	nodes, byNode := fleetOf(5)
	silent := nodes[4].Name
	address := byNode[silent].Status.PeerAddress
	byNode[silent].Status.PeerAddress = ""
	first := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, reportedAddrs(nodes, byNode), 16)
	ask(byNode, first)
	if slices.ContainsFunc(first[silent], func(p prewarmv1alpha1.CachePeer) bool { return !p.Upstream }) {
		t.Fatalf("the silent node's peers %v, want its swarm upstream", first[silent])
	}
	byNode[silent].Status.PeerAddress = address
	joined := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, reportedAddrs(nodes, byNode), 16)
	for _, n := range nodes {
		ps := joined[n.Name]
		if len(ps) != 4 || slices.ContainsFunc(ps, func(p prewarmv1alpha1.CachePeer) bool { return p.Upstream }) {
			t.Errorf("once it reports, %s's peers are %v; want the other four, none upstream", n.Name, ps)
		}
	}
}

// A fleet starting together is assigned its peers once, even when the next reconcile comes while
// the writes have reached only some nodes: through the writer's memory (fleet.newer) the others
// count as asked too, and are not regrouped under the first ones as their upstream (where the
// first ones, still downloading, would have to serve them every part). (A fleet that fits in one
// group would be grouped whole again: this takes one of 20 nodes in groups of 16.)
func TestAReconcileBetweenTheWritesKeepsTheAssignment(t *testing.T) {
	const uid = "cache-1"
	nodes, byNode := fleetOf(20)
	addrs := reportedAddrs(nodes, byNode)
	first := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16)
	// The informer shows the first 13 writes; the writer still has the last 7.
	for _, n := range nodes[:13] {
		byNode[n.Name].Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: uid, Peers: first[n.Name]}}
	}
	pending := func(node, _ string, _ int64, _ types.UID) (*prewarmv1alpha1.CacheRequest, bool) {
		if slices.ContainsFunc(nodes[13:], func(n *corev1.Node) bool { return n.Name == node }) {
			return &prewarmv1alpha1.CacheRequest{UID: uid, Peers: first[node]}, true
		}
		return nil, false
	}
	if again := assignPeers(&fleet{uid: uid, byNode: byNode, newer: pending}, nodes, addrs, 16); !equalPeers(again, first) {
		t.Errorf("with the writer's pending requests, the second assignment differs:\n%v\nwant\n%v", again, first)
	}
	upstream := func(ps []prewarmv1alpha1.CachePeer) bool {
		return slices.ContainsFunc(ps, func(p prewarmv1alpha1.CachePeer) bool { return p.Upstream })
	}
	// Without them a pending node of the first group would be regrouped under the others: what
	// the writer's memory prevents.
	victim := slices.IndexFunc(nodes[13:], func(n *corev1.Node) bool { return !upstream(first[n.Name]) })
	if victim < 0 {
		t.Fatal("no node of the first group is among the pending ones: the test shows nothing")
	}
	name := nodes[13+victim].Name
	if regrouped := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16); !upstream(regrouped[name]) {
		t.Errorf("without the writer's memory, %s has no upstream: %v (the case this guards against is gone?)", name, regrouped[name])
	}
}

// A node that joins a swarm still downloading, all of it fitting in one group with the
// newcomer, becomes one more member of that group: its members list it (they can take parts
// from it), and it lists them, none as upstream. A Ready member stays its upstream.
func TestANodeJoiningASmallSwarmStillDownloadingJoinsItsGroup(t *testing.T) {
	const uid = "cache-1"
	nodes, byNode := fleetOf(4)
	addrs := reportedAddrs(nodes, byNode)
	three := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes[:3], addrs, 16)
	for _, n := range nodes[:3] {
		byNode[n.Name].Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: uid, Peers: three[n.Name]}}
	}
	four := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16)
	for _, n := range nodes {
		ps := four[n.Name]
		if len(ps) != 3 || slices.ContainsFunc(ps, func(p prewarmv1alpha1.CachePeer) bool { return p.Upstream }) {
			t.Errorf("%s's peers %v, want the other three, none upstream", n.Name, ps)
		}
	}
	// One of the three is Ready: it is the group's upstream, not asked again.
	done := nodes[0].Name
	byNode[done].Status.Caches = []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}}}
	withReady := assignPeers(&fleet{uid: uid, byNode: byNode}, nodes, addrs, 16)
	if !slices.Equal(withReady[done], three[done]) {
		t.Errorf("the Ready node was asked again: %v, was %v", withReady[done], three[done])
	}
	for _, n := range nodes[1:] {
		ps := withReady[n.Name]
		var up, member int
		for _, p := range ps {
			switch {
			case p.Node == done && p.Upstream:
				up++
			case p.Node != done && !p.Upstream:
				member++
			}
		}
		if up != 1 || member != 2 || len(ps) != 3 {
			t.Errorf("%s's peers %v, want the Ready node upstream and the other two members", n.Name, ps)
		}
	}
}

// The writer's memory: a change not written yet, then being written, then written but not yet
// shown by the informer, is what latest says; once the informer shows the write's generation,
// the informer is read again.
func TestRequestsRememberWhatTheInformerDoesNotShowYet(t *testing.T) {
	q := &Requests{}
	e := &prewarmv1alpha1.CacheRequest{UID: "c"}
	if _, ok := q.latest("n", "c", 0, "nc"); ok {
		t.Fatal("latest knows a request never put")
	}
	q.init()
	q.pending["n"] = &nodeChanges{caches: map[string]*prewarmv1alpha1.CacheRequest{"c": e}}
	if got, ok := q.latest("n", "c", 0, "nc"); !ok || got != e {
		t.Errorf("pending: latest = %v, %v", got, ok)
	}
	q.writing["n"], q.pending["n"] = q.pending["n"].caches, nil
	if got, ok := q.latest("n", "c", 0, "nc"); !ok || got != e {
		t.Errorf("being written: latest = %v, %v", got, ok)
	}
	delete(q.writing, "n")
	q.written["n"] = writtenAs{uid: "nc", generation: 4}
	q.sent["n"] = sentAs{at: time.Now(), caches: map[string]*prewarmv1alpha1.CacheRequest{"c": e, "gone": nil}}
	if got, ok := q.latest("n", "c", 3, "nc"); !ok || got != e {
		t.Errorf("written at generation 4, informer at 3: latest = %v, %v", got, ok)
	}
	if got, ok := q.latest("n", "gone", 3, "nc"); !ok || got != nil {
		t.Errorf("a withdrawal written, informer behind: latest = %v, %v; want nil, true (not asked)", got, ok)
	}
	if _, ok := q.latest("n", "c", 4, "nc"); ok {
		t.Error("the informer shows the write: latest still answers")
	}
	q.sent["n"] = sentAs{at: time.Now(), caches: map[string]*prewarmv1alpha1.CacheRequest{"c": e}}
	if got, ok := q.latest("n", "c", 0, ""); !ok || got != e {
		t.Errorf("written, the informer shows no NodeCache yet: latest = %v, %v", got, ok)
	}
	if _, ok := q.latest("n", "c", 1, "nc-again"); ok {
		t.Error("the informer shows a NodeCache made again (another UID, generation 1): latest still answers for the old one")
	}
}
