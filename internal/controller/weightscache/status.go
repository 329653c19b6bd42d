package weightscache

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/text"
	"github.com/prewarm/prewarm/pkg/engine"
)

// gather builds s.status from the target nodes' NodeCache reports: counts over every node, and
// the bounded list of the nodes that need attention most; s.ready is every node that holds the
// cache Ready, listed or not.
func (r *Reconciler) gather(ctx context.Context, s *state) error {
	m, targets, retained := s.m, s.decision.targets, s.decision.retained
	st := inferencev1.ModelDataCacheConfigStatus{
		ObservedGeneration: m.Generation,
		TargetNodes:        int32(len(targets)),
		ResolvedRevision:   m.Status.ResolvedRevision,
		Conditions:         slices.Clone(m.Status.Conditions),
	}
	if st.ResolvedRevision == "" {
		st.ResolvedRevision = agreedRevision(s.fleet, targets, s.decision.size.revision)
	}
	b := nodeEntries{fleet: s.fleet, unasked: s.unasked, asked: s.decision.entry.Source.Revision, refused: s.decision.quota.refused, previous: map[string]inferencev1.NodeCacheStatus{}, st: &st, now: r.Now(),
		gone: map[string]string{}}
	for _, name := range slices.Concat(nodeNames(targets), slices.Collect(maps.Keys(retained))) {
		agent, err := r.liveness().Of(ctx, name, s.fleet.nodeCache(name))
		if err != nil {
			return err
		}
		if !agent.Alive {
			b.gone[name] = agent.Why
		}
	}
	for _, ns := range m.Status.Nodes {
		b.previous[ns.Name] = ns
	}
	var t tally
	nodes := make([]inferencev1.NodeCacheStatus, 0, len(targets)+len(retained))
	for _, n := range targets {
		ns := b.entry(n.Name, nil)
		t.count(ns)
		nodes = append(nodes, ns)
	}
	for _, name := range slices.Sorted(maps.Keys(retained)) {
		keep := retained[name]
		nodes = append(nodes, b.entry(name, &keep))
	}
	// No node reports the size yet: the controller's listing says it.
	st.TotalBytes = max(st.TotalBytes, s.decision.size.bytes)
	summarize(&st, m, t)
	ready := map[string]bool{}
	for _, ns := range nodes {
		if ns.State == inferencev1.CacheReady {
			ready[ns.Name] = true
		}
	}
	slices.SortFunc(nodes, inferencev1.CompareAttention)
	if len(nodes) > 0 {
		st.Nodes = nodes[:min(len(nodes), inferencev1.MaxStatusNodes)]
	}
	if len(nodes) > len(st.Nodes) {
		c := &st.Conditions[slices.IndexFunc(st.Conditions, func(c metav1.Condition) bool { return c.Type == inferencev1.ConditionReady })]
		c.Message += fmt.Sprintf("; status.nodes lists %d of the %d nodes, those that need attention first (kubectl prewarm status lists every node)", len(st.Nodes), len(nodes))
	}
	s.status, s.ready = st, ready
	return nil
}

func nodeNames(nodes []*corev1.Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Name
	}
	return out
}

// agreedRevision is the revision to pin the cache to, once the target nodes asked to hold it
// agree: the revision most of them hold, by more than any other, held by at least two of them
// (one when only one is asked), or by one when it is the revision the controller's own listing
// found (listed). A single node's word is never enough while others are asked, even when they
// have failed for now: every node asked with a pin it does not find fails with SourceChanged,
// and a pin is for good. Nodes not asked for the cache are not heard. "" until then.
func agreedRevision(f *fleet, targets []*corev1.Node, listed string) string {
	votes, asked := map[string]int{}, 0
	for _, n := range targets {
		if req := f.request(n.Name); req == nil || req.Refused != nil {
			continue
		}
		asked++
		if rep := f.report(n.Name); rep != nil && rep.State == inferencev1.CacheReady && rep.Revision != "" {
			votes[rep.Revision]++
		}
	}
	if listed != "" && votes[listed] > 0 {
		return listed // a node holds what the controller listed
	}
	best, most, tied := "", 0, false
	for rev, n := range votes {
		switch {
		case n > most:
			best, most, tied = rev, n, false
		case n == most:
			tied = true
		}
	}
	if tied || most == 0 || most < min(2, asked) {
		return ""
	}
	return best
}

// nodeEntries builds the status's per-node entries.
type nodeEntries struct {
	fleet *fleet
	// unasked are the nodes whose list could not take the cache, and why.
	unasked map[string]refusal
	// refused are the targets the namespace's quota keeps the cache off.
	refused  map[string]refusal
	previous map[string]inferencev1.NodeCacheStatus
	now      time.Time
	// st takes the cache's size; its revision is pinned beforehand (agreedRevision).
	st *inferencev1.ModelDataCacheConfigStatus
	// asked is the revision the nodes are asked for before the cache is pinned ("": any), the
	// one the controller listed for a namespace with a quota in the cluster.
	asked string
	// gone are the nodes whose agent is not alive (its Lease expired), with why: what they
	// reported is not counted.
	gone map[string]string
}

// entry builds one node's entry from its agent's report; a retained node is listed with why
// it is kept.
func (b *nodeEntries) entry(name string, keep *retention) inferencev1.NodeCacheStatus {
	st := b.st
	ns := inferencev1.NodeCacheStatus{Name: name, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CachePending}, Retained: keep != nil}
	rep, reported := b.fleet.nodeCache(name).Report(b.fleet.uid)
	switch {
	case b.unasked[name].reason != "" && !reported:
		no := b.unasked[name]
		ns.State, ns.Reason, ns.Message = no.state, no.reason, no.message
	case b.unasked[name].reason != "":
		// The node holds or fetches the cache as asked before; its new request was left out.
		no := b.unasked[name]
		ns.CopyStatus = rep.CopyStatus
		ns.Message = text.Clip(fmt.Sprintf("%s; its new request was left out (%s): %s", rep.Message, no.reason, no.message), text.MaxMessage)
	case b.gone[name] != "" && (!reported || rep.State != inferencev1.CacheFailed || !prewarmv1alpha1.Terminal(rep.Reason)):
		// A node whose agent is gone cannot serve its pods' model volumes: not counted Ready.
		// A failure waiting will not fix stays one.
		ns.Reason, ns.Message = prewarmv1alpha1.ReasonAgentNotReporting, b.gone[name]
		if reported {
			ns.Message += fmt.Sprintf(" (it last reported the cache %s: %s)", rep.State, rep.Reason)
		}
	case !reported && b.refused[name].reason != "":
		no := b.refused[name]
		ns.State, ns.Reason, ns.Message = no.state, no.reason, no.message
	case !reported:
		ns.Reason, ns.Message = rep.Reason, rep.Message
	default:
		ns.CopyStatus = rep.CopyStatus
		st.TotalBytes = max(st.TotalBytes, rep.BytesTotal)
		st.OriginBytes += rep.OriginBytes
		st.PeerBytes += rep.PeerBytes
		if pin := cmp.Or(st.ResolvedRevision, b.asked); rep.State == inferencev1.CacheReady && rep.Revision != "" && pin != "" && rep.Revision != pin {
			// Downloaded while the source was rewritten: not the cache's content.
			ns.State, ns.Reason = inferencev1.CacheFailed, prewarmv1alpha1.ReasonSourceChanged
			ns.Message = fmt.Sprintf("holds revision %s, but the cache is pinned to %s: the source was rewritten under the same location", rep.Revision, pin)
		}
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
	// noDisk are the nodes that have no local disk for caches (NoLocalDisk): not counted as
	// targets (their pods read the model from the source), named in the Ready condition.
	noDisk      int
	noDiskNodes []string
	// evicted are the nodes that evicted the cache to make room (Evicted): settled, and the
	// cache is Ready when every other target holds it.
	evicted      int
	evictedNodes []string
	// overBudget are the nodes the namespace's quota keeps the cache off (BudgetExceeded):
	// settled, and the cache is Ready when every other target holds it.
	overBudget      int
	overBudgetNodes []string
	// failures are the first maxFailures failed nodes, for the Ready condition's message.
	failures     []string
	firstFailure string // reason
	ready        int32
	// settled counts the nodes that are Ready or failed for a reason waiting will not fix.
	settled int32
}

// maxFailures is how many failed nodes the Ready condition names.
const maxFailures = 10

func (t *tally) count(ns inferencev1.NodeCacheStatus) {
	if ns.State == inferencev1.CacheFailed && ns.Reason == prewarmv1alpha1.ReasonNoLocalDisk {
		t.noDisk++
		if len(t.noDiskNodes) < maxFailures {
			t.noDiskNodes = append(t.noDiskNodes, ns.Name)
		}
		return
	}
	if ns.State == inferencev1.CacheFailed && ns.Reason == prewarmv1alpha1.ReasonBudgetExceeded {
		t.overBudget++
		t.settled++
		if len(t.overBudgetNodes) < maxFailures {
			t.overBudgetNodes = append(t.overBudgetNodes, ns.Name)
		}
		return
	}
	switch ns.State {
	case inferencev1.CacheReady:
		t.ready++
		t.settled++
	case inferencev1.CacheDownloading:
		t.downloading++
	case inferencev1.CacheFailed:
		if t.failed == 0 {
			t.firstFailure = ns.Reason
		}
		t.failed++
		if prewarmv1alpha1.Terminal(ns.Reason) {
			t.settled++
		}
		if len(t.failures) < maxFailures {
			t.failures = append(t.failures, fmt.Sprintf("%s: %s", ns.Name, ns.Message))
		}
	case inferencev1.CachePending:
		if ns.Reason == prewarmv1alpha1.ReasonEvicted {
			// It waits for room, which may not come: the Deployment gate does not wait for it.
			t.evicted++
			t.settled++
			if len(t.evictedNodes) < maxFailures {
				t.evictedNodes = append(t.evictedNodes, ns.Name)
			}
			return
		}
		t.pending++
	default:
		t.pending++
	}
}

// summarize sets the cache's state and Ready condition from the tally of its target nodes.
func summarize(st *inferencev1.ModelDataCacheConfigStatus, m *inferencev1.ModelDataCacheConfig, t tally) {
	st.ReadyNodes, st.SettledNodes = t.ready, t.settled
	st.DownloadingNodes, st.FailedNodes = int32(t.downloading), int32(t.failed)
	// Nodes with no local disk for caches hold none: they are not the cache's targets.
	st.TargetNodes -= int32(t.noDisk)
	defer func() {
		if t.evicted > 0 {
			appendCondition(st, fmt.Sprintf("%d node(s) evicted the cache to make room for others (%s: %s); they fetch it again when it fits, or when a pod there asks for it",
				t.evicted, prewarmv1alpha1.ReasonEvicted, controller.SummarizeOf(t.evictedNodes, t.evicted, maxFailures, ", ")))
		}
		if t.overBudget > 0 {
			appendCondition(st, fmt.Sprintf("%d node(s) keep no copy for the namespace's quota (%s: %s); their pods read the model from the source",
				t.overBudget, prewarmv1alpha1.ReasonBudgetExceeded, controller.SummarizeOf(t.overBudgetNodes, t.overBudget, maxFailures, ", ")))
		}
		if t.noDisk > 0 {
			appendCondition(st, fmt.Sprintf("%d node(s) have no local disk for caches (%s: %s); their pods read the model from the source",
				t.noDisk, prewarmv1alpha1.ReasonNoLocalDisk, controller.SummarizeOf(t.noDiskNodes, t.noDisk, maxFailures, ", ")))
		}
	}()
	switch {
	case st.TargetNodes == 0:
		st.State = inferencev1.CachePending
		setCondition(st, m, metav1.ConditionFalse, inferencev1.ReasonNoTargetNodes, "no node matches the placement")
	case st.ReadyNodes == st.TargetNodes, st.ReadyNodes > 0 && int(st.ReadyNodes)+t.evicted+t.overBudget == int(st.TargetNodes):
		// Evicted nodes hold it no longer, for want of room, and the namespace's quota keeps it
		// off others, but every other target holds it.
		st.State = inferencev1.CacheReady
		held := fmt.Sprintf("all %d target nodes hold the cache (%s), verified", st.TargetNodes, engine.HumanBytes(st.TotalBytes))
		if t.evicted+t.overBudget > 0 {
			held = fmt.Sprintf("%d of %d target nodes hold the cache (%s), verified", st.ReadyNodes, st.TargetNodes, engine.HumanBytes(st.TotalBytes))
		}
		setCondition(st, m, metav1.ConditionTrue, inferencev1.ReasonAllNodesReady, held)
	case t.overBudget > 0 && t.overBudget+t.evicted == int(st.TargetNodes):
		st.State = inferencev1.CacheFailed
		setCondition(st, m, metav1.ConditionFalse, prewarmv1alpha1.ReasonBudgetExceeded,
			fmt.Sprintf("none of the %d target nodes may hold the cache within its namespace's quota (WithinBudget)", st.TargetNodes))
	case t.failed > 0 && t.downloading == 0 && t.pending == 0:
		st.State = inferencev1.CacheFailed
		setCondition(st, m, metav1.ConditionFalse, t.firstFailure,
			fmt.Sprintf("%d of %d target nodes hold the cache; %d failed: %s", st.ReadyNodes, st.TargetNodes, t.failed, controller.SummarizeOf(t.failures, t.failed, maxFailures, "; ")))
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

func setCondition(st *inferencev1.ModelDataCacheConfigStatus, m *inferencev1.ModelDataCacheConfig, status metav1.ConditionStatus, reason, msg string) {
	msg = text.Clip(msg, text.MaxConditionMessage)
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: inferencev1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: m.Generation,
	})
}

// appendCondition adds a sentence to the Ready condition's message.
func appendCondition(st *inferencev1.ModelDataCacheConfigStatus, msg string) {
	if c := meta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady); c != nil {
		c.Message = text.Clip(c.Message+"; "+msg, text.MaxConditionMessage)
	}
}

// noteExcluded says, on the Ready condition, which nodes the placement selects but the pods
// could not run on (a taint they do not tolerate, a cordon), so that a cache with fewer
// targets than nodes says why.
func noteExcluded(st *inferencev1.ModelDataCacheConfigStatus, e placement.LeftOut) {
	if e.Count() > 0 {
		appendCondition(st, e.Describe("the pods could not run there"))
	}
}

// noteGrant says, on the Ready condition of a standalone cache, which nodes its placement
// selects that its namespace's grant leaves out, and which of its tolerations are not honoured.
func noteGrant(st *inferencev1.ModelDataCacheConfigStatus, d decision) {
	if d.bounded == nil {
		return
	}
	if d.notGranted.Count() > 0 {
		appendCondition(st, d.notGranted.Describe(placement.NotGrantedLead))
	}
	if d.bounded.Note != "" {
		appendCondition(st, d.bounded.Note)
	}
}

// writeStatus writes st when it differs from what is stored.
func (r *Reconciler) writeStatus(ctx context.Context, m *inferencev1.ModelDataCacheConfig, st inferencev1.ModelDataCacheConfigStatus) error {
	return controller.WriteStatus(ctx, r.Client, m, &m.Status, st)
}
