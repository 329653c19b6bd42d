package serving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// checkDerived refuses, before anything is created, a parent whose Deployment or Service the API
// server would refuse: the objects take the parent's name, and the pods carry volumes prewarm
// adds.
func (r *Reconciler) checkDerived(m *model) *problem {
	name := m.owner.GetName()
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(
			"prewarm serves this %s through a Service of the same name, and %q is not a valid Service name (%s): rename the %s",
			m.kind, name, strings.Join(errs, "; "), m.kind)}
	}
	if p := checkSpec(m); p != nil {
		return p
	}
	if spec := (*controller.SpecError)(nil); m.source.ModelSourceType != inferencev1.ModelSourceKubernetesVolume {
		if _, err := r.Config.CacheSource(m.source); errors.As(err, &spec) {
			return &problem{inferencev1.ReasonInvalidSpec, spec.Message}
		}
	}
	ours := []string{cacheVolumeName, fsxVolumeName}
	if m.prefetch {
		ours = append(ours, PrefetchVolumeName)
	}
	if v := m.worker.ModelVolumeMount.Name; slices.Contains(ours, v) {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(
			"worker.modelVolumeMount.name %q is the name of a volume prewarm adds to the pods (%s): choose another name", v, joinNames(ours))}
	}
	for i, v := range m.kubernetes.Volumes {
		if slices.Contains(ours, v.Name) {
			return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(
				"spec.kubernetes.volumes[%d] is named %q, the name of a volume prewarm adds to the pods (%s): choose another name", i, v.Name, joinNames(ours))}
		}
	}
	if m.source.ModelSourceType == inferencev1.ModelSourceKubernetesVolume &&
		!slices.ContainsFunc(m.kubernetes.Volumes, func(v corev1.Volume) bool { return v.Name == m.worker.ModelVolumeMount.Name }) {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(
			"modelSourceType kubernetesVolume mounts the volume named like worker.modelVolumeMount.name (%q) from spec.kubernetes.volumes, and there is none: add it",
			m.worker.ModelVolumeMount.Name)}
	}
	for _, k := range m.kubernetes.InitContainers {
		if ours := []string{PrepareContainerName, PrefetchContainerName, WorkerContainerName}; slices.Contains(ours, k.Name) {
			return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(
				"spec.kubernetes.initContainers has a container named %q, the name of a container prewarm adds to the pods (%s): choose another name", k.Name, joinNames(ours))}
		}
		// prewarm's volumes carry prewarm's access (a directory of an FSx file system): only its
		// own container mounts them.
		for _, vm := range k.VolumeMounts {
			if vm.Name == cacheVolumeName || vm.Name == fsxVolumeName {
				return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(
					"spec.kubernetes.initContainers %q mounts %q, a volume prewarm adds to the pods for its own container: mount only volumes of spec.kubernetes.volumes", k.Name, vm.Name)}
			}
		}
	}
	terms := r.Config.Rules().RequiredTerms(m.placement)
	for _, p := range m.preferred {
		terms = append(terms, p.Preference)
	}
	if _, err := nodeaffinity.NewNodeSelector(&corev1.NodeSelector{NodeSelectorTerms: terms}); len(terms) > 0 && err != nil {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf("the node affinity is invalid: %v", err)}
	}
	for i, t := range m.placement.Tolerations {
		switch {
		case t.Operator != "" && t.Operator != corev1.TolerationOpExists && t.Operator != corev1.TolerationOpEqual:
			return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf("tolerations[%d].operator %q: want Exists or Equal", i, t.Operator)}
		case t.Operator == corev1.TolerationOpExists && t.Value != "":
			return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf("tolerations[%d]: operator Exists takes no value (got %q)", i, t.Value)}
		case t.Key == "" && t.Operator != corev1.TolerationOpExists:
			return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf("tolerations[%d]: an empty key needs operator Exists", i)}
		}
	}
	return nil
}

// deployable says, before a new weights cache is made, whether the parent's Deployment can be:
// not when a Deployment of its name is someone else's, nor when the API server refuses it (a
// server-side dry run of the Deployment the template phase would build, reading the cache to
// be made). Only the server's verdict on the object counts: a webhook that cannot dry-run, a
// quota or an unreachable server leave it to the Deployment's own create.
func (r *Reconciler) deployable(ctx context.Context, s *state) error {
	m := s.m
	if s.dep != nil && !metav1.IsControlledBy(s.dep, m.owner) {
		return conflict("Deployment", s.dep, m)
	}
	planned := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Name: m.owner.GetName() + "-cache", UID: "planned"}}
	tmpl, err := r.podTemplate(m, planned, s.image)
	if err != nil {
		return nil // the template phase reports it
	}
	dep := r.deployment(m, tmpl)
	switch err := r.Client.Create(ctx, dep, client.DryRunAll); {
	case apierrors.IsInvalid(err):
		return refused("Deployment", dep.Name, err)
	case err != nil && !apierrors.IsAlreadyExists(err):
		ctrl.LoggerFrom(ctx).V(1).Info("the dry run of the Deployment did not answer; its create will", "error", err.Error())
	}
	return nil
}

// hasCache reports whether owned holds a live cache of content key.
func hasCache(owned []inferencev1.ModelDataCacheConfig, key string) bool {
	return slices.ContainsFunc(owned, func(c inferencev1.ModelDataCacheConfig) bool {
		return c.Labels[controller.CacheKeyLabel] == key && c.DeletionTimestamp.IsZero()
	})
}

// refused turns the API server's refusal of an object prewarm derives from the spec (422 Invalid,
// 400) into a problem that names the object and quotes the server.
func refused(kind, name string, err error) error {
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf("the API server refuses the %s %s that prewarm derives from this spec: %v", kind, name, err)}
	}
	return err
}

// conflict reports an object of the name prewarm would use that belongs to someone else.
func conflict(kind string, obj client.Object, m *model) *problem {
	owner := "no owner"
	if ref := metav1.GetControllerOf(obj); ref != nil {
		owner = fmt.Sprintf("it belongs to %s %s", ref.Kind, ref.Name)
	}
	return &problem{inferencev1.ReasonNameConflict, fmt.Sprintf(
		"%s %s/%s exists and is not this %s's (%s); prewarm does not overwrite it: delete or rename it, or rename this %s",
		kind, obj.GetNamespace(), obj.GetName(), m.kind, owner, m.kind)}
}

// podSecurityLevelLabel is the namespace label that sets the Pod Security level enforced there.
const podSecurityLevelLabel = "pod-security.kubernetes.io/enforce"

// rolloutProblem says why the Deployment's pods cannot be created, when that is known: the
// Deployment's own ReplicaFailure condition, or a namespace that enforces a Pod Security level
// refusing the pods' hostPath volumes.
func (r *Reconciler) rolloutProblem(ctx context.Context, dep *appsv1.Deployment, tmpl *corev1.PodTemplateSpec) (*problem, error) {
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
			return &problem{inferencev1.ReasonReplicaFailure, fmt.Sprintf("Deployment %s cannot create pods: %s", dep.Name, c.Message)}, nil
		}
	}
	var hostPaths []string
	for _, v := range tmpl.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	if len(hostPaths) == 0 {
		return nil, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: dep.Namespace}, ns); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if level := ns.Labels[podSecurityLevelLabel]; level == "baseline" || level == "restricted" {
		return &problem{inferencev1.ReasonPodSecurity, fmt.Sprintf(
			"namespace %s enforces the %s Pod Security level, which refuses the pods' hostPath volumes (%s): no pod can start. Label the namespace %s=privileged, or serve it from a namespace that allows hostPath",
			dep.Namespace, level, strings.Join(hostPaths, ", "), podSecurityLevelLabel)}, nil
	}
	return nil, nil
}

// problem is a reason and message that stop a parent from being cached or deployed.
type problem struct{ reason, message string }

// Error lets a phase return a problem: the phases' runner reports it on the parent.
func (p *problem) Error() string { return p.reason + ": " + p.message }
