package imagecache

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/text"
)

func intOrPercent(s string) intstr.IntOrString { return intstr.FromString(s) }

// Reasons of a node's entry in an image cache's status, besides the kubelet's own (the
// container's waiting reason: ErrImagePull, ImagePullBackOff, ...).
const (
	// ReasonNoPod: the DaemonSet has no pod on the node yet.
	ReasonNoPod = "NoPod"
	// ReasonPulled: the image is on the node, pinned by a running container.
	ReasonPulled = "Pulled"
	// ReasonNotInOperatorNamespace: an InferenceImageCache outside the operator namespace, where
	// prewarm makes none and keeps no DaemonSet.
	ReasonNotInOperatorNamespace = "NotInOperatorNamespace"
)

// notInOperatorNamespace is the status of an image cache written outside the operator
// namespace: failed, nothing pulled, and what to write instead.
func notInOperatorNamespace(c *inferencev1.InferenceImageCache, operatorNS string) inferencev1.InferenceImageCacheStatus {
	// The condition as it stands, so that its transition time holds from one reconcile to the next.
	st := inferencev1.InferenceImageCacheStatus{ObservedGeneration: c.Generation, Phase: inferencev1.ImageFailed, Conditions: slices.Clone(c.Status.Conditions)}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: inferencev1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: c.Generation,
		Reason: ReasonNotInOperatorNamespace,
		Message: fmt.Sprintf("prewarm keeps InferenceImageCaches in its operator namespace %s only, and pulls nothing for one in %s: "+
			"to pin an image for this namespace's pods, write a ModelImageCache here instead", operatorNS, c.Namespace),
	})
	return st
}

// pullFailures are the container waiting reasons that mean the image cannot be pulled.
var pullFailures = []string{"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable", "SignatureValidationFailed"}

// nodeImage says whether one node's pod has the image.
func nodeImage(node string, pod *corev1.Pod) (inferencev1.NodeImageStatus, string) {
	ns := inferencev1.NodeImageStatus{Name: node, Phase: inferencev1.ImagePending}
	if pod == nil {
		ns.Reason, ns.Message = ReasonNoPod, "the DaemonSet has not placed a pod on this node yet"
		return ns, ""
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != ImageContainerName {
			continue
		}
		switch {
		case cs.State.Running != nil || cs.ImageID != "":
			ns.Phase, ns.Reason, ns.Message = inferencev1.ImageComplete, ReasonPulled, "the image is on the node and pinned by a running container"
			return ns, digest(cs.ImageID)
		case cs.State.Waiting != nil && slices.Contains(pullFailures, cs.State.Waiting.Reason):
			ns.Phase, ns.Reason, ns.Message = inferencev1.ImageFailed, cs.State.Waiting.Reason, cs.State.Waiting.Message
			return ns, ""
		case cs.State.Waiting != nil:
			ns.Phase, ns.Reason, ns.Message = inferencev1.ImagePulling, cs.State.Waiting.Reason, cs.State.Waiting.Message
			return ns, ""
		}
	}
	ns.Phase, ns.Reason, ns.Message = inferencev1.ImagePulling, inferencev1.ReasonPulling, "the pod "+pod.Name+" is starting"
	return ns, ""
}

// bounded keeps a node entry within the API's limits.
func bounded(ns inferencev1.NodeImageStatus) inferencev1.NodeImageStatus {
	ns.Reason, ns.Message = text.Clip(ns.Reason, text.MaxReason), text.Clip(ns.Message, text.MaxMessage)
	return ns
}

// digest returns the sha256:... part of a container status imageID.
func digest(imageID string) string {
	if i := strings.LastIndex(imageID, "@"); i >= 0 {
		return imageID[i+1:]
	}
	if strings.HasPrefix(imageID, "sha256:") {
		return imageID
	}
	return ""
}

// gather builds the cache's status from its pods on the target nodes: counts over every node,
// and the bounded list of the nodes that need attention most. cached is every node that holds
// the image.
func (r *Reconciler) gather(c *inferencev1.InferenceImageCache, _ *appsv1.DaemonSet, targets []*corev1.Node, pods []corev1.Pod) (inferencev1.InferenceImageCacheStatus, map[string]bool) {
	// The digest is what the nodes' pods report now, not what was once reported: a cache whose
	// pull secrets changed shows no digest its nodes cannot pull any more.
	st := inferencev1.InferenceImageCacheStatus{
		ObservedGeneration: c.Generation, TargetNodes: int32(len(targets)),
		Conditions: slices.Clone(c.Status.Conditions),
	}
	byNode := map[string]*corev1.Pod{}
	for i := range pods {
		if pods[i].DeletionTimestamp.IsZero() && pods[i].Spec.NodeName != "" {
			byNode[pods[i].Spec.NodeName] = &pods[i]
		}
	}
	var failed, pulling []string // the first maxNamed of each, for the condition
	nPulling := 0
	cached := map[string]bool{}
	nodes := make([]inferencev1.NodeImageStatus, 0, len(targets))
	for _, n := range targets {
		ns, d := nodeImage(n.Name, byNode[n.Name])
		ns = bounded(ns)
		if d != "" {
			st.ImageDigest = d
		}
		switch ns.Phase {
		case inferencev1.ImageComplete:
			st.CachedNodes++
			cached[n.Name] = true
		case inferencev1.ImageFailed:
			st.FailedNodes++
			if len(failed) < maxNamed {
				failed = append(failed, fmt.Sprintf("%s: %s %s", n.Name, ns.Reason, ns.Message))
			}
		default:
			nPulling++
			if len(pulling) < maxNamed {
				pulling = append(pulling, n.Name)
			}
		}
		nodes = append(nodes, ns)
	}
	slices.SortFunc(nodes, inferencev1.CompareImageAttention)
	if len(nodes) > 0 {
		st.Nodes = nodes[:min(len(nodes), inferencev1.MaxStatusNodes)]
	}
	cond := metav1.Condition{Type: inferencev1.ConditionReady, ObservedGeneration: c.Generation, Status: metav1.ConditionFalse}
	switch {
	case len(targets) == 0:
		st.Phase = inferencev1.ImagePending
		cond.Reason, cond.Message = inferencev1.ReasonNoTargetNodes, "no node matches the placement"
	case st.FailedNodes > 0:
		st.Phase = inferencev1.ImageFailed
		cond.Reason = inferencev1.ReasonPullFailed
		cond.Message = fmt.Sprintf("%d of %d target nodes hold %s; %d cannot pull it: %s", st.CachedNodes, st.TargetNodes, c.Spec.Image, st.FailedNodes, controller.SummarizeOf(failed, int(st.FailedNodes), maxNamed, "; "))
	case st.CachedNodes == st.TargetNodes:
		st.Phase = inferencev1.ImageComplete
		cond.Status, cond.Reason = metav1.ConditionTrue, inferencev1.ReasonAllNodesReady
		cond.Message = fmt.Sprintf("all %d target nodes hold %s", st.TargetNodes, c.Spec.Image)
	case st.CachedNodes > 0 || len(byNode) > 0:
		st.Phase = inferencev1.ImagePulling
		cond.Reason = inferencev1.ReasonPulling
		cond.Message = fmt.Sprintf("%d of %d target nodes hold %s; pulling on %s", st.CachedNodes, st.TargetNodes, c.Spec.Image, controller.SummarizeOf(pulling, nPulling, maxNamed, ", "))
	default:
		st.Phase = inferencev1.ImagePending
		cond.Reason, cond.Message = inferencev1.ReasonPulling, "waiting for the DaemonSet's pods"
	}
	cond.Message = text.Clip(cond.Message, text.MaxConditionMessage)
	meta.SetStatusCondition(&st.Conditions, cond)
	return st, cached
}

// maxNamed is how many nodes a condition message names.
const maxNamed = 10
