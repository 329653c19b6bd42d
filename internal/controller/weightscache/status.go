package weightscache

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/pkg/engine"
)

// gather builds the cache's status from the target nodes' NodeCache reports.
func (r *Reconciler) gather(m *inferencev1.ModelDataCacheConfig, targets []*corev1.Node, retained map[string]retention, byNode map[string]*prewarmv1alpha1.NodeCache, full map[string]bool) inferencev1.ModelDataCacheConfigStatus {
	st := inferencev1.ModelDataCacheConfigStatus{
		ObservedGeneration: m.Generation,
		TargetNodes:        int32(len(targets)),
		ResolvedRevision:   m.Status.ResolvedRevision,
		Conditions:         slices.Clone(m.Status.Conditions),
	}
	b := nodeEntries{uid: string(m.UID), byNode: byNode, full: full, previous: map[string]inferencev1.NodeCacheStatus{}, st: &st, now: r.Now()}
	for _, ns := range m.Status.Nodes {
		b.previous[ns.Name] = ns
	}
	var t tally
	for _, n := range targets {
		ns := b.entry(n.Name, nil)
		t.count(ns)
		st.Nodes = append(st.Nodes, ns)
	}
	for _, name := range slices.Sorted(maps.Keys(retained)) {
		keep := retained[name]
		st.Nodes = append(st.Nodes, b.entry(name, &keep))
	}
	summarize(&st, m, t)
	limitNodes(&st)
	return st
}

// nodeEntries builds the status's per-node entries.
type nodeEntries struct {
	uid      string
	byNode   map[string]*prewarmv1alpha1.NodeCache
	full     map[string]bool
	previous map[string]inferencev1.NodeCacheStatus
	now      time.Time
	// st takes the cache's size and, from the first Ready node, its revision.
	st *inferencev1.ModelDataCacheConfigStatus
}

// entry builds one node's entry from its agent's report; a retained node is listed with why
// it is kept.
func (b *nodeEntries) entry(name string, keep *retention) inferencev1.NodeCacheStatus {
	st := b.st
	ns := inferencev1.NodeCacheStatus{Name: name, State: inferencev1.CachePending, Retained: keep != nil}
	nc := b.byNode[name]
	switch rep := reportFor(nc, b.uid); {
	case b.full[name]:
		ns.State, ns.Reason = inferencev1.CacheFailed, prewarmv1alpha1.ReasonNodeCacheFull
		ns.Message = fmt.Sprintf("the node is already asked for %d other caches, the most one node holds; delete caches it need not hold, or narrow this cache's placement", prewarmv1alpha1.MaxCachesPerNode)
	case rep != nil:
		ns.State, ns.Reason, ns.Message = rep.State, rep.Reason, rep.Message
		ns.BytesDone, ns.BytesTotal, ns.BytesPerSecond = rep.BytesDone, rep.BytesTotal, rep.BytesPerSecond
		st.TotalBytes = max(st.TotalBytes, rep.BytesTotal)
		if rep.State == inferencev1.CacheReady && st.ResolvedRevision == "" {
			st.ResolvedRevision = rep.Revision
		}
		if rep.State == inferencev1.CacheReady && rep.Revision != "" && rep.Revision != st.ResolvedRevision {
			// Downloaded while the source was rewritten: not the cache's content.
			ns.State, ns.Reason = inferencev1.CacheFailed, prewarmv1alpha1.ReasonSourceChanged
			ns.Message = fmt.Sprintf("holds revision %s, but the cache is pinned to %s, which other nodes hold: the source was rewritten under the same location", rep.Revision, st.ResolvedRevision)
		}
	case nc == nil || nc.Status.HeartbeatTime == nil:
		ns.Reason, ns.Message = "AgentNotReporting", "no prewarm agent reports on this node; is the agent DaemonSet running here?"
	default:
		ns.Reason, ns.Message = "Requested", "the node's agent has not picked the cache up yet"
	}
	if keep != nil {
		ns.Reason, ns.BytesPerSecond = prewarmv1alpha1.ReasonNotTarget, 0
		ns.Message = fmt.Sprintf("not a current target (%s); keeps its copy until %s, downloads nothing new",
			keep.why, keep.until.UTC().Format(time.RFC3339))
	}
	if p, ok := b.previous[name]; ok && p.State == ns.State && p.Retained == ns.Retained {
		ns.LastTransitionTime = p.LastTransitionTime
	} else {
		now := metav1.NewTime(b.now)
		ns.LastTransitionTime = &now
	}
	return ns
}

// tally counts the target nodes by state; retained nodes are not counted.
type tally struct {
	downloading, failed, pending int
	failures                     []string
	firstFailure                 string // reason
	ready                        int32
}

func (t *tally) count(ns inferencev1.NodeCacheStatus) {
	switch ns.State {
	case inferencev1.CacheReady:
		t.ready++
	case inferencev1.CacheDownloading:
		t.downloading++
	case inferencev1.CacheFailed:
		if t.failed == 0 {
			t.firstFailure = ns.Reason
		}
		t.failed++
		t.failures = append(t.failures, fmt.Sprintf("%s: %s", ns.Name, ns.Message))
	default:
		t.pending++
	}
}

// summarize sets the cache's state and Ready condition from the tally of its target nodes.
func summarize(st *inferencev1.ModelDataCacheConfigStatus, m *inferencev1.ModelDataCacheConfig, t tally) {
	st.ReadyNodes = t.ready
	switch {
	case st.TargetNodes == 0:
		st.State = inferencev1.CachePending
		setCondition(st, m, metav1.ConditionFalse, inferencev1.ReasonNoTargetNodes, "no node matches the placement")
	case st.ReadyNodes == st.TargetNodes:
		st.State = inferencev1.CacheReady
		setCondition(st, m, metav1.ConditionTrue, inferencev1.ReasonAllNodesReady,
			fmt.Sprintf("all %d target nodes hold the cache (%s), verified", st.TargetNodes, engine.HumanBytes(st.TotalBytes)))
	case t.failed > 0 && t.downloading == 0 && t.pending == 0:
		st.State = inferencev1.CacheFailed
		setCondition(st, m, metav1.ConditionFalse, t.firstFailure,
			fmt.Sprintf("%d of %d target nodes hold the cache; %d failed: %s", st.ReadyNodes, st.TargetNodes, t.failed, strings.Join(t.failures, "; ")))
	case t.downloading > 0:
		st.State = inferencev1.CacheDownloading
		setCondition(st, m, metav1.ConditionFalse, inferencev1.ReasonDownloading,
			fmt.Sprintf("%d of %d target nodes hold the cache; %d downloading, %d waiting, %d failed", st.ReadyNodes, st.TargetNodes, t.downloading, t.pending, t.failed))
	default:
		st.State = inferencev1.CachePending
		setCondition(st, m, metav1.ConditionFalse, inferencev1.ReasonWaitingForCache,
			fmt.Sprintf("%d of %d target nodes hold the cache; %d waiting, %d failed", st.ReadyNodes, st.TargetNodes, t.pending, t.failed))
	}
}

// limitNodes keeps status.nodes within its limit: past it, the nodes that need attention are
// listed, and the Ready condition says how many were left out.
func limitNodes(st *inferencev1.ModelDataCacheConfigStatus) {
	n := len(st.Nodes)
	if n <= inferencev1.MaxStatusNodes {
		return
	}
	ready := func(n inferencev1.NodeCacheStatus) int {
		if n.State == inferencev1.CacheReady {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(st.Nodes, func(a, b inferencev1.NodeCacheStatus) int { return cmp.Compare(ready(a), ready(b)) })
	st.Nodes = st.Nodes[:inferencev1.MaxStatusNodes]
	c := &st.Conditions[slices.IndexFunc(st.Conditions, func(c metav1.Condition) bool { return c.Type == inferencev1.ConditionReady })]
	c.Message += fmt.Sprintf("; status.nodes lists %d of the %d nodes (those not Ready first)", inferencev1.MaxStatusNodes, n)
}

func setCondition(st *inferencev1.ModelDataCacheConfigStatus, m *inferencev1.ModelDataCacheConfig, status metav1.ConditionStatus, reason, msg string) {
	if len(msg) > 32000 {
		msg = msg[:32000]
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: inferencev1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: m.Generation,
	})
}

// writeStatus writes st when it differs from what is stored.
func (r *Reconciler) writeStatus(ctx context.Context, m *inferencev1.ModelDataCacheConfig, st inferencev1.ModelDataCacheConfigStatus) error {
	return controller.WriteStatus(ctx, r.Client, m, &m.Status, st)
}
