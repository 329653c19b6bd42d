package agent

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// TargetCheck admits a peer's request for a cache only when the peer is the agent of a node
// the controller asks for that cache: the node's NodeCache spec, which only the controller
// writes, requests it. A node's agent token thus reaches the bytes of the caches its own node
// holds or fetches, not of every cache its peers hold. A token bound to no node is refused.
//
// Answers are remembered for admitTTL (refusals for refuseTTL), for at most maxRemembered
// (node, cache) pairs, and one read of a node's NodeCache runs at a time, so a swarm's
// requests cost one read per peer and cache and minute.
type TargetCheck struct {
	// Reader reads NodeCaches from the API server.
	Reader client.Reader

	answers remembered[admission]
}

// admission is TargetCheck's answer: nil, or why the node is refused.
type admission struct{ refusal error }

const (
	// admitTTL is how long an admission is kept (a node withdrawn from a cache keeps its
	// access at most this long); refuseTTL a refusal (a node just asked is admitted soon).
	admitTTL, refuseTTL = time.Minute, 10 * time.Second
)

// Admit is a peer.ServerOptions.Admit.
func (c *TargetCheck) Admit(r *http.Request, who, uid string) error {
	if who == "" || strings.ContainsAny(who, ":/") {
		return fmt.Errorf("%s: a peer token must be bound to an agent's pod on a node", who)
	}
	a, err := c.answers.get(who+"/"+uid, func() (admission, time.Duration, error) {
		switch ok, err := c.asked(r.Context(), who, uid); {
		case err != nil:
			return admission{}, 0, err
		case ok:
			return admission{}, admitTTL, nil
		}
		return admission{fmt.Errorf("node %s is not asked for cache %s", who, uid)}, refuseTTL, nil
	})
	if err != nil {
		return fmt.Errorf("checking that node %s is asked for cache %s: %w", who, uid, err)
	}
	return a.refusal
}

// asked reports whether node's NodeCache requests cache uid.
func (c *TargetCheck) asked(ctx context.Context, node, uid string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nc := &prewarmv1alpha1.NodeCache{}
	switch err := c.Reader.Get(ctx, types.NamespacedName{Name: node}, nc); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == uid }), nil
}
