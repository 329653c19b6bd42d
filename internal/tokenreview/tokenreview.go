// Package tokenreview authenticates prewarm's agents to each other (the peer port) and to the
// controller (its witness): by the service account token they present, as the API server
// reviews it.
package tokenreview

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// Reviewer authorizes an agent's request: the bearer token must be a service account token of
// prewarm's agents, for the Audience, as the API server says (TokenReview). The agent is named by
// the node its token's pod is bound to.
//
// Anyone who reaches the port can send tokens, so what a stranger costs is bounded:
// answers, refusals included, are remembered for reviewTTL (at most maxRemembered tokens; a
// swarm's many requests cost one review per peer and minute); one review runs per token at a
// time; and tokens not known yet are reviewed at most reviewsPerSecond, and from one remote
// address at most reviewsPerAddress a second. Beyond that a request is answered 429 without
// asking the API server.
type Reviewer struct {
	Client client.Client
	// Audience the token must be for.
	Audience string
	// ServiceAccount is the agents' own, system:serviceaccount:<namespace>:<name>.
	ServiceAccount string

	known  remembered[review] // by sha256 of the token
	once   sync.Once
	all    *rate.Limiter
	byAddr *cache.LRUExpireCache // remote IP -> *rate.Limiter
	addrMu sync.Mutex
}

type review struct {
	peer string
	err  error
}

const (
	// reviewTTL is how long an answer is kept.
	reviewTTL = time.Minute
	// reviewsPerSecond (with a burst of reviewBurst) caps the reviews of tokens not yet known,
	// all remote addresses together; reviewsPerAddress (burst addressBurst) caps one address.
	// An honest agent presents one token an hour, so these bind only a flood.
	reviewsPerSecond, reviewBurst   = 20, 50
	reviewsPerAddress, addressBurst = 2, 20
	// maxAddresses is how many remote addresses' limits are kept.
	maxAddresses = 4096
	// maxTokenBytes is the longest token sent for review: service account tokens are about a
	// kilobyte.
	maxTokenBytes = 16 << 10
)

// Authorize is a peer.ServerOptions.Authorize.
func (t *Reviewer) Authorize(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || strings.TrimSpace(tok) == "":
		return "", peer.ErrUnauthenticated
	case len(tok) > maxTokenBytes:
		return "", fmt.Errorf("%w: a token of %d bytes", peer.ErrUnauthenticated, len(tok))
	}
	key := sha256.Sum256([]byte(tok))
	rv, err := t.known.get(string(key[:]), func() (review, time.Duration, error) {
		if !t.admit(r.RemoteAddr) {
			return review{}, 0, peer.ErrTooManyRequests
		}
		rv, err := t.review(r.Context(), tok) // an error is not kept: the API server may be back soon
		return rv, reviewTTL, err
	})
	if err != nil {
		return "", err
	}
	return rv.peer, rv.err
}

// admit takes a review from the budget of all addresses and of addr's.
func (t *Reviewer) admit(addr string) bool {
	t.once.Do(func() {
		t.byAddr = cache.NewLRUExpireCache(maxAddresses)
		t.all = rate.NewLimiter(reviewsPerSecond, reviewBurst)
	})
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	t.addrMu.Lock()
	l, ok := t.byAddr.Get(host)
	if !ok {
		l = rate.NewLimiter(reviewsPerAddress, addressBurst)
	}
	// Kept while the address could still be over its budget.
	t.byAddr.Add(host, l, addressBurst*time.Second/reviewsPerAddress)
	t.addrMu.Unlock()
	return l.(*rate.Limiter).Allow() && t.all.Allow()
}

func (t *Reviewer) review(ctx context.Context, tok string) (review, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{t.Audience}}}
	if err := t.Client.Create(ctx, tr); err != nil {
		return review{}, fmt.Errorf("reviewing the peer's token: %w", err)
	}
	var rv review
	switch st := tr.Status; {
	case !st.Authenticated:
		rv.err = fmt.Errorf("%w: %s", peer.ErrUnauthenticated, st.Error)
	case !slices.Contains(st.Audiences, t.Audience):
		rv.err = fmt.Errorf("%w: the token is not for %s", peer.ErrUnauthenticated, t.Audience)
	case st.User.Username != t.ServiceAccount:
		rv.err = fmt.Errorf("%s is not a prewarm agent", st.User.Username)
	default:
		rv.peer = st.User.Username
		if node := st.User.Extra["authentication.kubernetes.io/node-name"]; len(node) == 1 {
			rv.peer = node[0] // bound to a pod: the peer's node
		} else if pod := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(pod) == 1 {
			rv.peer = "pod/" + pod[0] // bound to a pod on no node
		}
	}
	return rv, nil
}
