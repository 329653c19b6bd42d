package weightscache

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/controller"
)

// Requests writes the caches' requests into the nodes' NodeCaches, one write per node for the
// changes of every cache: a change waits in the node's next write until a worker takes the
// node, at least Window after its first change, so the caches a rollout asks of the same nodes
// share their writes, and the more so the slower the API server answers. The reconciles do not
// wait for the writes. A write that fails is retried with the node's newer changes, on the work
// queue's back-off; the caches see each write through the informer, as any NodeCache change.
//
// The controller is the only writer of NodeCache specs, and a node's writes are made one at a
// time. Each write is a JSON patch of the node's whole list that first tests the NodeCache's
// generation (which only spec writes change): a list read from an informer that has not seen the
// last write yet is never written over it; the node is taken again from a newer view.
//
// The nil Requests writes each reconcile's changes at once, with the reconcile (tests that call
// reconcilers directly).
type Requests struct {
	// Client reads the NodeCaches (from the informer) and writes them.
	Client client.Client
	// Window is how long a node's first change waits for other caches' (1 s when zero).
	Window time.Duration

	once sync.Once
	mu   sync.Mutex
	// pending are the changes not yet taken by a worker, by node.
	pending map[string]*nodeChanges
	// written is the generation each node's NodeCache had after this process's last write to it.
	written map[string]writtenAs
	queue   workqueue.TypedRateLimitingInterface[string]
}

// change is one cache's request for one node, or its withdrawal (entry nil).
type change struct {
	node    string
	nodeUID apitypes.UID // for the owner reference of a NodeCache made by the write
	uid     string
	entry   *prewarmv1alpha1.CacheRequest
}

// nodeChanges are the changes to one node's list not written yet, by cache; a nil entry
// withdraws the cache.
type nodeChanges struct {
	nodeUID apitypes.UID
	caches  map[string]*prewarmv1alpha1.CacheRequest
}

// writtenAs is a NodeCache as this process last wrote it.
type writtenAs struct {
	uid        apitypes.UID
	generation int64
}

func (q *Requests) init() {
	q.once.Do(func() {
		q.pending = map[string]*nodeChanges{}
		q.written = map[string]writtenAs{}
		q.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 2*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodecache-requests"})
		if q.Window == 0 {
			q.Window = time.Second
		}
	})
}

// Put hands the changes to the nodes' next writes. It returns the nodes whose list had no room
// for a new cache: only the nil Requests, which writes at once, knows them; the others learn it
// from the informer at their cache's next reconcile.
func (q *Requests) Put(ctx context.Context, c client.Client, changes []change) (map[string]bool, error) {
	if q == nil {
		return writeNow(ctx, c, changes)
	}
	q.init()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ch := range changes {
		if add(q.pending, ch) {
			q.queue.AddAfter(ch.node, q.Window)
		}
	}
	return nil, nil
}

// add adds ch to its node's changes in byNode, and reports whether the node had none before.
func add(byNode map[string]*nodeChanges, ch change) (first bool) {
	b, had := byNode[ch.node]
	if !had {
		b = &nodeChanges{caches: map[string]*prewarmv1alpha1.CacheRequest{}}
		byNode[ch.node] = b
	}
	if ch.nodeUID != "" {
		b.nodeUID = ch.nodeUID
	}
	b.caches[ch.uid] = ch.entry
	return !had
}

// pendingFor lists the nodes with a request for cache uid not written yet: a reconcile that no
// longer targets one withdraws it, though the informer does not show it asked.
func (q *Requests) pendingFor(uid string) []string {
	if q == nil {
		return nil
	}
	q.init()
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for node, b := range q.pending {
		if e := b.caches[uid]; e != nil {
			out = append(out, node)
		}
	}
	slices.Sort(out)
	return out
}

// Start writes the nodes' changes until ctx ends.
func (q *Requests) Start(ctx context.Context) error {
	q.init()
	var wg sync.WaitGroup
	for range controller.SharedWrites {
		wg.Go(func() {
			for q.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	q.queue.ShutDown()
	wg.Wait()
	return nil
}

// NeedLeaderElection: only the leader's reconciles hand it changes.
func (q *Requests) NeedLeaderElection() bool { return true }

// next writes the changes of the next node in the queue; false once the queue is shut down.
func (q *Requests) next(ctx context.Context) bool {
	node, shutdown := q.queue.Get()
	if shutdown {
		return false
	}
	defer q.queue.Done(node)
	q.mu.Lock()
	b, last := q.pending[node], q.written[node]
	delete(q.pending, node)
	q.mu.Unlock()
	if b == nil {
		q.queue.Forget(node)
		return true
	}
	log := ctrl.LoggerFrom(ctx).WithName("nodecache-requests").WithValues("node", node)
	base, err := readNodeCache(ctx, q.Client, node)
	if err == nil && base != nil && base.UID == last.uid && base.Generation < last.generation {
		// The informer has not seen this process's last write yet: the list it shows is older.
		q.putBack(node, b)
		q.queue.AddAfter(node, 100*time.Millisecond)
		return true
	}
	var written writtenAs
	var dropped []string
	if err == nil {
		written, dropped, err = writeNode(ctx, q.Client, node, base, b)
	}
	if err != nil {
		log.Info("writing the node's cache requests; retrying", "error", err.Error())
		q.putBack(node, b)
		q.queue.AddRateLimited(node)
		return true
	}
	q.queue.Forget(node)
	if len(dropped) > 0 {
		log.Info("the node is asked for as many caches as a NodeCache holds; caches not asked", "caches", dropped)
	}
	if written.generation != 0 {
		q.mu.Lock()
		q.written[node] = written
		q.mu.Unlock()
	}
	return true
}

// putBack returns changes taken for a write that did not happen: the node's newer changes win.
func (q *Requests) putBack(node string, b *nodeChanges) {
	q.mu.Lock()
	defer q.mu.Unlock()
	newer := q.pending[node]
	if newer == nil {
		q.pending[node] = b
		return
	}
	for uid, e := range b.caches {
		if _, ok := newer.caches[uid]; !ok {
			newer.caches[uid] = e
		}
	}
	if newer.nodeUID == "" {
		newer.nodeUID = b.nodeUID
	}
}

// writeNow writes the changes at once, one write per node, nodes in parallel, reading each
// NodeCache from c.
func writeNow(ctx context.Context, c client.Client, changes []change) (map[string]bool, error) {
	byNode := map[string]*nodeChanges{}
	for _, ch := range changes {
		add(byNode, ch)
	}
	var mu sync.Mutex
	full := map[string]bool{}
	err := controller.ForEach(ctx, slices.Sorted(maps.Keys(byNode)), func(ctx context.Context, node string) error {
		var err error
		for range 5 {
			var base *prewarmv1alpha1.NodeCache
			var dropped []string
			if base, err = readNodeCache(ctx, c, node); err != nil {
				break
			}
			if _, dropped, err = writeNode(ctx, c, node, base, byNode[node]); err == nil {
				if len(dropped) > 0 {
					mu.Lock()
					full[node] = true
					mu.Unlock()
				}
				return nil
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
				break // not a race with another writer: reading again would not help
			}
		}
		return fmt.Errorf("writing the cache requests of node %s: %w", node, err)
	})
	return full, err
}

// readNodeCache reads node's NodeCache; nil if it has none.
func readNodeCache(ctx context.Context, c client.Reader, node string) (*prewarmv1alpha1.NodeCache, error) {
	nc := &prewarmv1alpha1.NodeCache{}
	if err := c.Get(ctx, apitypes.NamespacedName{Name: node}, nc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return nc, nil
}

// writeNode writes base's list with the changes b (making the NodeCache if base is nil), unless
// that is the list base has. A new cache that would take the list past MaxCachesPerNode is not
// written; dropped names those.
func writeNode(ctx context.Context, c client.Client, node string, base *prewarmv1alpha1.NodeCache, b *nodeChanges) (writtenAs, []string, error) {
	var was []prewarmv1alpha1.CacheRequest
	if base != nil {
		was = base.Spec.Caches
	}
	list, dropped := b.applyTo(was)
	if equality.Semantic.DeepEqual(list, was) || base == nil && len(list) == 0 {
		return writtenAs{}, dropped, nil
	}
	nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if base == nil {
		if b.nodeUID == "" {
			return writtenAs{}, dropped, nil // only withdrawals, and nothing to withdraw from
		}
		nc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: b.nodeUID}}
		nc.Spec.Caches = list
		if err := c.Create(ctx, nc, client.FieldOwner(requestsManager)); err != nil {
			return writtenAs{}, dropped, err
		}
		return writtenAs{uid: nc.UID, generation: nc.Generation}, dropped, nil
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/generation", "value": base.Generation},
		{"op": "add", "path": "/spec", "value": prewarmv1alpha1.NodeCacheSpec{Caches: list}},
	})
	if err != nil {
		return writtenAs{}, dropped, err
	}
	if err := c.Patch(ctx, nc, client.RawPatch(apitypes.JSONPatchType, patch), client.FieldOwner(requestsManager)); err != nil {
		return writtenAs{}, dropped, err
	}
	return writtenAs{uid: nc.UID, generation: nc.Generation}, dropped, nil
}

// requestsManager is the field manager of the requests' writes.
const requestsManager = "prewarm-controller"

// applyTo returns the list with the changes: an asked cache's entry replaced where it is or
// added at the end (in UID order among the added), a withdrawn one removed. New caches past
// MaxCachesPerNode are left out (dropped).
func (b *nodeChanges) applyTo(was []prewarmv1alpha1.CacheRequest) (list []prewarmv1alpha1.CacheRequest, dropped []string) {
	list = make([]prewarmv1alpha1.CacheRequest, 0, len(was)+len(b.caches))
	for _, e := range was {
		want, changed := b.caches[e.UID]
		switch {
		case !changed:
			list = append(list, e)
		case want != nil:
			list = append(list, *want)
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(b.caches)) {
		want := b.caches[uid]
		if want == nil || slices.ContainsFunc(was, func(e prewarmv1alpha1.CacheRequest) bool { return e.UID == uid }) {
			continue
		}
		if len(list) >= prewarmv1alpha1.MaxCachesPerNode {
			dropped = append(dropped, uid)
			continue
		}
		list = append(list, *want)
	}
	return list, dropped
}
