package imagecache

import (
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

func TestNodeImage(t *testing.T) {
	pod := func(cs ...corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{ContainerStatuses: cs}}
	}
	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: ImageContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "m"}}}
	}
	tests := []struct {
		name   string
		pod    *corev1.Pod
		phase  inferencev1.ImageCachePhase
		reason string
		digest string
	}{
		{"no pod", nil, inferencev1.ImagePending, "NoPod", ""},
		{"no status yet", pod(), inferencev1.ImagePulling, "Pulling", ""},
		{"creating", pod(waiting("ContainerCreating")), inferencev1.ImagePulling, "ContainerCreating", ""},
		{"pull error", pod(waiting("ErrImagePull")), inferencev1.ImageFailed, "ErrImagePull", ""},
		{"back-off", pod(waiting("ImagePullBackOff")), inferencev1.ImageFailed, "ImagePullBackOff", ""},
		{"running", pod(corev1.ContainerStatus{Name: ImageContainerName, ImageID: "docker.io/x@sha256:ab",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}), inferencev1.ImageComplete, "Pulled", "sha256:ab"},
		{"another container's error does not count", pod(corev1.ContainerStatus{Name: "other",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}}), inferencev1.ImagePulling, "Pulling", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, d := nodeImage("n", tt.pod)
			if ns.Phase != tt.phase || ns.Reason != tt.reason || d != tt.digest {
				t.Errorf("nodeImage = %+v, %q; want %s %s %q", ns, d, tt.phase, tt.reason, tt.digest)
			}
		})
	}
}

// The digest is what the nodes report now: a cache whose nodes can no longer pull the image (its
// pull secrets changed, or it was adopted from one that pulled with another namespace's) does
// not keep showing the digest it once had.
func TestTheDigestIsTheNodesOfNow(t *testing.T) {
	c := &inferencev1.InferenceImageCache{ObjectMeta: metav1.ObjectMeta{Name: "iic"}, Spec: inferencev1.InferenceImageCacheSpec{Image: "registry.example/private:1"},
		Status: inferencev1.InferenceImageCacheStatus{ImageDigest: "sha256:once"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	failing := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{NodeName: "n"},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: ImageContainerName,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "401 Unauthorized"}}}}}}
	st, _ := (&Reconciler{}).gather(c, nil, []*corev1.Node{node}, []corev1.Pod{failing})
	if st.ImageDigest != "" || st.Phase != inferencev1.ImageFailed {
		t.Errorf("a cache none of whose nodes can pull the image: %s, digest %q; want Failed and no digest", st.Phase, st.ImageDigest)
	}
	running := failing
	running.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ImageContainerName, ImageID: "registry.example/private@sha256:now",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	if st, _ := (&Reconciler{}).gather(c, nil, []*corev1.Node{node}, []corev1.Pod{running}); st.ImageDigest != "sha256:now" {
		t.Errorf("digest %q, want the node's sha256:now", st.ImageDigest)
	}
}

// What the kubelet says of a pull (a registry's error can be long) is kept within a node entry's
// limits, on whole characters.
func TestNodeImageIsBounded(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
		Name: ImageContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason: strings.Repeat("R", 100), Message: strings.Repeat("€", 3000)}}}}}}
	ns, _ := nodeImage("n", pod)
	ns = bounded(ns)
	if len(ns.Reason) > 64 || len(ns.Message) > 1024 || !utf8.ValidString(ns.Message) {
		t.Errorf("reason of %d bytes, message of %d bytes (valid UTF-8: %v); want at most 64 and 1024, whole characters", len(ns.Reason), len(ns.Message), utf8.ValidString(ns.Message))
	}
}
