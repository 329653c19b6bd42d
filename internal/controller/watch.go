package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
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

// NodePlacementChanged lets through the node events that can change which caches target a node
// or what it is labelled with: creation, deletion, and updates of labels, taints or
// schedulability. The kubelet's status updates, every few seconds on every node, do not count.
var NodePlacementChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		before, ok1 := e.ObjectOld.(*corev1.Node)
		after, ok2 := e.ObjectNew.(*corev1.Node)
		if !ok1 || !ok2 {
			return true
		}
		return !equality.Semantic.DeepEqual(before.Labels, after.Labels) ||
			!slices.EqualFunc(before.Spec.Taints, after.Spec.Taints, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) ||
			before.Spec.Unschedulable != after.Spec.Unschedulable
	},
}

// Event records an Event about obj when rec is set (the reconcilers' tests run without one).
func Event(rec events.EventRecorder, obj runtime.Object, eventType, reason, action, note string) {
	if rec != nil {
		rec.Eventf(obj, nil, eventType, reason, action, "%s", note)
	}
}

// Summarize lists items for a message, the first n of them and how many more.
func Summarize(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}
