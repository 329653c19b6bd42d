package serving

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// A pod is warm on a node that holds the weights, verified, and the image when there is an
// image cache; cold elsewhere; pods on no node, finished or terminating are counted apart or
// not at all; no cache, no count.
func TestPodsAreCountedWarmOrCold(t *testing.T) {
	pod := func(node string, mod ...func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		for _, f := range mod {
			f(&p)
		}
		return p
	}
	use := &inferencev1.ModelDataCacheConfig{Status: inferencev1.ModelDataCacheConfigStatus{Nodes: []inferencev1.NodeCacheStatus{
		{Name: "a", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}}, {Name: "b", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}}, {Name: "c", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading}},
	}}}
	image := &inferencev1.InferenceImageCache{Status: inferencev1.InferenceImageCacheStatus{Nodes: []inferencev1.NodeImageStatus{
		{Name: "a", Phase: inferencev1.ImageComplete}, {Name: "b", Phase: inferencev1.ImagePulling}, {Name: "c", Phase: inferencev1.ImageComplete},
	}}}
	pods := []corev1.Pod{
		pod("a"), pod("a"), pod("b"), pod("c"), pod("d"), pod(""),
		pod("a", func(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.Now()) }),
		pod("d", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
	}
	for _, tc := range []struct {
		name  string
		use   *inferencev1.ModelDataCacheConfig
		image *inferencev1.InferenceImageCache
		want  string
	}{
		{"weights", use, nil, "pods on warm nodes 3, on cold nodes 2 (c, d), waiting for a node 1"},
		{"weights and image", use, image, "pods on warm nodes 2, on cold nodes 3 (b, c, d), waiting for a node 1"},
		{"image", nil, image, "pods on warm nodes 3, on cold nodes 2 (b, d), waiting for a node 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := countWarmth(pods, tc.use, tc.image).String(); got != tc.want {
				t.Errorf("%q; want %q", got, tc.want)
			}
		})
	}
	if w := countWarmth(pods, nil, nil); w != nil {
		t.Errorf("no cache: %v; want no count", w)
	}
	var many []corev1.Pod
	for i := range 8 {
		many = append(many, pod(fmt.Sprintf("n%d", i)))
	}
	if got, want := countWarmth(many, use, nil).String(), "pods on warm nodes 0, on cold nodes 8 (n0, n1, n2, n3, n4, …)"; got != want {
		t.Errorf("%q; want %q", got, want)
	}
}
