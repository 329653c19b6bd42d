package preflight

import (
	"context"
	"fmt"
	"slices"

	"github.com/prewarm/prewarm/internal/controller"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/config"
)

// probeResource is the extended resource the probe pod requests: no node has it, and the pod is
// never created (a dry run).
const probeResource = "prewarm.io/admission-probe"

// The controller asks the API server, once at start, how it admits pods.
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=pods,verbs=create

// ResolveExtendedResourceTolerations resolves placement.extendedResourceTolerations into
// cfg.ExtendedResourceTolerations. For auto it asks the API server whether it runs the
// ExtendedResourceToleration admission plugin (EKS and GKE do): a dry run of a pod that requests
// an extended resource, in the operator namespace, comes back with the toleration the plugin
// adds, or without it. It returns what it decided, for the log; when the dry run fails, the
// pods carry the tolerations (as on), and the error says why it could not tell.
func ResolveExtendedResourceTolerations(ctx context.Context, c client.Client, cfg *controller.Config) (string, error) {
	switch cfg.Placement.ExtendedResourceTolerations {
	case config.ExtendedResourceTolerationsOn:
		cfg.ExtendedResourceTolerations = true
		return "on: the pods prewarm creates tolerate the taints named after the extended resources they request", nil
	case config.ExtendedResourceTolerationsOff:
		cfg.ExtendedResourceTolerations = false
		return "off", nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "prewarm-admission-probe-", Namespace: cfg.OperatorNamespace},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "probe", Image: cfg.AgentImage(),
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{probeResource: resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("1Mi")},
					Limits:   corev1.ResourceList{probeResource: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Mi")},
				},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
		// The pods then carry the tolerations themselves: what EKS and GKE give them anyway.
		cfg.ExtendedResourceTolerations = true
		return "auto, undecided: taken as on", fmt.Errorf("placement.extendedResourceTolerations auto: a dry run of a pod in %s, to learn whether the API server adds tolerations for extended resources, failed (set placement.extendedResourceTolerations to on or off to skip it): %w",
			cfg.OperatorNamespace, err)
	}
	cfg.ExtendedResourceTolerations = slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == probeResource && t.Effect == corev1.TaintEffectNoSchedule
	})
	if cfg.ExtendedResourceTolerations {
		return "auto: the API server adds tolerations for the extended resources pods request (ExtendedResourceToleration); the pods prewarm creates carry them, and nodes are judged with them", nil
	}
	return "auto: the API server adds no tolerations for extended resources; a node tainted with the name of one (nvidia.com/gpu) is a target only of parents that tolerate it", nil
}
