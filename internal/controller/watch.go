package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/prewarm/prewarm/internal/text"
)

// EnqueueAll maps any event to every object of a kind (listed from the cache into a fresh list
// from newList): for changes, like a node's or the catalog's, that any of them may depend on.
// keep, when set, filters the events that count.
func EnqueueAll(c client.Client, newList func() client.ObjectList, keep func(client.Object) bool) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		if keep != nil && !keep(o) {
			return nil
		}
		list := newList()
		if err := c.List(ctx, list); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing objects to reconcile")
			return nil
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing objects to reconcile")
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(items))
		for _, item := range items {
			if obj, ok := item.(client.Object); ok {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)})
			}
		}
		return reqs
	})
}

// NodePlacementChanged lets through the node events that can change which caches target a node:
// creation, deletion, and updates of labels, taints or schedulability. The kubelet's status
// updates, every few seconds on every node, do not count, nor do prewarm's own cache-ready
// labels (written by the reconcilers this would wake).
var NodePlacementChanged = nodeUpdates(func(before, after *corev1.Node) bool {
	return !sameLabelsBesidesCaches(before.Labels, after.Labels) ||
		!slices.EqualFunc(before.Spec.Taints, after.Spec.Taints, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) ||
		before.Spec.Unschedulable != after.Spec.Unschedulable
})

// NodeAddressesChanged lets through the node updates that can change which peer addresses the
// node's agent may report (peerAddrsOf): its addresses and its pod CIDRs. They change when a
// node is first registered and seldom after.
var NodeAddressesChanged = nodeUpdates(func(before, after *corev1.Node) bool {
	return !slices.Equal(before.Status.Addresses, after.Status.Addresses) ||
		before.Spec.PodCIDR != after.Spec.PodCIDR || !slices.Equal(before.Spec.PodCIDRs, after.Spec.PodCIDRs)
})

// nodeUpdates is a predicate letting through node updates for which changed holds (and every
// creation, deletion and generic event).
func nodeUpdates(changed func(before, after *corev1.Node) bool) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		before, ok1 := e.ObjectOld.(*corev1.Node)
		after, ok2 := e.ObjectNew.(*corev1.Node)
		return !ok1 || !ok2 || changed(before, after)
	}}
}

// sameLabelsBesidesCaches compares two label sets but for prewarm's cache labels, without
// copying them: it runs on every update of every node.
func sameLabelsBesidesCaches(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; !IsCacheLabel(k) && (!ok || w != v) {
			return false
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok && !IsCacheLabel(k) {
			return false
		}
	}
	return true
}

// Reasons of the events the controller records besides its conditions' reasons (CamelCase,
// stable: scripts may match on them; docs/operations.md has a row for each).
const (
	EventUnsupportedFields = "UnsupportedFields"
	EventCacheCreated      = "CacheCreated"
	EventDeploymentCreated = "DeploymentCreated"
	EventRollStarted       = "RollStarted"
	EventOldCacheRemoved   = "OldCacheRemoved"
	EventCleanupDone       = "CleanupDone"
	EventDeletionTimeout   = "DeletionTimeout"
	EventNodeReady         = "NodeReady"
	EventNodeFailed        = "NodeFailed"
	EventNodeDownloading   = "NodeDownloading"
	// EventNodeEvicted: a node evicted the cache to make room for another (the message says
	// why and what it waits for).
	EventNodeEvicted = "NodeEvicted"
	// EventEvictionPolicyLimited: a cache's eviction annotations ask for more than its
	// namespace is granted (or do not parse); the message says what is used instead.
	EventEvictionPolicyLimited = "EvictionPolicyLimited"
	// EventPullSecretRefused: a pull secret the parent's namespace names is not copied for its
	// image cache (not a pull secret type, too large, past the count); the message names it and
	// the rule.
	EventPullSecretRefused = "PullSecretRefused"
	// EventScaledObjectCreated, EventScaledObjectDeleted: the parent's autoScalingSpec got its
	// KEDA ScaledObject, or lost it (no trigger left to scale on, or the block removed).
	EventScaledObjectCreated = "ScaledObjectCreated"
	EventScaledObjectDeleted = "ScaledObjectDeleted"
)

// Event records an Event about obj when rec is set (the reconcilers' tests run without one). The
// note is clipped to what an Event holds: it often quotes a user's values or an error.
func Event(rec events.EventRecorder, obj runtime.Object, eventType, reason, action, note string) {
	if rec != nil {
		rec.Eventf(obj, nil, eventType, reason, action, "%s", text.Clip(note, text.MaxEventNote))
	}
}

// Pending holds a reconcile's Events until it has written the status: an Event that tells of a
// transition (Tell) is dropped when the write fails, since the retry starts again from the
// stored status and tells of it again; one that tells of something done (Record) is recorded
// either way.
type Pending struct{ events []pendingEvent }

type pendingEvent struct {
	eventType, reason, action, note string
	transition                      bool
}

// Tell queues an Event that tells of a change of status.
func (p *Pending) Tell(eventType, reason, action, note string) {
	p.events = append(p.events, pendingEvent{eventType, reason, action, note, true})
}

// Record queues an Event that tells of something done.
func (p *Pending) Record(eventType, reason, action, note string) {
	p.events = append(p.events, pendingEvent{eventType, reason, action, note, false})
}

// Emit records the queued Events about obj; written says whether the status was written.
func (p *Pending) Emit(rec events.EventRecorder, obj runtime.Object, written bool) {
	for _, e := range p.events {
		if written || !e.transition {
			Event(rec, obj, e.eventType, e.reason, e.action, e.note)
		}
	}
	p.events = nil
}

// Summarize lists items for a message, the first n of them and how many more.
func Summarize(items []string, n int) string { return SummarizeOf(items, len(items), n, ", ") }

// SummarizeOf lists for a message the first n of items, which are some of total things (a
// bounded status names only some), joined by sep, and counts the rest.
func SummarizeOf(items []string, total, n int, sep string) string {
	if len(items) > n {
		items = items[:n]
	}
	s := strings.Join(items, sep)
	switch more := total - len(items); {
	case more <= 0:
		return s
	case s == "":
		return fmt.Sprintf("%d not named", more)
	default:
		return fmt.Sprintf("%s and %d more", s, more)
	}
}

// Coalesce delays the reconciles h asks for by d: the events of that time on one object's
// dependents (the pods of an image cache, the status writes of a cache) then cost one reconcile,
// however many there were. The work queue keeps one entry per object.
func Coalesce(h handler.EventHandler, d time.Duration) handler.EventHandler {
	return coalesced{h: h, d: d}
}

type coalesced struct {
	h handler.EventHandler
	d time.Duration
}

type delayedQueue struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	d time.Duration
}

func (q delayedQueue) Add(item reconcile.Request) { q.AddAfter(item, q.d) }

func (c coalesced) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.h.Create(ctx, e, delayedQueue{q, c.d})
}

func (c coalesced) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.h.Update(ctx, e, delayedQueue{q, c.d})
}

func (c coalesced) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.h.Delete(ctx, e, delayedQueue{q, c.d})
}

func (c coalesced) Generic(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.h.Generic(ctx, e, delayedQueue{q, c.d})
}
