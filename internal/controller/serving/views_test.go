package serving

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
)

func TestImageStateNamesThePhaseAsHyperPodDoes(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name           string
		phase          inferencev1.ImageCachePhase
		cached, failed int32
		deleting       bool
		want           inferencev1.ModelImageCacheState
	}{
		{"nothing yet", "", 0, 0, false, inferencev1.ModelImagePending},
		{"pending", inferencev1.ImagePending, 0, 0, false, inferencev1.ModelImagePending},
		{"pulling", inferencev1.ImagePulling, 1, 0, false, inferencev1.ModelImageDownloading},
		{"every node", inferencev1.ImageComplete, 3, 0, false, inferencev1.ModelImageReady},
		{"some cannot pull", inferencev1.ImageComplete, 2, 1, false, inferencev1.ModelImagePartiallyReady},
		{"failed where others hold it", inferencev1.ImageFailed, 2, 1, false, inferencev1.ModelImagePartiallyReady},
		{"none can pull", inferencev1.ImageFailed, 0, 3, false, inferencev1.ModelImageFailed},
		{"deleting", inferencev1.ImageComplete, 3, 0, true, inferencev1.ModelImageDeleting},
	} {
		c := &inferencev1.InferenceImageCache{Status: inferencev1.InferenceImageCacheStatus{Phase: tc.phase, CachedNodes: tc.cached, FailedNodes: tc.failed}}
		if tc.deleting {
			c.DeletionTimestamp = &now
		}
		if got := imageState(c); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A standalone cache's selection becomes a placement, and a view writes a placement back in
// HyperPod's fields: one instance type as a nodeSelector, a label pair as a requirement of every
// required term.
func TestSelectionRoundTrip(t *testing.T) {
	affinity := &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
	}}}
	p := placement.FromSelector(map[string]string{"node.kubernetes.io/instance-type": "ml.g5.24xlarge", "pool": "gpu"}, affinity, nil)
	if diff := cmp.Diff([]string{"ml.g5.24xlarge"}, p.InstanceTypes); diff != "" {
		t.Errorf("instance types (-want +got):\n%s", diff)
	}
	pool := corev1.NodeSelectorRequirement{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"gpu"}}
	for i, term := range p.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchExpressions) != 2 || !cmp.Equal(term.MatchExpressions[1], pool) {
			t.Errorf("term %d = %+v; want its zone and the pool pair", i, term.MatchExpressions)
		}
	}
	if len(affinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions) != 1 {
		t.Error("FromSelector changed the affinity it was given")
	}
	selector, back := viewSelection(p)
	if diff := cmp.Diff(map[string]string{"node.kubernetes.io/instance-type": "ml.g5.24xlarge"}, selector); diff != "" {
		t.Errorf("view's selector (-want +got):\n%s", diff)
	}
	if !cmp.Equal(back, p.NodeAffinity) {
		t.Errorf("view's affinity %+v, want %+v", back, p.NodeAffinity)
	}
	_, multi := viewSelection(inferencev1.Placement{InstanceTypes: []string{"a", "b"}})
	want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "node.kubernetes.io/instance-type", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}}}}
	if diff := cmp.Diff(want, multi.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms); diff != "" {
		t.Errorf("two instance types (-want +got):\n%s", diff)
	}
	if s, a := viewSelection(inferencev1.Placement{}); s != nil || a != nil {
		t.Errorf("no placement: %v %v, want neither", s, a)
	}
}
