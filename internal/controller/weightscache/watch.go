package weightscache

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// progressDelay is how long a cache's reconcile waits after a node reports progress only: the
// progress of every node in that time is gathered by one reconcile (the work queue keeps one
// entry per cache), so the cost of reporting progress does not grow with the fleet.
const progressDelay = 2 * time.Second

// nodeCacheEvents maps NodeCache events to the caches whose request, report or demand changed:
// at once for a change of state, after progressDelay for progress alone, and not at all for
// an agent's heartbeat.
type nodeCacheEvents struct{ r *Reconciler }

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func (h nodeCacheEvents) Create(ctx context.Context, e event.TypedCreateEvent[client.Object], q queue) {
	if nc, ok := e.Object.(*prewarmv1alpha1.NodeCache); ok {
		h.enqueue(ctx, q, cachesIn(nc), 0)
	}
}

func (h nodeCacheEvents) Delete(ctx context.Context, e event.TypedDeleteEvent[client.Object], q queue) {
	if nc, ok := e.Object.(*prewarmv1alpha1.NodeCache); ok {
		h.enqueue(ctx, q, cachesIn(nc), 0)
	}
}

func (h nodeCacheEvents) Generic(ctx context.Context, e event.TypedGenericEvent[client.Object], q queue) {
	if nc, ok := e.Object.(*prewarmv1alpha1.NodeCache); ok {
		h.enqueue(ctx, q, cachesIn(nc), 0)
	}
}

func (h nodeCacheEvents) Update(ctx context.Context, e event.TypedUpdateEvent[client.Object], q queue) {
	before, ok1 := e.ObjectOld.(*prewarmv1alpha1.NodeCache)
	after, ok2 := e.ObjectNew.(*prewarmv1alpha1.NodeCache)
	if !ok1 || !ok2 {
		return
	}
	now, later := changedCaches(before, after)
	h.enqueue(ctx, q, now, 0)
	h.enqueue(ctx, q, later, progressDelay)
}

// changedCaches compares two versions of a NodeCache: the caches whose request, state or demand
// changed (now), and those whose report changed in progress only (later).
func changedCaches(before, after *prewarmv1alpha1.NodeCache) (now, later []string) {
	keyChanged := before.Status.CredentialsKey != after.Status.CredentialsKey || before.Status.PeerAddress != after.Status.PeerAddress ||
		(before.Status.HeartbeatTime == nil) != (after.Status.HeartbeatTime == nil)
	was := cachesIn(before)
	for _, uid := range cachesIn(after) {
		if !slices.Contains(was, uid) {
			now = append(now, uid)
		}
	}
	for _, uid := range was {
		b, a := reportFor(before, uid), reportFor(after, uid)
		switch {
		case keyChanged,
			!equality.Semantic.DeepEqual(requestFor(before, uid), requestFor(after, uid)),
			!slices.Equal(demandOf(before, uid), demandOf(after, uid)),
			(a == nil) != (b == nil),
			a != nil && !sameState(*a, *b):
			now = append(now, uid)
		case a != nil && !equality.Semantic.DeepEqual(a, b):
			later = append(later, uid)
		}
	}
	return now, later
}

// sameState reports whether two reports of one cache differ in progress at most.
func sameState(a, b prewarmv1alpha1.CacheStatus) bool {
	return a.State == b.State && a.Reason == b.Reason && a.Revision == b.Revision
}

// demandOf is the namespaces whose pods on nc's node demand cache uid.
func demandOf(nc *prewarmv1alpha1.NodeCache, uid string) []string {
	var out []string
	for _, d := range nc.Status.Demands {
		if d.UID == uid {
			out = append(out, d.Namespace)
		}
	}
	return out
}

func (h nodeCacheEvents) enqueue(ctx context.Context, q queue, uids []string, after time.Duration) {
	for _, uid := range uids {
		list := &inferencev1.ModelDataCacheConfigList{}
		if err := h.r.Client.List(ctx, list, client.MatchingFields{uidIndex: uid}, client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing ModelDataCacheConfigs")
			continue
		}
		for i := range list.Items {
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
			if after > 0 {
				q.AddAfter(req, after)
			} else {
				q.Add(req)
			}
		}
	}
}

// livenessScan finds the nodes whose agent's Lease expired, or was renewed again, since its last
// look: nothing is written when a Lease is not renewed, so no event says so. It sends each such
// node's NodeCache to flips, which reconciles the caches it names. A node whose agent has never
// said anything (no Lease, no status) is not watched: its first status write wakes its caches.
type livenessScan struct {
	r     *Reconciler
	flips chan<- event.GenericEvent
	every time.Duration
}

func (l *livenessScan) Start(ctx context.Context) error {
	tick := time.NewTicker(l.every)
	defer tick.Stop()
	alive := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		changed, err := l.scan(ctx, alive)
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "reading the agents' Leases")
			continue
		}
		for _, nc := range changed {
			select {
			case l.flips <- event.GenericEvent{Object: nc}:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// scan updates alive (node -> its agent was alive at the last scan) and returns the NodeCaches
// of the nodes whose agent's liveness changed.
func (l *livenessScan) scan(ctx context.Context, alive map[string]bool) ([]*prewarmv1alpha1.NodeCache, error) {
	list := &prewarmv1alpha1.NodeCacheList{}
	if err := l.r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var changed []*prewarmv1alpha1.NodeCache
	seen := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		nc := &list.Items[i]
		agent, err := l.r.liveness().Of(ctx, nc.Name, nc)
		if err != nil {
			return nil, err
		}
		if !agent.Alive && agent.Renewed.IsZero() && nc.Status.HeartbeatTime == nil {
			continue // never heard of
		}
		seen[nc.Name] = true
		was, known := alive[nc.Name]
		alive[nc.Name] = agent.Alive
		if known && was != agent.Alive {
			ctrl.LoggerFrom(ctx).Info("a node's agent changed liveness", "node", nc.Name, "alive", agent.Alive, "why", agent.Why)
			changed = append(changed, nc.DeepCopy())
		}
	}
	for name := range alive {
		if !seen[name] {
			delete(alive, name)
		}
	}
	return changed, nil
}
