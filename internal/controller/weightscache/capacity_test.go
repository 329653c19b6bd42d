package weightscache

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
)

const (
	capUID   = "cccccccc-0000-4000-8000-000000000001"
	otherUID = "cccccccc-0000-4000-8000-000000000002"
	root     = "/opt/dlami/nvme"
	gib      = int64(1) << 30
)

// diskNode is a NodeCache whose agent reports its root with free bytes, and holds another cache
// of size other (0: none) under that root, of priority, pinned or not, and used by a pod or not.
func diskNode(free, other int64, priority int32, pinned, used bool) *prewarmv1alpha1.NodeCache {
	hb := metav1.NewTime(time.Now())
	nc := &prewarmv1alpha1.NodeCache{Status: prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: &hb,
		Roots: []prewarmv1alpha1.RootStatus{{Path: root, CapacityBytes: 1000 * gib, FreeBytes: free}}}}
	if other > 0 {
		nc.Spec.Caches = append(nc.Spec.Caches, prewarmv1alpha1.CacheRequest{UID: otherUID, Namespace: "b", Name: "other", Root: root, Priority: priority, Pinned: pinned})
		nc.Status.Caches = append(nc.Status.Caches, prewarmv1alpha1.CacheStatus{UID: otherUID, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesTotal: other, DiskBytes: other}})
		if used {
			nc.Status.Demands = []prewarmv1alpha1.CacheDemand{{UID: otherUID, Namespace: "b", Pods: 1}}
		}
	}
	return nc
}

func named(names ...string) []*corev1.Node {
	var out []*corev1.Node
	for _, n := range names {
		out = append(out, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	return out
}

// Each target's room for a 145 GiB model is read from its agent's report: free room fits, room
// by evicting what the policy lets go fits, a pinned, higher-priority or used cache is not
// counted as room, an agent's own verdict stands, and a node that has not reported is unknown.
// The condition names the short nodes with their figures.
func TestCapacityIsCheckedFromTheNodesReports(t *testing.T) {
	reported := func(state inferencev1.CacheState, reason, msg string) *prewarmv1alpha1.NodeCache {
		nc := diskNode(10*gib, 0, 0, false, false)
		nc.Status.Caches = append(nc.Status.Caches, prewarmv1alpha1.CacheStatus{UID: capUID, CopyStatus: inferencev1.CopyStatus{State: state, Reason: reason, Message: msg}})
		return nc
	}
	f := &fleet{uid: capUID, byNode: map[string]*prewarmv1alpha1.NodeCache{
		"roomy":     diskNode(200*gib, 0, 0, false, false),
		"evicts":    diskNode(100*gib, 50*gib, 0, false, false),
		"pinned":    diskNode(100*gib, 50*gib, 0, true, false),
		"higher":    diskNode(100*gib, 50*gib, 5, false, false),
		"used":      diskNode(100*gib, 50*gib, 0, false, true),
		"holds":     reported(inferencev1.CacheReady, prewarmv1alpha1.ReasonVerified, ""),
		"agentsaid": reported(inferencev1.CacheFailed, prewarmv1alpha1.ReasonInsufficientCapacity, "needs 145 GB more"),
		"nodisk":    reported(inferencev1.CacheFailed, prewarmv1alpha1.ReasonNoLocalDisk, "not a disk of its own"),
	}}
	targets := named("roomy", "evicts", "pinned", "higher", "used", "holds", "agentsaid", "nodisk", "silent", "quota")
	size := estimate{bytes: 145 * gib, from: "listed from the source: 30 files"}
	v := checkCapacity(f, targets, map[string]refusal{"quota": {reason: prewarmv1alpha1.ReasonBudgetExceeded}}, root, 0, size)
	if v.fit != 3 || v.byEvicting != 1 || v.short != 4 || v.overBudget != 1 || v.unknown != 1 {
		t.Fatalf("fit %d (by evicting %d), short %d, over budget %d, unknown %d; want 3 (1), 4, 1, 1", v.fit, v.byEvicting, v.short, v.overBudget, v.unknown)
	}
	status, reason, msg := v.condition()
	if status != metav1.ConditionFalse || reason != inferencev1.ReasonCapacityShortfall {
		t.Errorf("condition %s %s; want False CapacityShortfall", status, reason)
	}
	for _, want := range []string{
		"4 of 9 target nodes cannot hold the model",
		"pinned has 107.4 GB free for caches and 0 B it may evict",
		"higher has 107.4 GB free for caches and 0 B it may evict",
		"used has 107.4 GB free",
		"agentsaid (its agent: needs 145 GB more)",
		"the model is 155.7 GB (listed from the source: 30 files)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}

	// All fit: true, and says how many by evicting and which are unknown.
	v = checkCapacity(f, named("roomy", "evicts", "silent"), nil, root, 0, size)
	if status, reason, msg := v.condition(); status != metav1.ConditionTrue || reason != inferencev1.ReasonFits ||
		!strings.Contains(msg, "the 2 target nodes that reported their disks can hold the model") || !strings.Contains(msg, "1 of them by evicting") ||
		!strings.Contains(msg, "1 have not reported") {
		t.Errorf("condition %s %s %q", status, reason, msg)
	}
	// Unknown size: unknown, with why.
	v = checkCapacity(f, named("roomy"), nil, root, 0, estimate{problem: "an FSx file system is mounted on the nodes only"})
	if status, reason, msg := v.condition(); status != metav1.ConditionUnknown || reason != inferencev1.ReasonSizeUnknown || !strings.Contains(msg, "FSx") {
		t.Errorf("condition %s %s %q", status, reason, msg)
	}
}

// The per-node forecast counts the namespace's other caches each target is asked for, at their
// reported sizes, and names the nodes this cache would take past the limit.
func TestNodeQuotaForecast(t *testing.T) {
	mine := func(held int64, state inferencev1.CacheState) *prewarmv1alpha1.NodeCache {
		nc := diskNode(500*gib, 0, 0, false, false)
		nc.Spec.Caches = append(nc.Spec.Caches, prewarmv1alpha1.CacheRequest{UID: otherUID, Namespace: "a", Name: "first", Root: root})
		nc.Status.Caches = append(nc.Status.Caches, prewarmv1alpha1.CacheStatus{UID: otherUID, CopyStatus: inferencev1.CopyStatus{State: state, BytesTotal: held}})
		return nc
	}
	f := &fleet{uid: capUID, byNode: map[string]*prewarmv1alpha1.NodeCache{
		"full":    mine(80*gib, inferencev1.CacheReady),
		"filling": mine(80*gib, inferencev1.CacheDownloading),
		"evicted": mine(80*gib, inferencev1.CachePending), // holds nothing now
		"empty":   diskNode(500*gib, 0, 0, false, false),
	}}
	limit := config.Limit{Bytes: 100 * gib, Field: "namespaceQuotas[0].maxBytesPerNode"}
	over, n := nodeQuota(f, named("full", "filling", "evicted", "empty"), nil, "a", limit, 40*gib)
	if n != 2 || len(over) != 2 || !strings.Contains(over[0], "full (its other caches hold 85.9 GB)") {
		t.Errorf("over %v (%d); want full and filling", over, n)
	}
	if _, n := nodeQuota(f, named("full"), nil, "b", limit, 40*gib); n != 0 {
		t.Errorf("another namespace's caches counted against b: %d", n)
	}
}
