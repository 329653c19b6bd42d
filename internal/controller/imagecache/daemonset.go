package imagecache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

const (
	// ImageContainerName is the container that runs the cached image.
	ImageContainerName = "image"
	sleeperDir         = "/prewarm-bin"
	sleeperPath        = sleeperDir + "/sleeper"
)

// daemonSet builds the DaemonSet that pulls and pins c's image on the target nodes: an init
// container (prewarm's agent image) installs a static sleeper into an emptyDir, and the main
// container runs the target image with the sleeper as its command, so images without a shell
// work, and the running container keeps kubelet's image GC from removing the image.
//
// The image is a tenant's, run in the operator namespace: nothing of it runs but its files (the
// sleeper is the command, the working directory is /, not the image's WORKDIR, which a crafted
// image can point at a runtime's leaked descriptors), and it is pulled Always: each pod asks the
// registry with the cache's own pull secrets, so a cache does not start on an image that another
// namespace's credentials left on the node, and a cache whose pull secrets changed pulls again
// with the new ones as its pods are replaced.
func (r *Reconciler) daemonSet(c *inferencev1.InferenceImageCache) *appsv1.DaemonSet {
	labels := map[string]string{controller.ImageCacheLabel: c.Name, controller.ManagedByLabel: controller.ManagedBy}
	restricted := &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](65534), RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	tiny := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("8Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
	}
	spec := corev1.PodSpec{
		PriorityClassName:             r.Config.Controller.ImageCachePriorityClass,
		Tolerations:                   c.Spec.Placement.Tolerations,
		ImagePullSecrets:              append(slices.Clone(c.Spec.ImagePullSecrets), r.Config.PullSecrets()...),
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		AutomountServiceAccountToken: ptr.To(false),
		EnableServiceLinks:           ptr.To(false),
		InitContainers: []corev1.Container{{
			Name: "install-sleeper", Image: r.Config.AgentImage(),
			Command:         []string{"/sleeper", "--install", sleeperPath},
			Resources:       tiny,
			SecurityContext: restricted,
			VolumeMounts:    []corev1.VolumeMount{{Name: "bin", MountPath: sleeperDir}},
		}},
		Containers: []corev1.Container{{
			Name: ImageContainerName, Image: c.Spec.Image,
			Command:         []string{sleeperPath},
			WorkingDir:      "/",
			ImagePullPolicy: corev1.PullAlways,
			Resources:       tiny,
			SecurityContext: restricted,
			VolumeMounts:    []corev1.VolumeMount{{Name: "bin", MountPath: sleeperDir, ReadOnly: true}},
		}},
		Volumes: []corev1.Volume{{Name: "bin", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("16Mi"))},
		}}},
	}
	if terms := r.Config.Rules().RequiredTerms(c.Spec.Placement); len(terms) > 0 {
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms},
		}}
	}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
	b, _ := json.Marshal(tmpl)
	sum := sha256.Sum256(b)
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: c.Name, Namespace: c.Namespace, Labels: labels,
			Annotations: map[string]string{controller.TemplateHashAnnotation: hex.EncodeToString(sum[:])[:16]},
		},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{controller.ImageCacheLabel: c.Name}},
			Template: tmpl,
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr.To(intOrPercent("25%"))}},
		},
	}
}
