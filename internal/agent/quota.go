package agent

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/pkg/engine"
)

// A namespace's quota may limit what its caches hold together on one node
// (namespaceQuotas[].maxBytesPerNode), with the copies the node makes for their pods when it
// cannot hold a cache (scratch). The agent holds the line when a download claims its room: the
// namespace's other caches on the node that hold bytes (Ready, or downloading with room
// promised) count at their size, its copies at what they take or were promised, and a cache
// that would take the namespace past its limit writes nothing and fails BudgetExceeded. No copy
// is made for its pods either (a namespace refused a cache does not get the same bytes as a
// copy): their mount is refused, naming the limit, and they wait. A copy made before (when the
// node had no room for the cache) is still served, and does not count against its own cache: the
// two are one model, and the copy goes with its pods. The cache is tried again when another
// cache or copy of the namespace leaves the node, and at the longest retry interval.

// errOverBudget says a cache, or a copy of one, would take its namespace past its per-node
// limit.
type errOverBudget struct {
	ns    string
	limit config.Limit
	// what needs size bytes more: "this cache", or a copy for the pods.
	what string
	size int64
	// held is what the namespace's other caches and copies on the node hold, and which they are.
	held   int64
	others []string
}

// thisCache is errOverBudget.what for a cache's own download.
const thisCache = "this cache"

func (e *errOverBudget) Error() string {
	s := fmt.Sprintf("namespace %s may hold %s on this node (%s); its other caches and copies here hold %s",
		e.ns, engine.HumanBytes(e.limit.Bytes), e.limit.Field, engine.HumanBytes(e.held))
	if len(e.others) > 0 {
		s += " (" + strings.Join(e.others, ", ") + ")"
	}
	s += fmt.Sprintf(", and %s needs %s more", e.what, engine.HumanBytes(e.size))
	if e.what == thisCache {
		s += ": not kept here, nor copied for its pods on the node, which wait for room"
	}
	return s
}

// quotaPeer is another cache of the same namespace on the node, as the claim sees it.
type quotaPeer struct {
	j   *cachejob.Job
	uid string
}

// namespaceCaches returns the node's caches of namespace ns other than uid (under a.mu).
func (a *Agent) namespaceCaches(ns, uid string) []quotaPeer {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []quotaPeer
	for other, j := range a.jobs {
		if other != uid && j.Request().Namespace == ns && !a.isRemoving(other) {
			out = append(out, quotaPeer{j: j, uid: other})
		}
	}
	slices.SortFunc(out, func(x, y quotaPeer) int { return strings.Compare(x.uid, y.uid) })
	return out
}

// checkQuotaLocked reports whether cache uid of namespace ns, which needs need bytes more under
// root, keeps its namespace within its per-node limit (a.space.mu held: claims made meanwhile
// are counted), with the namespace's copies of its other caches (copies, scratchUsesLocked).
func (a *Agent) checkQuotaLocked(root, ns, uid string, peers []quotaPeer, copies map[string]scratchUse, need int64) error {
	limit, ok := a.opts.Config.PerNodeLimit(ns)
	if !ok {
		return nil
	}
	size := a.cacheBytes(root, uid) + need
	held, others := a.namespaceHeldLocked(ns, peers, copies, uid)
	if held+size <= limit.Bytes {
		return nil
	}
	return &errOverBudget{ns: ns, limit: limit, what: thisCache, size: size, held: held, others: others}
}

// namespaceHeldLocked is what namespace ns holds on the node (a.space.mu held): its caches
// peers, at their size, and its copies, at what they take or were promised, but for the copy of
// cache skip; and, for people, which they are.
func (a *Agent) namespaceHeldLocked(ns string, peers []quotaPeer, copies map[string]scratchUse, skip string) (int64, []string) {
	var held int64
	var others []string
	for _, p := range peers {
		st := p.j.Snapshot()
		c, claimed := a.space.claims[p.uid]
		var n int64
		switch {
		case claimed:
			n = max(a.cacheBytes(c.root, p.uid), c.at+c.need)
		case st.State == inferencev1.CacheReady:
			n = max(st.BytesTotal, st.DiskBytes)
		default:
			continue // holds nothing it is promised, or is not downloading: the first to claim goes first
		}
		held += n
		others = append(others, fmt.Sprintf("%s/%s %s", ns, p.j.Request().Name, engine.HumanBytes(n)))
	}
	for _, uid := range slices.Sorted(maps.Keys(copies)) {
		u := copies[uid]
		if uid == skip || u.ns != ns || u.held() == 0 {
			continue
		}
		held += u.held()
		others = append(others, fmt.Sprintf("a copy of %s %s", u.cache, engine.HumanBytes(u.held())))
	}
	return held, others
}

// wakeOverBudget wakes the caches of namespace ns that wait for room in its per-node limit, and
// the copies refused room: one of the namespace's caches or copies left the node.
func (a *Agent) wakeOverBudget(ns string) {
	for _, p := range a.namespaceCaches(ns, "") {
		if st := p.j.Snapshot(); st.State == inferencev1.CacheFailed && st.Reason == prewarmv1alpha1.ReasonBudgetExceeded {
			p.j.Wake()
		}
	}
	a.wakeScratches()
}
