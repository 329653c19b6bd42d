package weightscache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/text"
)

// A namespace's quota (namespaceQuotas) may limit the bytes its caches hold in the cluster
// (maxBytes: each model's size times the nodes asked to hold it) and on each node
// (maxBytesPerNode). The cluster limit is the controller's: a cache is asked of as many of its
// target nodes as the limit leaves room for, those that already hold it first, and the other
// targets are not asked (BudgetExceeded); a target whose pods ask for the cache gets a request
// that says why it keeps no copy, so that its agent serves them a copy from the source. Nodes
// already asked keep their copies when the limit is lowered: nothing is evicted for a quota.
// The per-node limit is each agent's (it sees every cache it holds as it claims the room); the
// controller forecasts it from the nodes' reports, for the WithinBudget condition. The caches
// of one namespace are decided one at a time, and what each was last asked of is remembered
// until the informer shows it, so that two caches decided together do not both take the same
// room.

// refusal is why a target is not asked to hold the cache.
type refusal struct {
	state           inferencev1.CacheState
	reason, message string
}

// quotaDecision is what the namespace's quota decides for the cache.
type quotaDecision struct {
	// refused are the targets the cluster limit keeps the cache off (nil: none).
	refused map[string]refusal
	// cluster is the namespace's use against its cluster limit (nil: none).
	cluster *clusterUse
}

// clusterUse is a namespace's use of its cluster limit, as this cache was decided.
type clusterUse struct {
	limit config.Limit
	// others is what the namespace's other caches hold; copies are this cache's copies asked.
	others int64
	copies int
}

// quotaLocks serialize the decisions of one namespace's caches.
type quotaLocks struct {
	mu sync.Mutex
	ns map[string]*sync.Mutex
	// copies remembers how many nodes each cache was last asked of, and when.
	copies map[string]copiesAsked
}

type copiesAsked struct {
	n  int
	at time.Time
}

// copiesMemory is how long what a cache was asked of is trusted over the informer's view.
const copiesMemory = time.Minute

func (q *quotaLocks) lock(ns string) func() {
	q.mu.Lock()
	if q.ns == nil {
		q.ns = map[string]*sync.Mutex{}
	}
	l := q.ns[ns]
	if l == nil {
		l = &sync.Mutex{}
		q.ns[ns] = l
	}
	q.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (q *quotaLocks) remember(uid string, n int, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.copies == nil {
		q.copies = map[string]copiesAsked{}
	}
	q.copies[uid] = copiesAsked{n: n, at: now}
}

func (q *quotaLocks) recalled(uid string, now time.Time) (int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	c, ok := q.copies[uid]
	if !ok || now.Sub(c.at) > copiesMemory {
		return 0, false
	}
	return c.n, true
}

func (q *quotaLocks) forget(uid string) {
	q.mu.Lock()
	delete(q.copies, uid)
	q.mu.Unlock()
}

// applyQuota decides which targets the namespace's cluster limit leaves room for; the others
// are refused.
func (r *Reconciler) applyQuota(ctx context.Context, s *state) error {
	p := &s.decision
	limit, ok := r.Config.ClusterLimit(s.m.Namespace)
	if !ok || (p.verdict != nil && p.verdict.failed) {
		return nil
	}
	others, err := r.namespaceUse(ctx, s.m)
	if err != nil {
		return err
	}
	var asked, fresh []*corev1.Node
	for _, n := range p.targets {
		if req := s.fleet.request(n.Name); req != nil && req.Refused == nil {
			asked = append(asked, n)
		} else {
			fresh = append(fresh, n)
		}
	}
	// The nodes whose pods wait for the cache first, then by name.
	demand := func(n *corev1.Node) bool { return demanded(s.fleet.nodeCache(n.Name), s.m) }
	slices.SortStableFunc(fresh, func(a, b *corev1.Node) int {
		if da, db := demand(a), demand(b); da != db {
			if da {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	size := p.size.bytes
	left := limit.Bytes - others - int64(len(asked))*size
	allowed := 0
	switch {
	case p.size.known() && left > 0:
		allowed = int(min(left/size, int64(len(fresh))))
	case !p.size.known() && len(asked) == 0 && left > 0:
		allowed = 1 // one node lists the source, and the size is known from then on
	}
	p.quota.cluster = &clusterUse{limit: limit, others: others, copies: len(asked) + allowed}
	for _, n := range fresh[allowed:] {
		if p.quota.refused == nil {
			p.quota.refused = map[string]refusal{}
		}
		if !p.size.known() {
			p.quota.refused[n.Name] = refusal{inferencev1.CachePending, inferencev1.ReasonSizeUnknown, fmt.Sprintf(
				"namespace %s may hold %s of caches in the cluster (%s): the node is asked once the model's size is known (a first node lists it)",
				s.m.Namespace, human(limit.Bytes), limit.Field)}
			continue
		}
		p.quota.refused[n.Name] = refusal{inferencev1.CacheFailed, prewarmv1alpha1.ReasonBudgetExceeded, fmt.Sprintf(
			"namespace %s may hold %s of caches in the cluster (%s); its other caches hold %s and this cache's %d copies %s: no room for another copy (%s); pods on the node read the model from the source",
			s.m.Namespace, human(limit.Bytes), limit.Field, human(others), len(asked)+allowed, human(int64(len(asked)+allowed)*size), human(size))}
	}
	return nil
}

// namespaceUse is what m's namespace's other caches hold in the cluster: each model's size times
// the nodes asked to hold it.
func (r *Reconciler) namespaceUse(ctx context.Context, m *inferencev1.ModelDataCacheConfig) (int64, error) {
	list := &inferencev1.ModelDataCacheConfigList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace)); err != nil {
		return 0, err
	}
	var total int64
	now := r.Now()
	for i := range list.Items {
		c := &list.Items[i]
		if c.UID == m.UID {
			continue
		}
		size := c.Status.TotalBytes
		if c.Status.Capacity != nil {
			size = max(size, c.Status.Capacity.ModelBytes)
		}
		if size == 0 {
			continue
		}
		ncs := &prewarmv1alpha1.NodeCacheList{}
		if err := r.Client.List(ctx, ncs, client.MatchingFields{cacheIndex: string(c.UID)}, client.UnsafeDisableDeepCopy); err != nil {
			return 0, err
		}
		copies := 0
		for j := range ncs.Items {
			if req := requestFor(&ncs.Items[j], string(c.UID)); req != nil && req.Refused == nil {
				copies++
			}
		}
		if n, ok := r.quota.recalled(string(c.UID), now); ok {
			copies = max(copies, n)
		}
		total += size * int64(copies)
	}
	return total, nil
}

// nodeQuota forecasts the namespace's per-node limit on the targets the cluster limit lets hold
// the cache: the namespace's other caches asked of a node, at their reported sizes, and this
// one. It returns the nodes that would go past it (with figures), and how many.
func nodeQuota(f *fleet, targets []*corev1.Node, refused map[string]refusal, ns string, limit config.Limit, size int64) ([]string, int) {
	var over []string
	count := 0
	for _, n := range targets {
		if _, ok := refused[n.Name]; ok {
			continue
		}
		nc := f.nodeCache(n.Name)
		if rep := f.report(n.Name); nc == nil || rep != nil && (rep.State == inferencev1.CacheReady || rep.Reason == prewarmv1alpha1.ReasonBudgetExceeded) {
			continue // holds it, or its agent said (counted from its report)
		}
		var held int64
		for _, req := range nc.Spec.Caches {
			if req.UID == f.uid || req.Namespace != ns || req.Refused != nil {
				continue
			}
			if rep := reportFor(nc, req.UID); rep != nil && (rep.State == inferencev1.CacheReady || rep.State == inferencev1.CacheDownloading) {
				held += max(rep.BytesTotal, rep.DiskBytes)
			}
		}
		if held+size > limit.Bytes {
			count++
			if len(over) < maxFailures {
				over = append(over, fmt.Sprintf("%s (its other caches hold %s)", n.Name, human(held)))
			}
		}
	}
	return over, count
}

// budgetPhase sets the WithinBudget condition: whether the cache keeps its namespace within its
// quota's byte limits, in the cluster and on each node (the agents' reports, and a forecast for
// the nodes that have not said); the condition turning false is told in a BudgetExceeded event.
func (r *Reconciler) budgetPhase(s *state) {
	p, ns := &s.decision, s.m.Namespace
	perNode, hasPerNode := r.Config.PerNodeLimit(ns)
	if (p.quota.cluster == nil && !hasPerNode) || (p.verdict != nil && p.verdict.failed) {
		apimeta.RemoveStatusCondition(&s.status.Conditions, inferencev1.ConditionWithinBudget)
		return
	}
	var problems, fine []string
	if c := p.quota.cluster; c != nil {
		held := fmt.Sprintf("namespace %s may hold %s of caches in the cluster (%s); its other caches hold %s", ns, human(c.limit.Bytes), c.limit.Field, human(c.others))
		switch refusedBudget := countRefused(p.quota.refused, prewarmv1alpha1.ReasonBudgetExceeded); {
		case refusedBudget > 0:
			problems = append(problems, fmt.Sprintf("%s: this cache (%s) fits on %d of its %d target nodes, and is not asked of %d (%s)",
				held, human(p.size.bytes), c.copies, len(p.targets), refusedBudget, controller.Summarize(refusedNames(p.quota.refused), maxFailures)))
		case p.size.known():
			fine = append(fine, fmt.Sprintf("%s, and this cache's %d copies %s", held, c.copies, human(int64(c.copies)*p.size.bytes)))
		default:
			fine = append(fine, held+"; this cache is asked of one node until its size is known")
		}
	}
	if hasPerNode {
		var reported []string
		for _, n := range p.targets {
			if rep := s.fleet.report(n.Name); rep != nil && rep.Reason == prewarmv1alpha1.ReasonBudgetExceeded {
				reported = append(reported, n.Name)
			}
		}
		over, count := []string(nil), 0
		if p.size.known() {
			over, count = nodeQuota(s.fleet, p.targets, p.quota.refused, ns, perNode, p.size.bytes)
		}
		switch {
		case len(reported)+count > 0:
			msg := fmt.Sprintf("namespace %s may hold %s of caches on a node (%s)", ns, human(perNode.Bytes), perNode.Field)
			if len(reported) > 0 {
				msg += fmt.Sprintf("; %d node(s) keep this cache off for it: %s", len(reported), controller.Summarize(reported, maxFailures))
			}
			if count > 0 {
				msg += fmt.Sprintf("; %d more would go past it with this cache (%s): %s", count, human(p.size.bytes), controller.SummarizeOf(over, count, maxFailures, ", "))
			}
			problems = append(problems, msg)
		default:
			fine = append(fine, fmt.Sprintf("every target node stays within namespace %s's %s per node (%s)", ns, human(perNode.Bytes), perNode.Field))
		}
	}
	status, reason, msg := metav1.ConditionTrue, inferencev1.ReasonWithinBudget, strings.Join(fine, "; ")
	if len(problems) > 0 {
		status, reason = metav1.ConditionFalse, inferencev1.ReasonBudgetExceeded
		msg = strings.Join(problems, "; ") + "; pods on those nodes read the model from the source"
	}
	prev := apimeta.FindStatusCondition(s.m.Status.Conditions, inferencev1.ConditionWithinBudget)
	apimeta.SetStatusCondition(&s.status.Conditions, metav1.Condition{
		Type: inferencev1.ConditionWithinBudget, Status: status, Reason: reason, Message: text.Clip(msg, text.MaxConditionMessage), ObservedGeneration: s.m.Generation,
	})
	if status == metav1.ConditionFalse && (prev == nil || prev.Status != metav1.ConditionFalse) {
		s.events.Tell(corev1.EventTypeWarning, inferencev1.ReasonBudgetExceeded, "Check", text.Clip(msg, text.MaxConditionMessage))
	}
}

func countRefused(refused map[string]refusal, reason string) int {
	n := 0
	for _, r := range refused {
		if r.reason == reason {
			n++
		}
	}
	return n
}

func refusedNames(refused map[string]refusal) []string {
	var out []string
	for name, r := range refused {
		if r.reason == prewarmv1alpha1.ReasonBudgetExceeded {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
