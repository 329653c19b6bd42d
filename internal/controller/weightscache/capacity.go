package weightscache

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/text"
)

// Once the model's size is known (size.go), the controller checks each target node's room for it
// from what the node's agent reports of its disk, before the node downloads anything: the
// room caches may still take there without evicting (the root's freeBytes: after the reserve,
// up to the high watermark), and what the node could evict for it (Ready caches under the same
// root that are not pinned, of no higher priority, and that no pod on the node asks for). A node
// that could not hold the model even so is short; the cache's CapacityAvailable condition (and
// its parent's) names such nodes with their figures, and a CapacityShortfall event tells when it
// turns false. The node's agent makes the same check when it claims the room, against the disk
// as it is then; this one is a forecast, for people and for refusing a parent
// (controller.capacityShortfall: Refuse).

// room is one target node's room for the cache, as its agent reported it.
type room struct {
	node string
	kind roomKind
	// free is what caches may still take under the root without evicting; evictable what the
	// node could evict for this cache; have what of the cache is on the disk already.
	free, evictable, have int64
	// verdict is the agent's own word on a cache it found no room for.
	verdict string
}

// roomKind is what is known of a node's room.
type roomKind int

const (
	// roomUnknown: the node's agent has not reported the cache's root.
	roomUnknown roomKind = iota
	// roomNoDisk: the root is no disk of its own there (NoLocalDisk): the node is no target.
	roomNoDisk
	// roomHeld: the node holds the cache.
	roomHeld
	// roomNone: the node's agent found no room for it (InsufficientCapacity).
	roomNone
	// roomOverBudget: the node's agent keeps it off for the namespace's per-node limit.
	roomOverBudget
	// roomMeasured: free and evictable say.
	roomMeasured
)

// roomOn reads node's room for the cache from its NodeCache: its root's report, and its other
// caches that could be evicted for one of priority.
func roomOn(f *fleet, node, hostPath string, priority int32) room {
	rm := room{node: node}
	nc := f.nodeCache(node)
	if nc == nil || nc.Status.HeartbeatTime == nil {
		return rm
	}
	if rep := f.report(node); rep != nil {
		switch {
		case rep.State == inferencev1.CacheReady:
			rm.kind = roomHeld
			return rm
		case rep.Reason == prewarmv1alpha1.ReasonNoLocalDisk:
			rm.kind = roomNoDisk
			return rm
		case rep.Reason == prewarmv1alpha1.ReasonBudgetExceeded:
			rm.kind = roomOverBudget
			return rm
		case rep.State == inferencev1.CacheFailed && rep.Reason == prewarmv1alpha1.ReasonInsufficientCapacity:
			rm.kind, rm.verdict = roomNone, rep.Message
			return rm
		}
		rm.have = rep.DiskBytes
	}
	i := slices.IndexFunc(nc.Status.Roots, func(r prewarmv1alpha1.RootStatus) bool { return r.Path == hostPath })
	switch {
	case i < 0:
		return rm
	case nc.Status.Roots[i].Reason == prewarmv1alpha1.ReasonNoLocalDisk:
		rm.kind = roomNoDisk
		return rm
	case nc.Status.Roots[i].Reason != "":
		return rm
	}
	rm.kind, rm.free = roomMeasured, nc.Status.Roots[i].FreeBytes
	for _, c := range nc.Status.Caches {
		if c.UID == f.uid || c.State != inferencev1.CacheReady {
			continue
		}
		r := requestFor(nc, c.UID)
		used := slices.ContainsFunc(nc.Status.Demands, func(d prewarmv1alpha1.CacheDemand) bool { return d.UID == c.UID })
		if r == nil || r.Root != hostPath || r.Pinned || r.Priority > priority || used {
			continue
		}
		rm.evictable += max(c.DiskBytes, c.BytesTotal)
	}
	return rm
}

// capacityView is the check of every target node's room.
type capacityView struct {
	size estimate
	// fit, byEvicting, short, overBudget and unknown count the targets; shortNodes name the
	// first short ones, with their figures.
	fit, byEvicting, short, overBudget, unknown int
	shortNodes                                  []string
}

// checkCapacity checks the room of each target node; those the quota keeps the cache off
// (skip) are counted over budget.
func checkCapacity(f *fleet, targets []*corev1.Node, skip map[string]refusal, hostPath string, priority int32, size estimate) capacityView {
	v := capacityView{size: size}
	shortOne := func(msg string) {
		v.short++
		if len(v.shortNodes) < maxFailures {
			v.shortNodes = append(v.shortNodes, msg)
		}
	}
	for _, n := range targets {
		if no, ok := skip[n.Name]; ok {
			if no.reason == prewarmv1alpha1.ReasonBudgetExceeded {
				v.overBudget++
			} else {
				v.unknown++
			}
			continue
		}
		rm := roomOn(f, n.Name, hostPath, priority)
		switch need := size.bytes - rm.have; {
		case rm.kind == roomNoDisk:
		case rm.kind == roomHeld:
			v.fit++
		case rm.kind == roomOverBudget:
			v.overBudget++
		case rm.kind == roomNone:
			shortOne(fmt.Sprintf("%s (its agent: %s)", n.Name, rm.verdict))
		case rm.kind == roomUnknown || !size.known():
			v.unknown++
		case need <= rm.free:
			v.fit++
		case need <= rm.free+rm.evictable:
			v.fit++
			v.byEvicting++
		default:
			shortOne(fmt.Sprintf("%s has %s free for caches and %s it may evict", n.Name, human(rm.free), human(rm.evictable)))
		}
	}
	return v
}

// condition is the CapacityAvailable condition the view gives.
func (v capacityView) condition() (metav1.ConditionStatus, string, string) {
	targets := v.fit + v.short + v.overBudget + v.unknown
	if v.short > 0 {
		msg := fmt.Sprintf("%d of %d target nodes cannot hold the model, even after evicting what the policy lets go: %s",
			v.short, targets, controller.SummarizeOf(v.shortNodes, v.short, maxFailures, "; "))
		if v.size.known() {
			msg += fmt.Sprintf("; the model is %s (%s)", human(v.size.bytes), v.size.from)
		}
		return metav1.ConditionFalse, inferencev1.ReasonCapacityShortfall, msg + "; pods there read the model from the source"
	}
	if !v.size.known() {
		return metav1.ConditionUnknown, inferencev1.ReasonSizeUnknown, "the model's size is not known yet: " + v.size.problem
	}
	if v.unknown > 0 && v.fit+v.overBudget == 0 {
		return metav1.ConditionUnknown, inferencev1.ReasonDisksNotReported, fmt.Sprintf("none of the %d target nodes has reported its disk yet; the model is %s (%s)",
			v.unknown, human(v.size.bytes), v.size.from)
	}
	msg := fmt.Sprintf("the %d target nodes that reported their disks can hold the model (%s, %s)", v.fit, human(v.size.bytes), v.size.from)
	if v.byEvicting > 0 {
		msg += fmt.Sprintf("; %d of them by evicting caches no pod uses", v.byEvicting)
	}
	if v.overBudget > 0 {
		msg += fmt.Sprintf("; %d more are kept off by the namespace's quota (WithinBudget)", v.overBudget)
	}
	if v.unknown > 0 {
		msg += fmt.Sprintf("; %d have not reported their disks yet", v.unknown)
	}
	return metav1.ConditionTrue, inferencev1.ReasonFits, msg
}

// capacityPhase checks the target nodes' room for the model (the decision's size and quota
// come first) and sets the cache's capacity status and CapacityAvailable condition; the
// condition turning false is told in a CapacityShortfall event.
func (r *Reconciler) capacityPhase(s *state) {
	p := &s.decision
	if p.verdict != nil && p.verdict.failed {
		apimeta.RemoveStatusCondition(&s.status.Conditions, inferencev1.ConditionCapacityAvailable)
		return
	}
	v := checkCapacity(s.fleet, p.targets, p.quota.refused, s.m.Spec.HostPath, p.entry.Priority, p.size)
	s.status.Capacity = &inferencev1.CapacityStatus{
		ModelBytes: p.size.bytes, FitNodes: int32(v.fit), ShortNodes: int32(v.short), OverBudgetNodes: int32(v.overBudget), UnknownNodes: int32(v.unknown),
	}
	status, reason, msg := v.condition()
	prev := apimeta.FindStatusCondition(s.m.Status.Conditions, inferencev1.ConditionCapacityAvailable)
	apimeta.SetStatusCondition(&s.status.Conditions, metav1.Condition{
		Type: inferencev1.ConditionCapacityAvailable, Status: status, Reason: reason, Message: text.Clip(msg, text.MaxConditionMessage), ObservedGeneration: s.m.Generation,
	})
	if status == metav1.ConditionFalse && (prev == nil || prev.Status != metav1.ConditionFalse) {
		s.events.Tell(corev1.EventTypeWarning, inferencev1.ReasonCapacityShortfall, "Check", text.Clip(msg, text.MaxConditionMessage))
	}
}
