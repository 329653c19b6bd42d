package weightscache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/text"
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
	// Slots is the share of a node's request list that a namespace's caches may take (nil: the
	// whole list).
	Slots Slots
	// LeftOut, when set, is told of each cache a write left out of a node's list, so that the
	// cache is reconciled and says why on that node.
	LeftOut chan<- event.GenericEvent

	once sync.Once
	mu   sync.Mutex
	// pending are the changes not yet taken by a worker, by node.
	pending map[string]*nodeChanges
	// written is the generation each node's NodeCache had after this process's last write to it.
	written map[string]writtenAs
	// writing are the changes a worker is writing now, by node (a copy: the worker changes its
	// own); sent, by node, the requests of the last writes (nil: withdrawn), which the informer
	// may not show yet.
	writing map[string]map[string]*prewarmv1alpha1.CacheRequest
	sent    map[string]sentAs
	pruned  time.Time // when sent was last swept of entries the informer must show by now
	// left are the requests the writes left out of their nodes' lists, by cache and node: the
	// cache's reconciles report them, and do not ask again for that request, for leftOutFor.
	left  map[string]map[string]leftOut
	queue workqueue.TypedRateLimitingInterface[string]
}

// leftOut is a request a write left out of its node's list, and why.
type leftOut struct {
	entry prewarmv1alpha1.CacheRequest
	why   refusal
	at    time.Time
}

// leftOutFor is how long a request left out of a node's list is not asked again (unless it
// changes): the cache's reconciles look again after that, in case the node has room by then.
const leftOutFor = time.Minute

// Slots says how many of a node's MaxCachesPerNode requests the caches of namespace ns may take
// together, and the setting that says so.
type Slots func(ns string) (n int, setting string)

// room says whether a node whose list holds held caches of namespace ns (and all caches in
// all) has room for one more, and why not.
func (sl Slots) room(ns string, held, all int) (refusal, bool) {
	if all >= prewarmv1alpha1.MaxCachesPerNode {
		return refusal{inferencev1.CacheFailed, prewarmv1alpha1.ReasonNodeCacheFull, fmt.Sprintf(
			"the node is already asked for %d other caches, the most one node holds; delete caches it need not hold, or narrow this cache's placement", prewarmv1alpha1.MaxCachesPerNode)}, false
	}
	if sl == nil {
		return refusal{}, true
	}
	if n, setting := sl(ns); held >= n {
		return refusal{inferencev1.CacheFailed, prewarmv1alpha1.ReasonNodeCacheFull, fmt.Sprintf(
			"the node is already asked for %d caches of namespace %s, its share of the node's %d cache slots (%s); delete caches of the namespace it need not hold, or narrow this cache's placement",
			held, ns, prewarmv1alpha1.MaxCachesPerNode, setting)}, false
	}
	return refusal{}, true
}

// MaxRequestBytes is the most a node's request list takes (JSON): the NodeCache, its status and
// its managed fields must stay well within etcd's 1.5 MiB per object. Caches past it are left
// out of the list (NodeCacheFull).
const MaxRequestBytes = 512 << 10

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

// sentAs is what this process last wrote to a node, by cache, and when.
type sentAs struct {
	at     time.Time
	caches map[string]*prewarmv1alpha1.CacheRequest
}

// sentFor is how long a write is remembered for a node whose informer view is not asked about
// (Requests.latest): an informer shows a write within seconds.
const sentFor = time.Minute

// writtenAs is a NodeCache as this process last wrote it.
type writtenAs struct {
	uid        apitypes.UID
	generation int64
}

func (q *Requests) init() {
	q.once.Do(func() {
		q.pending = map[string]*nodeChanges{}
		q.written = map[string]writtenAs{}
		q.writing = map[string]map[string]*prewarmv1alpha1.CacheRequest{}
		q.sent = map[string]sentAs{}
		q.left = map[string]map[string]leftOut{}
		q.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 2*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodecache-requests"})
		if q.Window == 0 {
			q.Window = time.Second
		}
	})
}

// Put hands the changes to the nodes' next writes. It returns the nodes whose list left a
// request out, and why: only the nil Requests, which writes at once, knows them; the others are
// told through LeftOut and remember them (leftOutOf).
func (q *Requests) Put(ctx context.Context, c client.Client, changes []change) (map[string]refusal, error) {
	if q == nil {
		return writeNow(ctx, c, changes)
	}
	q.init()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ch := range changes {
		delete(q.left[ch.uid], ch.node)
		if add(q.pending, ch) {
			q.queue.AddAfter(ch.node, q.Window)
		}
	}
	return nil, nil
}

// leftOutOf says why the request want for node was left out of the node's list, when it was,
// less than leftOutFor ago.
func (q *Requests) leftOutOf(node string, want prewarmv1alpha1.CacheRequest, now time.Time) (refusal, bool) {
	if q == nil {
		return refusal{}, false
	}
	q.init()
	q.mu.Lock()
	defer q.mu.Unlock()
	l, ok := q.left[want.UID][node]
	if !ok || now.Sub(l.at) >= leftOutFor || !equality.Semantic.DeepEqual(l.entry, want) {
		return refusal{}, false
	}
	return l.why, true
}

// forget drops what is remembered of a deleted cache.
func (q *Requests) forget(uid string) {
	if q == nil {
		return
	}
	q.init()
	q.mu.Lock()
	delete(q.left, uid)
	q.mu.Unlock()
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
	if b != nil {
		q.writing[node] = maps.Clone(b.caches)
	}
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		delete(q.writing, node)
		q.mu.Unlock()
	}()
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
	var left map[string]refusal
	if err == nil {
		written, left, err = write(ctx, q.Client, node, base, b, q.Slots)
	}
	q.tell(ctx, node, b, left)
	if err != nil {
		log.Info("writing the node's cache requests; retrying", "error", err.Error())
		for uid := range left {
			delete(b.caches, uid) // told: not written again
		}
		q.putBack(node, b)
		q.queue.AddRateLimited(node)
		return true
	}
	q.queue.Forget(node)
	if written.generation != 0 {
		q.mu.Lock()
		q.written[node] = written
		now := time.Now()
		s := q.sent[node]
		if s.caches == nil || now.Sub(s.at) >= sentFor {
			s.caches = map[string]*prewarmv1alpha1.CacheRequest{}
		}
		s.at = now
		for uid, e := range b.caches {
			if _, out := left[uid]; !out {
				s.caches[uid] = e
			}
		}
		q.sent[node] = s
		if now.Sub(q.pruned) >= sentFor {
			q.pruned = now
			maps.DeleteFunc(q.sent, func(_ string, s sentAs) bool { return now.Sub(s.at) >= sentFor })
		}
		q.mu.Unlock()
	}
	return true
}

// latest is node's request for cache uid as this process will have it, or has just written it,
// when the informer, showing node's NodeCache at generation gen, does not show it yet (known):
// a change not written yet, being written, or written after gen. Two reconciles in a row then
// see one assignment of peers, not the first one's writes half. An informer that shows another
// NodeCache than the one written (ncUID: deleted and made again) has caught up with it.
func (q *Requests) latest(node, uid string, gen int64, ncUID apitypes.UID) (_ *prewarmv1alpha1.CacheRequest, known bool) {
	if q == nil {
		return nil, false
	}
	q.init()
	q.mu.Lock()
	defer q.mu.Unlock()
	if b := q.pending[node]; b != nil {
		if e, ok := b.caches[uid]; ok {
			return e, true
		}
	}
	if e, ok := q.writing[node][uid]; ok {
		return e, true
	}
	if w := q.written[node]; gen >= w.generation || ncUID != "" && ncUID != w.uid {
		delete(q.sent, node) // the informer has caught up
		return nil, false
	}
	e, ok := q.sent[node].caches[uid]
	return e, ok
}

// tell remembers the requests a write left out of node's list and has their caches reconciled,
// so that each says why on that node: one cache's request never holds up the others'.
func (q *Requests) tell(ctx context.Context, node string, b *nodeChanges, left map[string]refusal) {
	if len(left) == 0 {
		return
	}
	ctrl.LoggerFrom(ctx).WithName("nodecache-requests").Info("requests left out of the node's list", "node", node, "caches", slices.Sorted(maps.Keys(left)))
	now := time.Now()
	var tell []*prewarmv1alpha1.CacheRequest
	q.mu.Lock()
	for uid, why := range left {
		e := b.caches[uid]
		if e == nil {
			continue
		}
		if q.left[uid] == nil {
			q.left[uid] = map[string]leftOut{}
		}
		q.left[uid][node] = leftOut{entry: *e, why: why, at: now}
		tell = append(tell, e)
	}
	q.mu.Unlock()
	if q.LeftOut == nil {
		return
	}
	for _, e := range tell {
		m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name}}
		select {
		case q.LeftOut <- event.GenericEvent{Object: m}:
		case <-ctx.Done():
			return
		}
	}
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
func writeNow(ctx context.Context, c client.Client, changes []change) (map[string]refusal, error) {
	byNode := map[string]*nodeChanges{}
	for _, ch := range changes {
		add(byNode, ch)
	}
	var mu sync.Mutex
	leftOut := map[string]refusal{}
	err := controller.ForEach(ctx, slices.Sorted(maps.Keys(byNode)), func(ctx context.Context, node string) error {
		var err error
		for range 5 {
			var base *prewarmv1alpha1.NodeCache
			var left map[string]refusal
			if base, err = readNodeCache(ctx, c, node); err != nil {
				break
			}
			_, left, err = write(ctx, c, node, base, byNode[node], nil)
			for _, why := range left {
				mu.Lock()
				leftOut[node] = why // the changes of one node are one cache's
				mu.Unlock()
			}
			if err == nil {
				return nil
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
				break // not a race with another writer: reading again would not help
			}
		}
		return fmt.Errorf("writing the cache requests of node %s: %w", node, err)
	})
	return leftOut, err
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

// write writes b's changes into node's NodeCache (base: as read; nil: it has none), leaving out
// of the list, in left, the requests it has no room for (Slots, MaxCachesPerNode,
// MaxRequestBytes) and those the NodeCache schema refuses. Where the API server still refuses a
// write for its content (a limit or policy the writer does not know), the refused requests are
// found and left out too: one the refusal names, else by splitting the changes in halves. One
// cache's request thus never keeps the node's other caches from being asked or withdrawn.
func write(ctx context.Context, c client.Client, node string, base *prewarmv1alpha1.NodeCache, b *nodeChanges, slots Slots) (writtenAs, map[string]refusal, error) {
	left := map[string]refusal{}
	nc, err := writeSplit(ctx, c, node, base, b, slots, left)
	if err != nil || nc == nil || nc == base {
		return writtenAs{}, left, err
	}
	return writtenAs{uid: nc.UID, generation: nc.Generation}, left, nil
}

// writeSplit writes b's changes onto base and returns the NodeCache as written (base when
// nothing was written).
func writeSplit(ctx context.Context, c client.Client, node string, base *prewarmv1alpha1.NodeCache, b *nodeChanges, slots Slots, left map[string]refusal) (*prewarmv1alpha1.NodeCache, error) {
	for {
		nc, err := writeNode(ctx, c, node, base, b, slots, left)
		if err == nil || !refusedForContent(err) {
			return nc, err
		}
		asking := b.asking()
		if uid := refusedEntry(err, nc); uid != "" && slices.Contains(asking, uid) {
			left[uid] = refusedByServer(err)
			b = b.without(uid)
			continue
		}
		switch len(asking) {
		case 0:
			return base, err // withdrawals only: not a request's doing
		case 1:
			left[asking[0]] = refusedByServer(err)
			b = b.without(asking[0])
			continue
		}
		first, second := b.split(asking[:len(asking)/2])
		if base, err = writeSplit(ctx, c, node, base, first, slots, left); err != nil {
			return base, err
		}
		return writeSplit(ctx, c, node, base, second, slots, left)
	}
}

// refusedForContent reports whether the API server refused a write for what it holds (a
// schema limit, an admission policy, its size), which writing it again would not change. A
// failed generation test (a newer list) is not one: the server reports a JSON patch that does
// not apply as Invalid too, but names no object and gives no causes, where a schema's or a
// policy's refusal does.
func refusedForContent(err error) bool {
	switch {
	case apierrors.IsRequestEntityTooLargeError(err), apierrors.IsBadRequest(err), apierrors.IsForbidden(err):
		return true
	case apierrors.IsInvalid(err):
		var st apierrors.APIStatus
		if !errors.As(err, &st) {
			return false
		}
		d := st.Status().Details
		return d != nil && (d.Name != "" || len(d.Causes) > 0)
	case apierrors.IsInternalError(err):
		return strings.Contains(err.Error(), "too large") // etcd's limit on a request's size
	}
	return false
}

// entryField finds the index of the list's entry a refusal names (spec.caches[3].source.repoID).
var entryField = regexp.MustCompile(`^spec\.caches\[(\d+)\]`)

// refusedEntry is the cache whose request a refusal names in the list written, or "".
func refusedEntry(err error, written *prewarmv1alpha1.NodeCache) string {
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Details == nil || written == nil {
		return ""
	}
	for _, c := range st.Status().Details.Causes {
		if m := entryField.FindStringSubmatch(c.Field); m != nil {
			if i, err := strconv.Atoi(m[1]); err == nil && i < len(written.Spec.Caches) {
				return written.Spec.Caches[i].UID
			}
		}
	}
	return ""
}

// refusedByServer is what a cache whose request the API server refused says on the node.
func refusedByServer(err error) refusal {
	return refusal{inferencev1.CacheFailed, prewarmv1alpha1.ReasonRequestInvalid,
		text.Clip("the API server refused the node's request for the cache: "+err.Error(), text.MaxMessage)}
}

// writeNode writes base's list with the changes b (making the NodeCache if base is nil), unless
// that is the list base has, and returns the NodeCache as written or as it would have been
// (base when nothing was written). The requests the list has no room for or the schema
// refuses are left out (left).
func writeNode(ctx context.Context, c client.Client, node string, base *prewarmv1alpha1.NodeCache, b *nodeChanges, slots Slots, left map[string]refusal) (*prewarmv1alpha1.NodeCache, error) {
	var was []prewarmv1alpha1.CacheRequest
	if base != nil {
		was = base.Spec.Caches
	}
	list := b.applyTo(was, slots, left)
	if equality.Semantic.DeepEqual(list, was) || base == nil && len(list) == 0 {
		return base, nil
	}
	nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if base == nil {
		if b.nodeUID == "" {
			return base, nil // only withdrawals, and nothing to withdraw from
		}
		nc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: b.nodeUID}}
		nc.Spec.Caches = list
		if err := c.Create(ctx, nc, client.FieldOwner(requestsManager)); err != nil {
			nc.Spec.Caches = list // what the refusal's indexes refer to
			return nc, err
		}
		return nc, nil
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/generation", "value": base.Generation},
		{"op": "add", "path": "/spec", "value": prewarmv1alpha1.NodeCacheSpec{Caches: list}},
	})
	if err != nil {
		return base, err
	}
	if err := c.Patch(ctx, nc, client.RawPatch(apitypes.JSONPatchType, patch), client.FieldOwner(requestsManager)); err != nil {
		nc.Spec.Caches = list
		return nc, err
	}
	return nc, nil
}

// requestsManager is the field manager of the requests' writes.
const requestsManager = "prewarm-controller"

// applyTo returns the list with the changes: an asked cache's entry replaced where it is or
// added at the end (in UID order among the added), a withdrawn one removed. A new request the
// list has no room for (MaxCachesPerNode, the namespace's Slots, MaxRequestBytes), and a new or
// changed one the schema refuses, is left out (left); a changed one left out keeps the entry
// the list had.
func (b *nodeChanges) applyTo(was []prewarmv1alpha1.CacheRequest, slots Slots, left map[string]refusal) []prewarmv1alpha1.CacheRequest {
	list := make([]prewarmv1alpha1.CacheRequest, 0, len(was)+len(b.caches))
	held := map[string]int{}
	var changed []int // indexes in list of the entries this write changes
	for _, e := range was {
		want, change := b.caches[e.UID]
		switch {
		case !change:
		case want == nil:
			continue // withdrawn
		case invalid(*want, left):
		default:
			e = *want
			changed = append(changed, len(list))
		}
		list = append(list, e)
		held[e.Namespace]++
	}
	for _, uid := range slices.Sorted(maps.Keys(b.caches)) {
		want := b.caches[uid]
		if want == nil || slices.ContainsFunc(was, func(e prewarmv1alpha1.CacheRequest) bool { return e.UID == uid }) || invalid(*want, left) {
			continue
		}
		if why, ok := slots.room(want.Namespace, held[want.Namespace], len(list)); !ok {
			left[uid] = why
			continue
		}
		changed = append(changed, len(list))
		list = append(list, *want)
		held[want.Namespace]++
	}
	return b.withinBytes(was, list, changed, left)
}

// invalid reports whether the schema refuses request e, and says why in left.
func invalid(e prewarmv1alpha1.CacheRequest, left map[string]refusal) bool {
	errs := e.Validate(field.NewPath("spec", "caches").Key(e.UID))
	if len(errs) == 0 {
		return false
	}
	left[e.UID] = refusal{inferencev1.CacheFailed, prewarmv1alpha1.ReasonRequestInvalid,
		text.Clip("the node's request for the cache would be refused by the NodeCache schema: "+errs.ToAggregate().Error(), text.MaxMessage)}
	return true
}

// withinBytes keeps list within MaxRequestBytes: the entries this write changes (changed,
// indexes in list) are undone from the last, a new one left out and a changed one kept as it
// was, until it fits.
func (b *nodeChanges) withinBytes(was, list []prewarmv1alpha1.CacheRequest, changed []int, left map[string]refusal) []prewarmv1alpha1.CacheRequest {
	size := func(e prewarmv1alpha1.CacheRequest) int {
		j, _ := json.Marshal(e)
		return len(j) + 1
	}
	total := 0
	for _, e := range list {
		total += size(e)
	}
	drop := map[int]bool{}
	for k := len(changed) - 1; k >= 0 && total > MaxRequestBytes; k-- {
		i := changed[k]
		e := list[i]
		left[e.UID] = refusal{inferencev1.CacheFailed, prewarmv1alpha1.ReasonNodeCacheFull, fmt.Sprintf(
			"the node's cache requests would take %d KiB, more than the %d KiB a NodeCache holds; delete caches it need not hold, or narrow this cache's placement",
			total>>10, MaxRequestBytes>>10)}
		total -= size(e)
		if j := slices.IndexFunc(was, func(o prewarmv1alpha1.CacheRequest) bool { return o.UID == e.UID }); j >= 0 {
			list[i] = was[j]
			total += size(was[j])
		} else {
			drop[i] = true
		}
	}
	if len(drop) == 0 {
		return list
	}
	out := list[:0:0]
	for i, e := range list {
		if !drop[i] {
			out = append(out, e)
		}
	}
	return out
}

// asking lists, in order, the caches b asks for (not those it withdraws).
func (b *nodeChanges) asking() []string {
	var out []string
	for _, uid := range slices.Sorted(maps.Keys(b.caches)) {
		if b.caches[uid] != nil {
			out = append(out, uid)
		}
	}
	return out
}

// without is b without cache uid's change.
func (b *nodeChanges) without(uid string) *nodeChanges {
	out := &nodeChanges{nodeUID: b.nodeUID, caches: maps.Clone(b.caches)}
	delete(out.caches, uid)
	return out
}

// split splits b into the changes of the caches named and the others.
func (b *nodeChanges) split(uids []string) (named, others *nodeChanges) {
	named = &nodeChanges{nodeUID: b.nodeUID, caches: map[string]*prewarmv1alpha1.CacheRequest{}}
	others = &nodeChanges{nodeUID: b.nodeUID, caches: map[string]*prewarmv1alpha1.CacheRequest{}}
	for uid, e := range b.caches {
		if slices.Contains(uids, uid) {
			named.caches[uid] = e
		} else {
			others.caches[uid] = e
		}
	}
	return named, others
}
