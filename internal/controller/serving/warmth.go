package serving

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// warmth counts a parent's pods by where they run: on warm nodes (that hold the weights the
// pods read, verified, and the image when there is an image cache), on cold nodes, or on no
// node yet. It tells whether the caches cover where the Deployment, and its autoscaler, put
// the pods.
type warmth struct {
	warm, cold, unscheduled int32
	// coldNodes are the cold nodes with pods, sorted, at most maxColdNodesNamed of them.
	coldNodes []string
}

// maxColdNodesNamed is how many cold nodes a condition message names.
const maxColdNodesNamed = 5

// warmNodes are the nodes that hold what the pods read: the weights cache's nodes that hold it,
// verified, that also hold the image when there is an image cache (or the image cache's, with
// no weights cache); nil when the pods read no cache (no node is warmer than another).
func warmNodes(use *inferencev1.ModelDataCacheConfig, image *inferencev1.InferenceImageCache) sets.Set[string] {
	if use == nil && image == nil {
		return nil
	}
	imaged := sets.New[string]()
	if image != nil {
		for _, n := range image.Status.Nodes {
			if n.Phase == inferencev1.ImageComplete {
				imaged.Insert(n.Name)
			}
		}
	}
	if use == nil {
		return imaged
	}
	warm := sets.New[string]()
	for _, n := range use.Status.Nodes {
		if n.State == inferencev1.CacheReady && (image == nil || imaged.Has(n.Name)) {
			warm.Insert(n.Name)
		}
	}
	return warm
}

// countWarmth counts pods against the nodes that hold their copies; nil when the pods read no
// cache.
func countWarmth(pods []corev1.Pod, use *inferencev1.ModelDataCacheConfig, image *inferencev1.InferenceImageCache) *warmth {
	warmSet := warmNodes(use, image)
	if warmSet == nil {
		return nil
	}
	w := &warmth{}
	cold := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if !p.DeletionTimestamp.IsZero() || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		switch node := p.Spec.NodeName; {
		case node == "":
			w.unscheduled++
		case warmSet.Has(node):
			w.warm++
		default:
			w.cold++
			cold[node] = true
		}
	}
	for n := range cold {
		w.coldNodes = append(w.coldNodes, n)
	}
	slices.Sort(w.coldNodes)
	if len(w.coldNodes) > maxColdNodesNamed {
		w.coldNodes = append(w.coldNodes[:maxColdNodesNamed:maxColdNodesNamed], "…")
	}
	return w
}

// String says where the pods run, for the Ready condition's message.
func (w *warmth) String() string {
	s := fmt.Sprintf("pods on warm nodes %d, on cold nodes %d", w.warm, w.cold)
	if len(w.coldNodes) > 0 {
		s += " (" + strings.Join(w.coldNodes, ", ") + ")"
	}
	if w.unscheduled > 0 {
		s += fmt.Sprintf(", waiting for a node %d", w.unscheduled)
	}
	return s
}

// podWarmth lists the parent's pods (from the API server's watch cache: the controller does not
// watch users' pods) and counts them; nil when no cache makes one node warmer than another.
func (r *Reconciler) podWarmth(ctx context.Context, s *state) (*warmth, error) {
	if s.use == nil && s.image == nil {
		return nil, nil
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(s.m.owner.GetNamespace()), client.MatchingLabels(selector(s.m)),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}}); err != nil {
		return nil, err
	}
	return countWarmth(pods.Items, s.use, s.image), nil
}

// recordWarmth sets the parent's pods-by-warmth series (none when w is nil).
func (r *Reconciler) recordWarmth(m *model, w *warmth) {
	if w == nil {
		r.Metrics.ParentPods(m.kind, m.owner.GetNamespace(), m.owner.GetName(), nil)
		return
	}
	r.Metrics.ParentPods(m.kind, m.owner.GetNamespace(), m.owner.GetName(), map[string]int32{
		controller.PodsWarm: w.warm, controller.PodsCold: w.cold, controller.PodsUnscheduled: w.unscheduled,
	})
}
