package agent

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// The peer server reviews the tokens other agents present (tokenreview.Reviewer).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// Peers is how an agent shares the parts of its caches with other agents.
type Peers struct {
	// Server offers this node's parts; the agent offers each cache it downloads or holds.
	Server *peer.Server
	// Address is host:port where Server answers, reported in the NodeCache status for the
	// controller to hand to other nodes.
	Address string
	// Token is the credentials this agent presents to others.
	Token func() (string, error)
	// Client sends the requests to peers.
	Client *http.Client
	// Wait, Stall, SlowPart and Streams are peer.SwarmOptions'.
	Wait, Stall, SlowPart time.Duration
	Streams               int
	// TrustPeers is engine.Request's: files without a source digest come from peers too.
	TrustPeers bool
	// Witness, when set, is the controller's witness: the parts of S3 files without a digest
	// of their own are read through it, and taken from peers checked against its digests.
	Witness *cachejob.Witness
	// Metrics count dropped peers and waits.
	Metrics *peer.Metrics
}

// offer offers a Ready cache's parts to the node's peers (when it has a part table: a cache
// published before part CRCs were recorded offers nothing).
func (a *Agent) offer(uid, model string, m *engine.Manifest) {
	p := a.opts.Peers
	if p == nil || p.Server == nil {
		return
	}
	if cur := p.Server.Offered(uid); cur != nil && cur.Revision == m.Revision && cur.Parts() > 0 && allHeld(cur) {
		return
	}
	plan, err := engine.OpenPublished(model)
	if err != nil {
		p.Server.Withdraw(uid)
		return
	}
	p.Server.Offer(uid, plan)
}

func allHeld(p *engine.Plan) bool {
	for i := range p.Parts() {
		if _, ok := p.Held(i); !ok {
			return false
		}
	}
	return true
}

// withdraw stops offering cache uid (removed, damaged, or a download that failed).
func (a *Agent) withdraw(uid string) {
	if p := a.opts.Peers; p != nil && p.Server != nil {
		p.Server.Withdraw(uid)
	}
}

// budget is the node's origin budget for a source type (nil: none).
func (a *Agent) budget(t inferencev1.ModelSourceType) *engine.Budget {
	return a.budgets[t]
}

func newBudgets(o *Options) map[inferencev1.ModelSourceType]*engine.Budget {
	out := map[inferencev1.ModelSourceType]*engine.Budget{}
	for t, b := range map[inferencev1.ModelSourceType]struct {
		n    int
		rate int64
	}{
		inferencev1.ModelSourceS3:          {o.Config.S3.Budget.MaxConcurrency, o.Config.S3.Budget.MaxRateBytes()},
		inferencev1.ModelSourceHuggingFace: {o.Config.HuggingFace.Budget.MaxConcurrency, o.Config.HuggingFace.Budget.MaxRateBytes()},
	} {
		if b.n > 0 || b.rate > 0 {
			out[t] = engine.NewBudget(b.n, b.rate)
		}
	}
	return out
}

// TokenFile returns a peer.SwarmOptions.Token reading a projected service account token, which
// the kubelet replaces before it expires: read again at most every 10 s.
func TokenFile(path string) func() (string, error) {
	var mu sync.Mutex
	var tok string
	var read time.Time
	return func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if tok != "" && time.Since(read) < 10*time.Second {
			return tok, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		if tok = strings.TrimSpace(string(b)); tok == "" {
			return "", errors.New(path + " is empty")
		}
		read = time.Now()
		return tok, nil
	}
}
