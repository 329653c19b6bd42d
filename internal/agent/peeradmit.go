package agent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// TargetCheck admits a peer's request for a cache only when the peer is the agent of a node
// the controller asks for that cache: the node's NodeCache spec, which only the controller
// writes, requests it. A node's agent token thus reaches the bytes of the caches its own node
// holds or fetches, not of every cache its peers hold. A token bound to no node is refused.
//
// What a peer may cost the API server is bounded, whatever keys it asks for (the Server
// answers a key this node does not offer before asking): one read of a node's NodeCache
// answers every key for that node for askedTTL; a key its set lacks is looked up again only
// once the set is recheckAfter old; one read per node runs at a time, shared by every asker;
// at most maxAskingNodes nodes' sets are kept; and reads are made at most readsPerSecond
// (burst readBurst). Past that, or when the read fails, the peer is answered 429 (retry in a
// second) without asking.
type TargetCheck struct {
	// Reader reads NodeCaches from the API server.
	Reader client.Reader
	// Clock tells the time (the wall clock when nil).
	Clock clock.PassiveClock

	once     sync.Once
	sets     *cache.LRUExpireCache // node name -> *askedSet
	inflight singleflight.Group
	reads    *rate.Limiter
}

// askedSet is what one read of a node's NodeCache says: the caches it is asked for.
type askedSet struct {
	uids sets.Set[string]
	read time.Time
}

const (
	// askedTTL is how long a node's set is kept: a node withdrawn from a cache keeps its
	// access at most this long.
	askedTTL = time.Minute
	// recheckAfter is how old a kept set must be before a key it lacks is looked up again: a
	// node just asked for a cache is admitted at most this long after, and a node asking for
	// keys it is not asked for costs at most one read per recheckAfter.
	recheckAfter = 10 * time.Second
	// maxAskingNodes is how many nodes' sets are kept; the least recently used go first. A
	// node is asked for parts by at most about 3 × peers.groupSize nodes per cache.
	maxAskingNodes = 1024
	// readsPerSecond (burst readBurst) caps this agent's reads of NodeCaches for admission:
	// the burst covers every node of two caches' swarms asking at once, the rate 300 nodes
	// asking within each askedTTL.
	readsPerSecond, readBurst = 5, 100
	// readTimeout bounds one read.
	readTimeout = 10 * time.Second
)

// Admit is a peer.ServerOptions.Admit.
func (c *TargetCheck) Admit(r *http.Request, who, uid string) error {
	if who == "" || strings.ContainsAny(who, ":/") {
		return fmt.Errorf("%s: a peer token must be bound to an agent's pod on a node", who)
	}
	c.once.Do(func() {
		if c.Clock == nil {
			c.Clock = clock.RealClock{}
		}
		c.sets = cache.NewLRUExpireCacheWithClock(maxAskingNodes, c.Clock)
		c.reads = rate.NewLimiter(readsPerSecond, readBurst)
	})
	kept, _ := c.sets.Get(who)
	s, _ := kept.(*askedSet)
	if s == nil || !s.uids.Has(uid) && c.Clock.Since(s.read) >= recheckAfter {
		var err error
		if s, err = c.readSet(r.Context(), who, s); err != nil {
			return fmt.Errorf("checking that node %s is asked for cache %s: %w", who, uid, err)
		}
	}
	if !s.uids.Has(uid) {
		return fmt.Errorf("node %s is not asked for cache %s", who, uid)
	}
	return nil
}

// readSet reads node's set, replacing stale (nil: none kept). Concurrent callers share one
// read, and a caller that finds a set newer than stale uses it.
func (c *TargetCheck) readSet(ctx context.Context, node string, stale *askedSet) (*askedSet, error) {
	v, err, _ := c.inflight.Do(node, func() (any, error) {
		if kept, ok := c.sets.Get(node); ok && kept.(*askedSet) != stale {
			return kept, nil
		}
		if !c.reads.AllowN(c.Clock.Now(), 1) {
			return nil, fmt.Errorf("%w: reading more than %d NodeCaches a second", peer.ErrTooManyRequests, readsPerSecond)
		}
		// Shared by every caller waiting on it: the first one leaving does not end it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
		defer cancel()
		nc := &prewarmv1alpha1.NodeCache{}
		switch err := c.Reader.Get(ctx, types.NamespacedName{Name: node}, nc); {
		case apierrors.IsNotFound(err): // asked for nothing
		case err != nil:
			// Not a refusal: the peer is answered 429 and asks again.
			return nil, fmt.Errorf("%w: %w", peer.ErrTooManyRequests, err)
		}
		s := &askedSet{uids: sets.New[string](), read: c.Clock.Now()}
		for _, req := range nc.Spec.Caches {
			s.uids.Insert(req.UID)
		}
		c.sets.Add(node, s, askedTTL)
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*askedSet), nil
}
