package imagecache

import (
	"testing"

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
