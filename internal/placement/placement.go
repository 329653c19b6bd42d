// Package placement decides which nodes a model's caches are for: the nodes its inference pods
// may be scheduled on. Matching uses the scheduler's own helpers (k8s.io/component-helpers), so a
// node is a target exactly when the pods' required node affinity and tolerations admit it; the
// same Rules write that affinity and those tolerations into the pods prewarm creates.
package placement

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
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

// FromSelector builds the placement of a cache that selects its nodes itself (HyperPod's
// ModelWeightsCacheConfig and ModelImageCache): every nodeSelector pair must match, on top of
// the affinity's required terms. A node.kubernetes.io/instance-type pair is an instance type, so
// that the operator configuration's instance-type mapping applies to it as to a parent's.
func FromSelector(selector map[string]string, affinity *corev1.NodeAffinity, tolerations []corev1.Toleration) inferencev1.Placement {
	p := inferencev1.Placement{Tolerations: slices.Clone(tolerations)}
	var exprs []corev1.NodeSelectorRequirement
	for _, k := range slices.Sorted(maps.Keys(selector)) {
		if k == corev1.LabelInstanceTypeStable {
			p.InstanceTypes = []string{selector[k]}
			continue
		}
		exprs = append(exprs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{selector[k]}})
	}
	var terms []corev1.NodeSelectorTerm
	if affinity != nil && affinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms = slices.Clone(affinity.DeepCopy().RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
	}
	if len(terms) == 0 && len(exprs) > 0 {
		terms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, exprs...)
	}
	if len(terms) > 0 {
		p.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	return p
}

// Rules are how a placement finds this cluster's nodes: the operator configuration's mapping of
// instance types to nodes, and the tolerations prewarm's pods carry besides the parent's. The
// zero value holds the defaults: an instance type selects the nodes whose
// node.kubernetes.io/instance-type is that type, or that type less its "ml." prefix (HyperPod
// names ml.g5.24xlarge what EKS names g5.24xlarge), and the pods tolerate nothing more.
type Rules struct {
	mapped      map[string]config.InstanceTypeNodes
	tolerations []corev1.Toleration
	// extendedResources makes the pods tolerate the NoSchedule taint named after each extended
	// resource they request, as the ExtendedResourceToleration admission plugin does.
	extendedResources bool
}

// NewRules returns the rules of the operator configuration's placement. extendedResources says
// whether the pods tolerate the taints named after the extended resources they request (the
// configuration's extendedResourceTolerations, resolved against the API server for auto).
func NewRules(p config.Placement, extendedResources bool) Rules {
	r := Rules{tolerations: slices.Clone(p.Tolerations), extendedResources: extendedResources}
	if len(p.InstanceTypes) > 0 {
		r.mapped = map[string]config.InstanceTypeNodes{}
		for _, t := range p.InstanceTypes {
			r.mapped[t.InstanceType] = t
		}
	}
	return r
}

// LabelValues are the node.kubernetes.io/instance-type values an instance type that the
// configuration does not map selects: the type, and the type less "ml.".
func LabelValues(instanceType string) []string {
	if short, ok := strings.CutPrefix(instanceType, "ml."); ok && short != "" {
		return []string{instanceType, short}
	}
	return []string{instanceType}
}

// Candidates says which nodes a placement may select, for the index: those whose instance type
// label is one of values, or every node (all) when an instance type is mapped to other labels or
// the placement names none.
func (r Rules) Candidates(p inferencev1.Placement) (values []string, all bool) {
	if len(p.InstanceTypes) == 0 {
		return nil, true
	}
	for _, t := range p.InstanceTypes {
		if _, ok := r.mapped[t]; ok {
			return nil, true
		}
		values = append(values, LabelValues(t)...)
	}
	return values, false
}

// typeTerms are the node selector terms that select p's instance types on this cluster, one of
// which a node must match: one for the types the configuration does not map (by their label),
// one per mapped type. Nil when p names no instance type.
func (r Rules) typeTerms(p inferencev1.Placement) []corev1.NodeSelectorTerm {
	var values []string
	var terms []corev1.NodeSelectorTerm
	for _, t := range p.InstanceTypes {
		m, ok := r.mapped[t]
		if !ok {
			for _, v := range LabelValues(t) {
				if !slices.Contains(values, v) {
					values = append(values, v)
				}
			}
			continue
		}
		var reqs []corev1.NodeSelectorRequirement
		for _, k := range slices.Sorted(maps.Keys(m.NodeSelector)) {
			reqs = append(reqs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{m.NodeSelector[k]}})
		}
		for _, e := range m.MatchExpressions {
			reqs = append(reqs, *e.DeepCopy())
		}
		terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: reqs})
	}
	if len(values) > 0 {
		terms = append([]corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: inferencev1.InstanceTypeLabel, Operator: corev1.NodeSelectorOpIn, Values: values,
		}}}}, terms...)
	}
	return terms
}

// RequiredTerms returns the node selector terms a target node must match (any one of them):
// each of nodeAffinity's required terms ANDed with each of the instance types' terms. Nil means
// every node.
func (r Rules) RequiredTerms(p inferencev1.Placement) []corev1.NodeSelectorTerm {
	var affinity []corev1.NodeSelectorTerm
	if p.NodeAffinity != nil && p.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, t := range p.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			affinity = append(affinity, *t.DeepCopy())
		}
	}
	types := r.typeTerms(p)
	switch {
	case len(types) == 0:
		return affinity
	case len(affinity) == 0:
		return types
	}
	var out []corev1.NodeSelectorTerm
	for _, a := range affinity {
		for _, t := range types {
			term := *a.DeepCopy()
			term.MatchExpressions = append(term.MatchExpressions, t.MatchExpressions...)
			out = append(out, term)
		}
	}
	return out
}

// Match reports whether node is a target of p and, when it is not, says why: p selects it
// (Selects) and its scheduling state admits p's pods (Admits).
func (r Rules) Match(p inferencev1.Placement, node *corev1.Node) (bool, string) {
	if ok, why := r.Selects(p, node); !ok {
		return false, why
	}
	return Admits(p, node)
}

// Selects reports whether p's instance types and required node affinity select node: what the
// node is, as opposed to its passing state.
func (r Rules) Selects(p inferencev1.Placement, node *corev1.Node) (bool, string) {
	terms := r.RequiredTerms(p)
	if len(terms) == 0 {
		return true, ""
	}
	ok, err := nodeaffinity.NewLazyErrorNodeSelector(&corev1.NodeSelector{NodeSelectorTerms: terms}).Match(node)
	switch {
	case err != nil:
		return false, fmt.Sprintf("the node affinity is invalid: %v", err)
	case ok:
		return true, ""
	}
	if types := r.typeTerms(p); len(types) > 0 {
		if ok, _ := nodeaffinity.NewLazyErrorNodeSelector(&corev1.NodeSelector{NodeSelectorTerms: types}).Match(node); !ok {
			return false, r.notOfType(p, node)
		}
	}
	return false, "the node affinity does not select it"
}

// notOfType says why node is of none of p's instance types.
func (r Rules) notOfType(p inferencev1.Placement, node *corev1.Node) string {
	var by []string
	var values []string
	for _, t := range p.InstanceTypes {
		if m, ok := r.mapped[t]; ok {
			by = append(by, fmt.Sprintf("%s nodes are %s (placement.instanceTypes)", t, describe(m)))
			continue
		}
		values = append(values, LabelValues(t)...)
	}
	if len(values) > 0 {
		got := node.Labels[inferencev1.InstanceTypeLabel]
		if got == "" {
			got = "(no " + inferencev1.InstanceTypeLabel + " label)"
		}
		by = append([]string{fmt.Sprintf("instance type %s is not %s", got, strings.Join(values, " or "))}, by...)
	}
	return strings.Join(by, "; ")
}

// describe is what selects a mapped instance type's nodes, for people.
func describe(m config.InstanceTypeNodes) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m.NodeSelector)) {
		parts = append(parts, k+"="+m.NodeSelector[k])
	}
	for _, e := range m.MatchExpressions {
		parts = append(parts, fmt.Sprintf("%s %s %s", e.Key, e.Operator, strings.Join(e.Values, ",")))
	}
	return strings.Join(parts, ", ")
}

// Admits reports whether node's scheduling state lets p's pods on: it is not cordoned and has
// no NoSchedule or NoExecute taint they do not tolerate (the unreachable and not-ready taints
// of an outage among them). This state passes; a cache on a node that p selects but does not
// admit is kept, not removed. p's tolerations are the pods' own (Rules.Tolerations).
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

// Tolerations are the tolerations of the pods prewarm creates for a parent: the parent's own,
// the operator configuration's, and, when the rules say so, for every extended resource the
// containers request (nvidia.com/gpu), the NoSchedule taint of that name (what the
// ExtendedResourceToleration admission plugin adds).
func (r Rules) Tolerations(parent []corev1.Toleration, containers ...corev1.Container) []corev1.Toleration {
	out := slices.Clone(parent)
	add := func(t corev1.Toleration) {
		if !slices.ContainsFunc(out, func(o corev1.Toleration) bool { return o.MatchToleration(&t) }) {
			out = append(out, t)
		}
	}
	for _, t := range r.tolerations {
		add(t)
	}
	if r.extendedResources {
		for _, name := range ExtendedResources(containers...) {
			add(corev1.Toleration{Key: name, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
		}
	}
	return out
}

// ExtendedResources are the extended resources (a domain-qualified name outside kubernetes.io,
// such as nvidia.com/gpu) the containers request or limit, sorted.
func ExtendedResources(containers ...corev1.Container) []string {
	set := map[string]bool{}
	for _, c := range containers {
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range list {
				if IsExtendedResource(string(name)) {
					set[string(name)] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// IsExtendedResource reports whether name is an extended resource, as Kubernetes defines it: a
// qualified name with a domain, not in the kubernetes.io domain, not a quota's requests.<name>.
func IsExtendedResource(name string) bool {
	domain, _, ok := strings.Cut(name, "/")
	if !ok || domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName(name)) == 0
}
