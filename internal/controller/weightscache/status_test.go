package weightscache

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/internal/testutil/gen"
)

func TestGather(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }}
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: 3}}
	report := func(state inferencev1.CacheState, reason, msg string) *prewarmv1alpha1.NodeCache {
		hb := metav1.NewTime(now)
		return &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: &hb, Caches: []prewarmv1alpha1.CacheStatus{{
			UID:        uid,
			CopyStatus: inferencev1.CopyStatus{State: state, Reason: reason, Message: msg, BytesDone: 50, BytesTotal: 100},
			Revision:   "abc",
		}}}}
	}
	tests := []struct {
		name      string
		targets   []*corev1.Node
		byNode    map[string]*prewarmv1alpha1.NodeCache
		state     inferencev1.CacheState
		ready     int32
		reason    string
		inMessage string
	}{
		{"all ready", nodes("a", "b"), map[string]*prewarmv1alpha1.NodeCache{
			"a": report(inferencev1.CacheReady, "Verified", ""), "b": report(inferencev1.CacheReady, "Verified", ""),
		}, inferencev1.CacheReady, 2, inferencev1.ReasonAllNodesReady, "all 2 target nodes"},
		{"one downloading", nodes("a", "b"), map[string]*prewarmv1alpha1.NodeCache{
			"a": report(inferencev1.CacheReady, "Verified", ""), "b": report(inferencev1.CacheDownloading, "Downloading", ""),
		}, inferencev1.CacheDownloading, 1, inferencev1.ReasonDownloading, "1 downloading"},
		{"one failed, rest ready", nodes("a", "b"), map[string]*prewarmv1alpha1.NodeCache{
			"a": report(inferencev1.CacheReady, "Verified", ""), "b": report(inferencev1.CacheFailed, "InsufficientCapacity", "needs 2 GB, 1 GB free under /x"),
		}, inferencev1.CacheFailed, 1, "InsufficientCapacity", "b: needs 2 GB, 1 GB free under /x"},
		{"no agent on a node", nodes("a"), map[string]*prewarmv1alpha1.NodeCache{}, inferencev1.CachePending, 0, inferencev1.ReasonWaitingForCache, "1 waiting"},
		{"no targets", nil, nil, inferencev1.CachePending, 0, inferencev1.ReasonNoTargetNodes, "no node matches"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _ := gatherOf(r, m, tt.targets, tt.byNode)
			c := meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady)
			if st.State != tt.state || st.ReadyNodes != tt.ready || st.TargetNodes != int32(len(tt.targets)) ||
				c == nil || c.Reason != tt.reason || !strings.Contains(c.Message, tt.inMessage) || st.ObservedGeneration != 3 {
				t.Errorf("gather = state %s ready %d/%d, condition %+v; want %s %d, %s with %q", st.State, st.ReadyNodes, st.TargetNodes, c, tt.state, tt.ready, tt.reason, tt.inMessage)
			}
		})
	}
	st, _ := gatherOf(r, m, nodes("a"), map[string]*prewarmv1alpha1.NodeCache{"a": {}})
	if st.Nodes[0].Reason != "AgentNotReporting" || !strings.Contains(st.Nodes[0].Message, "agent") {
		t.Errorf("a node whose agent never reported: %+v", st.Nodes[0])
	}

	// Past the status list's limit: the nodes not Ready are listed first, and the condition says
	// how many were left out.
	var many []string
	byNode := map[string]*prewarmv1alpha1.NodeCache{}
	for i := range inferencev1.MaxStatusNodes + 10 {
		name := fmt.Sprintf("n%05d", i)
		many = append(many, name)
		byNode[name] = report(inferencev1.CacheReady, "Verified", "")
	}
	slow := many[len(many)-5]
	byNode[slow] = report(inferencev1.CacheDownloading, "Downloading", "")
	st, ready := gatherOf(r, m, nodes(many...), byNode)
	c := meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady)
	want := fmt.Sprintf("lists %d of the %d nodes", inferencev1.MaxStatusNodes, inferencev1.MaxStatusNodes+10)
	if len(st.Nodes) != inferencev1.MaxStatusNodes || st.Nodes[0].Name != slow || st.TargetNodes != inferencev1.MaxStatusNodes+10 ||
		!strings.Contains(c.Message, want) {
		t.Errorf("%d nodes listed, first %s, condition %q; want %s first and %q", len(st.Nodes), st.Nodes[0].Name, c.Message, slow, want)
	}
	// The counts and the labels cover every node, listed or not.
	if n := int32(inferencev1.MaxStatusNodes + 9); st.ReadyNodes != n || st.SettledNodes != n || st.DownloadingNodes != 1 || len(ready) != int(n) || ready[slow] {
		t.Errorf("counts: ready %d settled %d downloading %d, %d nodes to label (the slow one: %v)", st.ReadyNodes, st.SettledNodes, st.DownloadingNodes, len(ready), ready[slow])
	}

	// A node that downloaded after the source was rewritten holds another revision than the one
	// the cache is pinned to: it is not counted Ready, and says why.
	pinned := m.DeepCopy()
	pinned.Status.ResolvedRevision = "sha256:first"
	rewritten := report(inferencev1.CacheReady, "Verified", "")
	rewritten.Status.Caches[0].Revision = "sha256:second"
	same := report(inferencev1.CacheReady, "Verified", "")
	same.Status.Caches[0].Revision = "sha256:first"
	st, _ = gatherOf(r, pinned, nodes("a", "b"), map[string]*prewarmv1alpha1.NodeCache{"a": same, "b": rewritten})
	c = meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady)
	// The failed node is listed first.
	if st.ReadyNodes != 1 || st.ResolvedRevision != "sha256:first" || st.Nodes[0].Name != "b" || st.Nodes[0].Reason != prewarmv1alpha1.ReasonSourceChanged ||
		c.Reason != prewarmv1alpha1.ReasonSourceChanged || !strings.Contains(c.Message, "sha256:second") {
		t.Errorf("a split revision: ready %d, revision %s, nodes %+v, condition %+v", st.ReadyNodes, st.ResolvedRevision, st.Nodes, c)
	}
}

// A node with no local disk for caches is not counted as a target: the cache is Ready when the
// nodes that can hold it do, and the Ready condition names the node and why.
func TestNodesWithoutADiskAreNotTargets(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }}
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: 1}}
	report := func(state inferencev1.CacheState, reason string) *prewarmv1alpha1.NodeCache {
		return &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: state, Reason: reason}}}}}
	}
	targets := []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "root-fs"}}}
	byNode := map[string]*prewarmv1alpha1.NodeCache{"a": report(inferencev1.CacheReady, "Verified"), "root-fs": report(inferencev1.CacheFailed, prewarmv1alpha1.ReasonNoLocalDisk)}
	st, _ := gatherOf(r, m, targets, byNode)
	c := meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady)
	if st.State != inferencev1.CacheReady || st.TargetNodes != 1 || st.ReadyNodes != 1 || st.SettledNodes != 1 || c == nil ||
		!strings.Contains(c.Message, "1 node(s) have no local disk for caches (NoLocalDisk: root-fs)") {
		t.Errorf("gather = %s, %d of %d ready (%d settled), condition %+v", st.State, st.ReadyNodes, st.TargetNodes, st.SettledNodes, c)
	}
	// The nodes the placement selects that the pods could not run on are named with why.
	var e placement.LeftOut
	for _, n := range []string{"g1", "g2"} {
		e.Add("taint nvidia.com/gpu=present:NoSchedule is not tolerated", n)
	}
	e.Add("the node is cordoned", "c1")
	noteExcluded(&st, e)
	c = meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady)
	if want := "3 node(s) the placement selects are left out, the pods could not run there: taint nvidia.com/gpu=present:NoSchedule is not tolerated (g1, g2); the node is cordoned (c1)"; !strings.Contains(c.Message, want) {
		t.Errorf("Ready condition %q; want it to say %q", c.Message, want)
	}
}

// gatherOf gathers the status of cache m on targets from the nodes' NodeCaches.
// Every target's agent renewed its Lease just now unless leases say otherwise.
func gatherOf(r *Reconciler, m *inferencev1.ModelDataCacheConfig, targets []*corev1.Node, byNode map[string]*prewarmv1alpha1.NodeCache, leases ...*coordinationv1.Lease) (inferencev1.ModelDataCacheConfigStatus, map[string]bool) {
	if r.Config.OperatorNamespace == "" {
		r.Config.OperatorNamespace = inferencev1.DefaultOperatorNamespace
	}
	given := map[string]bool{}
	objs := []client.Object{}
	for _, l := range leases {
		given[l.Name] = true
		objs = append(objs, l)
	}
	for _, n := range targets {
		if !given[n.Name] {
			objs = append(objs, agentLease(n.Name, r.Now(), time.Minute))
		}
	}
	r.Client = fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).Build()
	s := &state{m: m, fleet: &fleet{uid: string(m.UID), byNode: byNode}, decision: decision{targets: targets}}
	if err := r.gather(context.Background(), s); err != nil {
		panic(err)
	}
	return s.status, s.ready
}

// nodes are Nodes of those names.
func nodes(names ...string) []*corev1.Node {
	var out []*corev1.Node
	for _, n := range names {
		out = append(out, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	return out
}

// agentLease is node's agent Lease in the operator namespace, renewed at renewed, of duration.
func agentLease(node string, renewed time.Time, duration time.Duration) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: inferencev1.DefaultOperatorNamespace, Name: node},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: ptr.To(int32(duration / time.Second))}}
}

// A node whose agent's Lease expired counts no cache Ready (its pods could not mount it), and
// says why; a failure waiting will not fix stays one; a node whose agent renews it again counts.
func TestGatherCountsNoNodeWhoseAgentsLeaseExpired(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }}
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: 1}}
	report := func(state inferencev1.CacheState, reason string) *prewarmv1alpha1.NodeCache {
		return &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: &metav1.Time{Time: now.Add(-time.Hour)},
			Caches: []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: state, Reason: reason, Message: "m", BytesDone: 100, BytesTotal: 100}}}}}
	}
	byNode := map[string]*prewarmv1alpha1.NodeCache{"alive": report(inferencev1.CacheReady, "Verified"), "gone": report(inferencev1.CacheReady, "Verified"),
		"gone-full": report(inferencev1.CacheFailed, prewarmv1alpha1.ReasonInsufficientCapacity)}
	expired := func(node string) *coordinationv1.Lease {
		return agentLease(node, now.Add(-4*time.Minute), 3*time.Minute)
	}
	st, ready := gatherOf(r, m, nodes("alive", "gone", "gone-full"), byNode, expired("gone"), expired("gone-full"))
	if st.ReadyNodes != 1 || !ready["alive"] || ready["gone"] {
		t.Fatalf("ready %d %v; want only the node whose agent is alive", st.ReadyNodes, ready)
	}
	for _, ns := range st.Nodes {
		switch ns.Name {
		case "gone":
			if ns.State != inferencev1.CachePending || ns.Reason != prewarmv1alpha1.ReasonAgentNotReporting ||
				!strings.Contains(ns.Message, "has not renewed its Lease hyperpod-inference-system/gone since 2026-12-04T11:56:00Z") ||
				!strings.Contains(ns.Message, "it last reported the cache Ready: Verified") {
				t.Errorf("node whose agent is gone: %+v", ns)
			}
		case "gone-full":
			if ns.State != inferencev1.CacheFailed || ns.Reason != prewarmv1alpha1.ReasonInsufficientCapacity {
				t.Errorf("a terminal failure stays one when the agent is gone: %+v", ns)
			}
		}
	}
	// Renewed again: counted again.
	if st, _ := gatherOf(r, m, nodes("alive", "gone"), byNode, agentLease("gone", now.Add(-time.Second), 3*time.Minute)); st.ReadyNodes != 2 {
		t.Errorf("after the Lease is renewed: %d ready, want 2", st.ReadyNodes)
	}
	// An agent without a Lease (older than them) is judged by its last status write.
	old := report(inferencev1.CacheReady, "Verified")
	old.Status.HeartbeatTime = &metav1.Time{Time: now.Add(-time.Minute)}
	r.Client = fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	s := &state{m: m, fleet: &fleet{uid: uid, byNode: map[string]*prewarmv1alpha1.NodeCache{"old": old}}, decision: decision{targets: nodes("old")}}
	if err := r.gather(context.Background(), s); err != nil || s.status.ReadyNodes != 1 {
		t.Errorf("an agent without a Lease that wrote a minute ago: %d ready (%v), want 1", s.status.ReadyNodes, err)
	}
	old.Status.HeartbeatTime = &metav1.Time{Time: now.Add(-10 * time.Minute)}
	if err := r.gather(context.Background(), s); err != nil || s.status.ReadyNodes != 0 || !strings.Contains(s.status.Nodes[0].Message, "keeps no Lease") {
		t.Errorf("an agent without a Lease silent for 10 minutes: %d ready, %+v (%v)", s.status.ReadyNodes, s.status.Nodes, err)
	}
}

// A node's entry carries its agent's whole report of the copy, every field of
// inferencev1.CopyStatus: a field added there reaches the cache's status with nothing more to
// write.
func TestGatherCarriesTheWholeCopyStatus(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	rep := gen.Every[inferencev1.CopyStatus]()
	rep.State = inferencev1.CacheDownloading
	r := &Reconciler{Now: time.Now}
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: 1}}
	nc := &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: rep}}}}
	st, _ := gatherOf(r, m, []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}, map[string]*prewarmv1alpha1.NodeCache{"a": nc})
	if len(st.Nodes) != 1 || st.Nodes[0].CopyStatus != rep {
		t.Errorf("status nodes %+v; want node a with its agent's report %+v", st.Nodes, rep)
	}
}

// A node's entry carries what its copy takes on the node's disk, as its agent measured it.
func TestGatherCarriesWhatCopiesTakeOnDisk(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	r := &Reconciler{Now: time.Now}
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: 1}}
	nc := &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{{
		UID:        uid,
		CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, Reason: "Verified", BytesDone: 100, BytesTotal: 100, DiskBytes: 8192},
	}}}}
	st, _ := gatherOf(r, m, []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}, map[string]*prewarmv1alpha1.NodeCache{"a": nc})
	if len(st.Nodes) != 1 || st.Nodes[0].DiskBytes != 8192 {
		t.Errorf("status nodes %+v; want node a with 8192 bytes on disk", st.Nodes)
	}
}

// A node that evicted the cache to make room is settled, and the cache is Ready when every other
// target holds it; the Ready condition says how many hold it and names the evicted node.
func TestEvictedNodesLeaveTheCacheReady(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaab"
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }}
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: 1}}
	report := func(state inferencev1.CacheState, reason string) *prewarmv1alpha1.NodeCache {
		return &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: inferencev1.CopyStatus{State: state, Reason: reason}}}}}
	}
	targets := []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "full"}}}
	byNode := map[string]*prewarmv1alpha1.NodeCache{"a": report(inferencev1.CacheReady, "Verified"), "full": report(inferencev1.CachePending, prewarmv1alpha1.ReasonEvicted)}
	st, _ := gatherOf(r, m, targets, byNode)
	c := meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady)
	if st.State != inferencev1.CacheReady || st.TargetNodes != 2 || st.ReadyNodes != 1 || st.SettledNodes != 2 || c == nil ||
		!strings.Contains(c.Message, "1 of 2 target nodes hold the cache") || !strings.Contains(c.Message, "1 node(s) evicted the cache to make room for others (Evicted: full)") {
		t.Errorf("gather = %s, %d of %d ready (%d settled), condition %+v", st.State, st.ReadyNodes, st.TargetNodes, st.SettledNodes, c)
	}
	// Evicted everywhere: not Ready.
	byNode["a"] = report(inferencev1.CachePending, prewarmv1alpha1.ReasonEvicted)
	if st, _ := gatherOf(r, m, targets, byNode); st.State == inferencev1.CacheReady {
		t.Errorf("every node evicted the cache, yet it is %s", st.State)
	}
}

// The liveness scan names the nodes whose agent's Lease expired or was renewed again since its
// last look, and not those whose agent has never said anything.
func TestLivenessScanFindsExpiredAndRenewedLeases(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }}
	r.Config.OperatorNamespace = inferencev1.DefaultOperatorNamespace
	beat := &metav1.Time{Time: now}
	ncs := []client.Object{
		&prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: beat}},
		&prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: beat}},
		&prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "silent"}},
	}
	leaseA := agentLease("a", now, time.Minute)
	r.Client = fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(append(ncs, leaseA, agentLease("b", now, time.Minute))...).Build()
	l := &livenessScan{r: r}
	alive := map[string]bool{}
	names := func(changed []*prewarmv1alpha1.NodeCache, err error) []string {
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, nc := range changed {
			out = append(out, nc.Name)
		}
		return out
	}
	if got := names(l.scan(context.Background(), alive)); len(got) != 0 {
		t.Errorf("first scan: %v, want nothing (it only learns)", got)
	}
	now = now.Add(45 * time.Second) // b renews; a does not
	renewed := agentLease("b", now, time.Minute)
	if err := r.Client.Update(context.Background(), renewedFrom(t, r.Client, renewed)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(30 * time.Second)
	if got := names(l.scan(context.Background(), alive)); fmt.Sprint(got) != "[a]" {
		t.Errorf("after a's Lease expired: %v, want [a]", got)
	}
	if got := names(l.scan(context.Background(), alive)); len(got) != 0 {
		t.Errorf("nothing changed: %v", got)
	}
	if err := r.Client.Update(context.Background(), renewedFrom(t, r.Client, agentLease("a", now, time.Minute))); err != nil {
		t.Fatal(err)
	}
	if got := names(l.scan(context.Background(), alive)); fmt.Sprint(got) != "[a]" {
		t.Errorf("after a renewed its Lease: %v, want [a]", got)
	}
	if _, known := alive["silent"]; known {
		t.Errorf("a node whose agent never said anything is watched")
	}
}

// renewedFrom is want with the resourceVersion of the Lease c holds, for an update.
func renewedFrom(t *testing.T, c client.Client, want *coordinationv1.Lease) *coordinationv1.Lease {
	t.Helper()
	have := &coordinationv1.Lease{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(want), have); err != nil {
		t.Fatal(err)
	}
	want.ResourceVersion = have.ResourceVersion
	return want
}
