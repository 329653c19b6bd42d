package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// The reconcilers' work grows with what a cache touches, not with the fleet: they find nodes
// through these indexes of the informer cache, and read cached objects without copying them
// (client.UnsafeDisableDeepCopy: read-only; every write goes through a fresh object).
const (
	// NodeInstanceTypeIndex indexes Nodes by their instance type label.
	NodeInstanceTypeIndex = "prewarm.io/instance-type"
	// NodeCacheLabelIndex indexes Nodes by the cache-ready label keys they carry.
	NodeCacheLabelIndex = "prewarm.io/cache-labels"
)

// Index is one informer index the reconcilers read through.
type Index struct {
	// Object is the kind indexed.
	Object client.Object
	Field  string
	Func   client.IndexerFunc
}

// NodeIndexes are the Node indexes.
var NodeIndexes = []Index{
	{&corev1.Node{}, NodeInstanceTypeIndex, func(o client.Object) []string {
		if t := o.GetLabels()[inferencev1.InstanceTypeLabel]; t != "" {
			return []string{t}
		}
		return nil
	}},
	{&corev1.Node{}, NodeCacheLabelIndex, func(o client.Object) []string {
		var keys []string
		for k := range o.GetLabels() {
			if IsCacheLabel(k) {
				keys = append(keys, k)
			}
		}
		return keys
	}},
}

// RegisterIndexes registers indexes with mgr's informer cache: once per manager, before the
// reconcilers that read through them start (cmd/controller does it for all of them).
func RegisterIndexes(ctx context.Context, mgr ctrl.Manager, indexes ...Index) error {
	for _, ix := range indexes {
		if err := mgr.GetFieldIndexer().IndexField(ctx, ix.Object, ix.Field, ix.Func); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", ix.Object, ix.Field, err)
		}
	}
	return nil
}

// IsCacheLabel reports whether a node label key is one of prewarm's cache-ready labels.
func IsCacheLabel(key string) bool {
	return strings.HasPrefix(key, inferencev1.WeightsCacheReadyLabelPrefix) || strings.HasPrefix(key, inferencev1.ImageCacheReadyLabelPrefix)
}

// CandidateNodes lists, read-only, the nodes a placement may select: those whose instance type
// label is one of values (through the index), or every node when all is set
// (placement.Rules.Candidates).
func CandidateNodes(ctx context.Context, c client.Reader, values []string, all bool) ([]*corev1.Node, error) {
	if all {
		return listNodes(ctx, c)
	}
	var out []*corev1.Node
	seen := map[string]bool{}
	for _, t := range values {
		nodes, err := listNodes(ctx, c, client.MatchingFields{NodeInstanceTypeIndex: t})
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			if !seen[n.Name] {
				seen[n.Name] = true
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// LabelledNodes lists, read-only, the nodes that carry label key.
func LabelledNodes(ctx context.Context, c client.Reader, key string) ([]*corev1.Node, error) {
	return listNodes(ctx, c, client.MatchingFields{NodeCacheLabelIndex: key})
}

func listNodes(ctx context.Context, c client.Reader, opts ...client.ListOption) ([]*corev1.Node, error) {
	list := &corev1.NodeList{}
	if err := c.List(ctx, list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		return nil, err
	}
	out := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// WriteParallelism is how many writes one reconcile has in flight at once when it writes them
// itself (the client's QPS and burst pace them all).
const WriteParallelism = 16

// SharedWrites is how many writes a writer shared by every cache's reconciles (the node
// labeller, the NodeCache request writer) has in flight at once.
const SharedWrites = 2 * WriteParallelism

// ForEach runs fn for every item, WriteParallelism at a time, and returns the first error.
func ForEach[T any](ctx context.Context, items []T, fn func(context.Context, T) error) error {
	if len(items) == 1 {
		return fn(ctx, items[0])
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(WriteParallelism)
	for _, it := range items {
		g.Go(func() error { return fn(ctx, it) })
	}
	return g.Wait()
}

// LabelChange is one node whose cache-ready label must be put or removed.
type LabelChange struct {
	Node string
	Want bool
}

// LabelChanges compares the nodes that should carry key (want) with the nodes given (which
// include every node that carries it) and returns the writes to make.
func LabelChanges(nodes []*corev1.Node, key string, want map[string]bool) []LabelChange {
	var out []LabelChange
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name] {
			continue
		}
		seen[n.Name] = true
		if _, has := n.Labels[key]; has != want[n.Name] {
			out = append(out, LabelChange{Node: n.Name, Want: want[n.Name]})
		}
	}
	return out
}

// ApplyLabels makes the label changes, in parallel.
func ApplyLabels(ctx context.Context, c client.Client, key string, changes []LabelChange) error {
	return ForEach(ctx, changes, func(ctx context.Context, ch LabelChange) error {
		if err := SetNodeLabel(ctx, c, ch.Node, key, ch.Want); err != nil {
			return fmt.Errorf("labelling node %s: %w", ch.Node, err)
		}
		return nil
	})
}

// SetNodeLabel puts (value "true") or removes a cache-ready label on a node. It patches a fresh
// object, never one read from the informer cache.
func SetNodeLabel(ctx context.Context, c client.Client, node, key string, want bool) error {
	var value *string
	if want {
		value = ptr.To(inferencev1.LabelTrue)
	}
	return patchNodeLabels(ctx, c, node, map[string]*string{key: value})
}

// patchNodeLabels puts (a value) or removes (nil) labels on a node in one merge patch of a fresh
// object; a node that is gone is no error.
func patchNodeLabels(ctx context.Context, c client.Client, node string, labels map[string]*string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	n := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: node}}
	return client.IgnoreNotFound(c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)))
}
