// Package placement decides which nodes a model's caches are for: the nodes its inference pods
// may be scheduled on. Matching uses the scheduler's own helpers (k8s.io/component-helpers), so a
// node is a target exactly when the pods' required node affinity and tolerations admit it.
package placement

import (
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// FromParent builds a cache placement from a parent's placement fields.
func FromParent(instanceType string, instanceTypes []string, affinity *corev1.NodeAffinity, tolerations []corev1.Toleration) inferencev1.Placement {
	p := inferencev1.Placement{Tolerations: tolerations}
	if instanceType != "" {
		p.InstanceTypes = []string{instanceType}
	} else if len(instanceTypes) > 0 {
		p.InstanceTypes = slices.Clone(instanceTypes)
	}
	if affinity != nil {
		p.NodeAffinity = affinity.DeepCopy()
	}
	return p
}

// RequiredTerms returns the node selector terms a target node must match (any one of them):
// the instance types ANDed into each of nodeAffinity's required terms. Nil means every node.
func RequiredTerms(p inferencev1.Placement) []corev1.NodeSelectorTerm {
	var terms []corev1.NodeSelectorTerm
	if p.NodeAffinity != nil && p.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, t := range p.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			terms = append(terms, *t.DeepCopy())
		}
	}
	if len(p.InstanceTypes) == 0 {
		return terms
	}
	req := corev1.NodeSelectorRequirement{
		Key: inferencev1.InstanceTypeLabel, Operator: corev1.NodeSelectorOpIn, Values: slices.Clone(p.InstanceTypes),
	}
	if len(terms) == 0 {
		return []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req}}}
	}
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, req)
	}
	return terms
}

// Match reports whether node is a target of p and, when it is not, says why: p selects it
// (Selects) and its scheduling state admits p's pods (Admits).
func Match(p inferencev1.Placement, node *corev1.Node) (bool, string) {
	if ok, why := Selects(p, node); !ok {
		return false, why
	}
	return Admits(p, node)
}

// Selects reports whether p's instance types and required node affinity select node: what the
// node is, as opposed to its passing state.
func Selects(p inferencev1.Placement, node *corev1.Node) (bool, string) {
	if terms := RequiredTerms(p); len(terms) > 0 {
		sel := nodeaffinity.NewLazyErrorNodeSelector(&corev1.NodeSelector{NodeSelectorTerms: terms})
		ok, err := sel.Match(node)
		if err != nil {
			return false, fmt.Sprintf("the node affinity is invalid: %v", err)
		}
		if !ok {
			if len(p.InstanceTypes) > 0 && !slices.Contains(p.InstanceTypes, node.Labels[inferencev1.InstanceTypeLabel]) {
				got := node.Labels[inferencev1.InstanceTypeLabel]
				if got == "" {
					got = "(no " + inferencev1.InstanceTypeLabel + " label)"
				}
				return false, fmt.Sprintf("instance type %s is not %s", got, strings.Join(p.InstanceTypes, " or "))
			}
			return false, "the node affinity does not select it"
		}
	}
	return true, ""
}

// Admits reports whether node's scheduling state lets p's pods on: it is not cordoned and has
// no NoSchedule or NoExecute taint they do not tolerate (the unreachable and not-ready taints
// of an outage among them). This state passes; a cache on a node that p selects but does not
// admit is kept, not removed.
func Admits(p inferencev1.Placement, node *corev1.Node) (bool, string) {
	taints := node.Spec.Taints
	if node.Spec.Unschedulable {
		// A cordon is the unschedulable taint, which the node lifecycle controller adds a moment
		// later: judge it as that taint from the start.
		taints = append(slices.Clone(taints), corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule})
	}
	taint, untolerated := schedcorev1.FindMatchingUntoleratedTaint(logr.Discard(), taints, p.Tolerations,
		func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false)
	switch {
	case !untolerated:
		return true, ""
	case taint.Key == corev1.TaintNodeUnschedulable:
		return false, "the node is cordoned"
	}
	return false, fmt.Sprintf("taint %s is not tolerated", taint.ToString())
}
