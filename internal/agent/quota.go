package agent

import (
	"fmt"
	"slices"
	"strings"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/pkg/engine"
)

// A namespace's quota may limit what its caches hold together on one node
// (namespaceQuotas[].maxBytesPerNode). The agent holds the line when a download claims its room:
// the namespace's other caches on the node that hold bytes (Ready, or downloading with room
// promised) count at their size, and a cache that would take the namespace past its limit
// writes nothing and fails BudgetExceeded. Its pods on the node read the model from the source
// into a copy that goes with them, as on a node without room. It is tried again when another
// cache of the namespace leaves the node, and at the longest retry interval.

// errOverBudget says a cache would take its namespace past its per-node limit.
type errOverBudget struct {
	ns    string
	limit config.Limit
	size  int64
	// held is what the namespace's other caches on the node hold, and which they are.
	held   int64
	others []string
}

func (e *errOverBudget) Error() string {
	s := fmt.Sprintf("namespace %s may hold %s of caches on this node (%s); its other caches here hold %s",
		e.ns, engine.HumanBytes(e.limit.Bytes), e.limit.Field, engine.HumanBytes(e.held))
	if len(e.others) > 0 {
		s += " (" + strings.Join(e.others, ", ") + ")"
	}
	return s + fmt.Sprintf(", and this cache needs %s more: not kept here; pods on the node read the model from the source", engine.HumanBytes(e.size))
}

// quotaPeer is another cache of the same namespace on the node, as the claim sees it.
type quotaPeer struct {
	j   *job
	uid string
}

// namespaceCaches returns the node's other caches of namespace ns (under a.mu).
func (a *Agent) namespaceCaches(ns, uid string) []quotaPeer {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []quotaPeer
	for other, j := range a.jobs {
		if other != uid && j.req.Namespace == ns && !a.isRemoving(other) {
			out = append(out, quotaPeer{j: j, uid: other})
		}
	}
	slices.SortFunc(out, func(x, y quotaPeer) int { return strings.Compare(x.uid, y.uid) })
	return out
}

// checkQuotaLocked reports whether cache uid of namespace ns, which needs need bytes more under
// root, keeps its namespace within its per-node limit (a.space.mu held: claims made meanwhile
// are counted).
func (a *Agent) checkQuotaLocked(root, ns, uid string, peers []quotaPeer, need int64) error {
	limit, ok := a.opts.Config.PerNodeLimit(ns)
	if !ok {
		return nil
	}
	size := a.cacheBytes(root, uid) + need
	var held int64
	var others []string
	for _, p := range peers {
		st := p.j.snapshot()
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
		others = append(others, fmt.Sprintf("%s/%s %s", ns, p.j.req.Name, engine.HumanBytes(n)))
	}
	if held+size <= limit.Bytes {
		return nil
	}
	return &errOverBudget{ns: ns, limit: limit, size: size, held: held, others: others}
}

// wakeOverBudget wakes the caches of namespace ns that wait for room in its per-node limit: one
// of its caches left the node.
func (a *Agent) wakeOverBudget(ns string) {
	for _, p := range a.namespaceCaches(ns, "") {
		if st := p.j.snapshot(); st.State == inferencev1.CacheFailed && st.Reason == prewarmv1alpha1.ReasonBudgetExceeded {
			p.j.wake()
		}
	}
}

// wake gets the job out of its wait, to look at its cache again now.
func (j *job) wake() {
	select {
	case j.changed <- struct{}{}:
	default:
	}
}
